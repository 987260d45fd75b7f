"""queueserver: one job store behind five queue-server wire protocols."""
__version__ = "0.1.0"
