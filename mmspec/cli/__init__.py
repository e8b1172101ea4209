"""Command-line entry points (`python -m mmspec ...`): glue over the library, never imported by it."""
