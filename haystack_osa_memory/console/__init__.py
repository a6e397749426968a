"""The review console: a web page for the people who govern memory (`osa-memory console`)."""

from haystack_osa_memory.console.app import ConsoleSettings, create_console_app

__all__ = ["ConsoleSettings", "create_console_app"]
