"""The twin's figures and report pages (docs/twin-figures.md)."""
