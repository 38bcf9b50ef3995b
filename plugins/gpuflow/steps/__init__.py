"""One module per workflow step, in workflow order, each written once for both profiles.

Every step takes the validated config, the run's resource names and the platform.
"""
