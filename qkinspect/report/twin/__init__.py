"""The twin's figures and report pages (docs/twin.md)."""
