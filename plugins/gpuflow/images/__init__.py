"""The worker and export images: the recipes rendered and checked, and their locks."""
