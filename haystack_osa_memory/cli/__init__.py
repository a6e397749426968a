"""`osa-memory`, the command line (`haystack_osa_memory.cli.main`)."""

from haystack_osa_memory.cli.main import app, main

__all__ = ["app", "main"]
