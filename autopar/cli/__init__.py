"""Command-line entry points; see ``autopar.cli.main``."""
