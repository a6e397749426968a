"""Typed errors of haystack-osa-memory. Every message says what was wrong and what is allowed."""

from __future__ import annotations


class OsaMemoryError(Exception):
    """Base class of every error raised by haystack-osa-memory."""


class InvalidInputError(OsaMemoryError, ValueError):
    """A tool or API argument is outside what is allowed; nothing was written."""


class SupersessionError(InvalidInputError):
    """A fact named in ``supersedes`` cannot be superseded (unknown in this scope, already superseded, not live,
    the fact itself, or valid from later than its successor); nothing was written."""


class ConfigurationError(OsaMemoryError, ValueError):
    """A setting or environment variable has a value that is not allowed."""


class DatabaseError(OsaMemoryError):
    """The database could not be reached or answered with an error; the operation did not happen."""


class SchemaError(DatabaseError):
    """The knowledge-base tables are missing or do not have the expected shape."""


class AclLookupError(DatabaseError):
    """Governing rows could not be read, so no document is admitted (fail closed)."""


class AuthenticationError(OsaMemoryError):
    """A bearer token is missing, malformed, unknown, expired or revoked."""


class ScopeError(OsaMemoryError):
    """An operation ran without a trusted caller scope (org and assignment)."""


class NotFoundError(OsaMemoryError):
    """No such fact in the caller's scope (facts of other scopes are reported the same way)."""


class EmbeddingTimeoutError(OsaMemoryError, TimeoutError):
    """An embedding's forward pass ran past its time budget and was stopped (`MiniLMTextEmbedder.run_bounded`)."""


class MemoryOffError(OsaMemoryError):
    """A kill switch (server, org or assignment) turned memory off; nothing was read or written."""

    MESSAGE = "Memory is off for this assignment"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE)
