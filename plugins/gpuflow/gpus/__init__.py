"""GPU facts read from Google and the guides: regional quota, what an error means (troubleshooting), the debug VM."""
