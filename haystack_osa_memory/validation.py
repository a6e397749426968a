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


KINDS = ("fact", "procedure", "pitfall", "preference", "reference")
VERDICTS = ("confirm", "flag")
TITLE_MAX = 120
NOTE_MAX = 500
REASON_MAX = 500
PATH_MAX, PATHS_MAX = 300, 20
PERSONA_MAX, PERSONAS_MAX = 60, 10
TTL_DAYS_MAX = 3650


def check_choice(value: object, what: str, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``."""
    if not isinstance(value, str) or value not in allowed:
        msg = f"{what} {value!r} is not allowed; use one of {list(allowed)}"
        raise InvalidInputError(msg)
    return value


def check_document_id(value: object) -> str:
    """A document id as returned by the tools (64 hexadecimal characters)."""
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        msg = "document_id must be the 64-character hexadecimal id returned by kb_memory_store or kb_memory_recall"
        raise InvalidInputError(msg)
    return value


def check_string_list(values: object, what: str, *, max_items: int, max_len: int) -> list[str]:
    """A list of 1..max_len character strings, at most ``max_items`` of them."""
    if values is None:
        return []
    if not isinstance(values, list) or len(values) > max_items:
        msg = f"{what} must be a list of at most {max_items} strings"
        raise InvalidInputError(msg)
    return [check_text(v, f"{what} item", min_len=1, max_len=max_len) for v in values]


def check_ttl_days(value: object) -> int | None:
    """An optional time to live in days, 1..3650."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= TTL_DAYS_MAX:
        msg = f"ttl_days must be an integer from 1 to {TTL_DAYS_MAX} (or omitted for no expiry), got {value!r}"
        raise InvalidInputError(msg)
    return value


def normalise(text: str) -> str:
    """Lower-case words only, single-spaced: the form duplicate checks compare."""
    return " ".join("".join(ch if ch.isalnum() else " " for ch in text.casefold()).split())
