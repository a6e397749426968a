"""Validation of text that arrives from callers (tools, CLI, Python API)."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from datetime import UTC, date, datetime

from haystack_osa_memory import tools
from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.markers import MARKER_LOOKALIKE
from haystack_osa_memory.privacy.redaction import PLACEHOLDER_PATTERN

# The limits and choices are the tools' contract, declared once in `tools.py`.
CURSOR_MAX = tools.CURSOR_MAX
DOCUMENT_ID_LENGTH = tools.DOCUMENT_ID_LENGTH
FACT_MAX = tools.FACT_MAX
KINDS = tools.KINDS
LIMIT_MAX = tools.LIMIT_MAX
LIMIT_MIN = tools.LIMIT_MIN
NOTE_MAX = tools.NOTE_MAX
PATH_MAX = tools.PATH_MAX
PATHS_MAX = tools.PATHS_MAX
PERSONA_MAX = tools.PERSONA_MAX
PERSONAS_MAX = tools.PERSONAS_MAX
QUERY_MAX = tools.QUERY_MAX
REASON_MAX = tools.REASON_MAX
TITLE_MAX = tools.TITLE_MAX
TOPIC_MAX = tools.TOPIC_MAX
TTL_DAYS_MAX = tools.TTL_DAYS_MAX
VERDICTS = tools.VERDICTS
SUPERSEDES_MAX = tools.SUPERSEDES_MAX
TIMESTAMP_MAX = tools.TIMESTAMP_MAX
# Before this, a timestamp is certainly a mistake (a year typed as 26); after it, too.
_EARLIEST = datetime(tools.TIMESTAMP_YEARS[0], 1, 1, tzinfo=UTC)
_LATEST = datetime(tools.TIMESTAMP_YEARS[1], 1, 1, tzinfo=UTC)


# Characters that show nothing on their own: separators and spaces (Z*), controls (Cc), format
# characters such as U+200B, U+2060, U+FEFF, soft hyphens and tag characters (Cf), surrogates (Cs),
# combining marks and variation selectors (M*), which only decorate a base character, and code points
# no text is made of: private use (Co, such as U+E000: a glyph only in some fonts) and unassigned ones
# (Cn: noncharacters such as U+FFFF and U+10FFFF, and code points such as U+0378).
_INVISIBLE_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Mn", "Mc", "Me", "Co", "Cn"})
# Letters and symbols drawn as blank space (Hangul fillers, the empty Braille pattern).
_BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def is_visible(char: str) -> bool:
    """True for a character that shows something on its own (a letter, digit, punctuation or symbol)."""
    return char not in _BLANK_CHARACTERS and unicodedata.category(char) not in _INVISIBLE_CATEGORIES


def _invisible_detail(value: str) -> str:
    """What a text without a visible character holds: whitespace, and the code points of the rest."""
    shown = list(dict.fromkeys(f"U+{ord(c):04X}" for c in value if not c.isspace()))
    if not shown:
        return "got only whitespace"
    more = ", ..." if len(shown) > 5 else ""
    kinds = "invisible"
    if any(unicodedata.category(c) in ("Co", "Cn") for c in value):
        kinds = "invisible, private-use or unassigned"
    return f"got only whitespace or {kinds} characters ({', '.join(shown[:5])}{more})"


def length_before_redaction(text: str) -> int:
    """The fewest characters ``text`` can have had before redaction: each placeholder replaced at least one.

    Redaction lengthens text (``10.0.0.1`` becomes ``[REDACTED-PRIVATE-IP]``), so the length limits
    apply to this count, the caller's, not to the redacted text's.
    """
    return len(text) - sum(len(m.group(0)) - 1 for m in PLACEHOLDER_PATTERN.finditer(text))


def check_text(value: object, what: str, *, min_len: int, max_len: int, length: Callable[[str], int] = len) -> str:
    """Return ``value`` if it is a clean string of an allowed length, else raise :class:`InvalidInputError`.

    Refused: non-strings, lengths outside ``min_len..max_len`` characters (measured by ``length``),
    text with no visible character (only whitespace, zero-width and other format characters, lone
    combining marks, fillers, private-use and unassigned code points), NUL bytes (PostgreSQL text
    cannot hold them) and lone UTF-16 surrogates (not UTF-8).
    """
    if not isinstance(value, str):
        msg = f"{what} must be a string of {min_len} to {max_len} characters, got {type(value).__name__}"
        raise InvalidInputError(msg)
    size = length(value)
    if not min_len <= size <= max_len:
        msg = f"{what} must be {min_len} to {max_len} characters long, got {size}"
        raise InvalidInputError(msg)
    if "\x00" in value:
        msg = f"{what} must not contain NUL characters (\\x00)"
        raise InvalidInputError(msg)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        msg = f"{what} must be valid Unicode text: lone surrogate code points are not allowed"
        raise InvalidInputError(msg) from None
    if min_len > 0 and not any(is_visible(c) for c in value):
        msg = f"{what} must contain at least one visible character (a letter, digit, punctuation or symbol); "
        msg += _invisible_detail(value)
        raise InvalidInputError(msg)
    return value


def check_fact(fact: object, *, redacted: bool = False) -> str:
    """A fact: 1..``FACT_MAX`` characters, and no scope-marker look-alike (scope comes from the caller only).

    With ``redacted``, ``fact`` is the output of the privacy redactor and its length is counted as
    :func:`length_before_redaction` (the caller's fact was checked before it was redacted).
    """
    length = length_before_redaction if redacted else len
    text = check_text(fact, "fact", min_len=1, max_len=FACT_MAX, length=length)
    if MARKER_LOOKALIKE.search(text):
        msg = "fact must not contain the reserved sequence '<!-- osa-memory:' (scope markers are added by the server)"
        raise InvalidInputError(msg)
    return text


def check_topic(topic: object, *, redacted: bool = False) -> str | None:
    """An optional topic: ``None`` or 1..``TOPIC_MAX`` characters (counted as in :func:`check_fact` if ``redacted``)."""
    if topic is None:
        return None
    length = length_before_redaction if redacted else len
    return check_text(topic, "topic", min_len=1, max_len=TOPIC_MAX, length=length)


def check_query(query: object) -> str:
    """A recall query: 1..``QUERY_MAX`` characters."""
    return check_text(query, "query", min_len=1, max_len=QUERY_MAX)


def check_limit(limit: object) -> int:
    """A recall limit: an integer from ``LIMIT_MIN`` to ``LIMIT_MAX``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not LIMIT_MIN <= limit <= LIMIT_MAX:
        msg = f"limit must be an integer from {LIMIT_MIN} to {LIMIT_MAX}, got {limit!r}"
        raise InvalidInputError(msg)
    return limit


def check_choice(value: object, what: str, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``."""
    if not isinstance(value, str) or value not in allowed:
        msg = f"{what} {value!r} is not allowed; use one of {list(allowed)}"
        raise InvalidInputError(msg)
    return value


def check_document_id(value: object) -> str:
    """A document id as returned by the tools (64 hexadecimal characters)."""
    size = DOCUMENT_ID_LENGTH
    if not isinstance(value, str) or len(value) != size or any(c not in "0123456789abcdef" for c in value):
        msg = f"document_id must be the {size}-character hexadecimal id returned by kb_memory_store or kb_memory_recall"
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
    """An optional time to live in days, 1..``TTL_DAYS_MAX``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= TTL_DAYS_MAX:
        msg = f"ttl_days must be an integer from 1 to {TTL_DAYS_MAX} (or omitted for no expiry), got {value!r}"
        raise InvalidInputError(msg)
    return value


def normalise(text: str) -> str:
    """Lower-case words only, single-spaced: the form duplicate checks compare."""
    return " ".join("".join(ch if ch.isalnum() else " " for ch in text.casefold()).split())


def check_timestamp(value: object, what: str) -> datetime | None:
    """An optional point in time: ``None``, a timezone-aware or naive ``datetime`` (naive = UTC), a ``date``
    (its midnight UTC) or an ISO 8601 string (``2026-03-01``, ``2026-03-01T09:30``, ``...+01:00``, ``...Z``).
    Returned in UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        text = check_text(value, what, min_len=1, max_len=TIMESTAMP_MAX).strip()
        try:
            parsed = datetime.fromisoformat(text)
        except (ValueError, OverflowError):
            msg = (
                f"{what} must be an ISO 8601 date or date-time such as 2026-03-01 or 2026-03-01T09:30:00+01:00, "
                f"got {value!r}"
            )
            raise InvalidInputError(msg) from None
    elif isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):
        parsed = datetime(value.year, value.month, value.day)
    else:
        msg = f"{what} must be an ISO 8601 string, a datetime or a date, got {type(value).__name__}"
        raise InvalidInputError(msg)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    allowed = f"{what} must lie between the years {_EARLIEST.year} and {_LATEST.year} (UTC)"
    try:
        in_utc = parsed.astimezone(UTC)
    except OverflowError:
        # Its offset moves it past the year 9999 or before the year 1 (9999-12-31T23:59:59-23:59).
        msg = f"{allowed}, got {value!r}"
        raise InvalidInputError(msg) from None
    if not _EARLIEST <= in_utc < _LATEST:
        msg = f"{allowed}, got {in_utc.isoformat()}"
        raise InvalidInputError(msg)
    return in_utc


def check_validity(valid_from: datetime | None, valid_to: datetime | None) -> None:
    """``valid_to`` must come after ``valid_from`` when both are given."""
    if valid_from is not None and valid_to is not None and valid_to <= valid_from:
        msg = f"valid_to ({valid_to.isoformat()}) must be after valid_from ({valid_from.isoformat()})"
        raise InvalidInputError(msg)


def check_document_ids(values: object, what: str, *, max_items: int) -> list[str]:
    """A list of at most ``max_items`` document ids (duplicates dropped, order kept)."""
    if values is None:
        return []
    if not isinstance(values, list) or len(values) > max_items:
        msg = f"{what} must be a list of at most {max_items} document ids"
        raise InvalidInputError(msg)
    return list(dict.fromkeys(check_document_id(v) for v in values))
