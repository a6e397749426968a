"""Validation of text that arrives from callers (tools, CLI, Python API)."""

from __future__ import annotations

from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.markers import MARKER_LOOKALIKE

FACT_MAX = 2000
TOPIC_MAX = 120
QUERY_MAX = 1000
LIMIT_MIN, LIMIT_MAX = 1, 20


def check_text(value: object, what: str, *, min_len: int, max_len: int) -> str:
    """Return ``value`` if it is a clean string of an allowed length, else raise :class:`InvalidInputError`.

    Refused: non-strings, lengths outside ``min_len..max_len`` characters, text with no visible
    character, NUL bytes (PostgreSQL text cannot hold them) and lone UTF-16 surrogates (not UTF-8).
    """
    if not isinstance(value, str):
        msg = f"{what} must be a string of {min_len} to {max_len} characters, got {type(value).__name__}"
        raise InvalidInputError(msg)
    if not min_len <= len(value) <= max_len:
        msg = f"{what} must be {min_len} to {max_len} characters long, got {len(value)}"
        raise InvalidInputError(msg)
    if min_len > 0 and not value.strip():
        msg = f"{what} must contain at least one visible character"
        raise InvalidInputError(msg)
    if "\x00" in value:
        msg = f"{what} must not contain NUL characters (\\x00)"
        raise InvalidInputError(msg)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        msg = f"{what} must be valid Unicode text: lone surrogate code points are not allowed"
        raise InvalidInputError(msg) from None
    return value


def check_fact(fact: object) -> str:
    """A fact: 1..2000 characters, and no scope-marker look-alike (scope comes from the caller only)."""
    text = check_text(fact, "fact", min_len=1, max_len=FACT_MAX)
    if MARKER_LOOKALIKE.search(text):
        msg = "fact must not contain the reserved sequence '<!-- osa-memory:' (scope markers are added by the server)"
        raise InvalidInputError(msg)
    return text


def check_topic(topic: object) -> str | None:
    """An optional topic: ``None`` or 1..120 characters."""
    if topic is None:
        return None
    return check_text(topic, "topic", min_len=1, max_len=TOPIC_MAX)


def check_query(query: object) -> str:
    """A recall query: 1..1000 characters."""
    return check_text(query, "query", min_len=1, max_len=QUERY_MAX)


def check_limit(limit: object) -> int:
    """A recall limit: an integer from 1 to 20."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not LIMIT_MIN <= limit <= LIMIT_MAX:
        msg = f"limit must be an integer from {LIMIT_MIN} to {LIMIT_MAX}, got {limit!r}"
        raise InvalidInputError(msg)
    return limit
