"""The scope marker: a first line inside the stored bytes naming the assignment.

Pure functions, no I/O. The marker lives in the bytes (not only in metadata) so that the content
hash, and the document id derived from it, differ per assignment: the same fact text stored by two
assignments becomes two documents that can never clobber each other.

    >>> marked = add_marker("deploys need a VPN", "asg-42")
    >>> marked
    '<!-- osa-memory:scope asg-42 -->\\ndeploys need a VPN'
    >>> strip_marker(marked)
    'deploys need a VPN'
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

from haystack_osa_memory.errors import InvalidInputError

MARKER_PREFIX = "<!-- osa-memory:scope "
MARKER_SUFFIX = " -->"
#: Identifiers (org, assignment, specialist, dataset): letters, digits and ``._:@-``, 1..128 characters.
IDENTIFIER_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
_LEADING_MARKER = re.compile(r"^<!-- osa-memory:scope [A-Za-z0-9][A-Za-z0-9._:@-]{0,127} -->\n")
#: Anything that looks like a marker, anywhere in a text (used to refuse spoofing attempts).
MARKER_LOOKALIKE = re.compile(r"<!--\s*osa-memory\s*:", re.IGNORECASE)


def check_identifier(value: str, what: str) -> str:
    """Return ``value`` if it is a valid identifier, else raise :class:`InvalidInputError`."""
    if not isinstance(value, str) or not IDENTIFIER_PATTERN.fullmatch(value):
        msg = (
            f"{what} {value!r} is not allowed: use 1 to 128 characters from letters, digits and '._:@-', "
            "starting with a letter or digit"
        )
        raise InvalidInputError(msg)
    return value


def marker_line(assignment_id: str) -> str:
    """The marker line (with its newline) for an assignment."""
    check_identifier(assignment_id, "assignment_id")
    return f"{MARKER_PREFIX}{assignment_id}{MARKER_SUFFIX}\n"


def add_marker(text: str, assignment_id: str) -> str:
    """Prefix ``text`` with the assignment's marker line."""
    return marker_line(assignment_id) + text


def strip_marker(content: str) -> str:
    """Remove exactly one leading marker line; any other text is returned unchanged."""
    match = _LEADING_MARKER.match(content)
    return content[match.end() :] if match else content


def marker_assignment(content: str) -> str | None:
    """The assignment named by a leading marker line, or ``None`` when there is none."""
    match = _LEADING_MARKER.match(content)
    if not match:
        return None
    return match.group(0)[len(MARKER_PREFIX) : -len(MARKER_SUFFIX) - 1]


def content_hash(content: str) -> str:
    """sha256 (hex) of the exact UTF-8 bytes that are stored."""
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def document_id(org_id: str, dataset: str, hash_hex: str) -> str:
    """Deterministic document id from org, dataset and content hash (64 hex characters)."""
    raw = "\x1f".join((org_id, dataset, hash_hex)).encode("utf-8")
    return hashlib.sha256(raw).hexdigest()


class MarkedFact(NamedTuple):
    """A fact as it is stored in one scope: the bytes (marker line first), their hash, the document id."""

    content: str
    content_hash: str
    document_id: str


def marked_fact(text: str, org_id: str, assignment_id: str, dataset: str) -> MarkedFact:
    """What `ScopeMarkerWriter` stores for ``text`` in a scope; the one place a fact's id is derived."""
    stored = add_marker(text, assignment_id)
    digest = content_hash(stored)
    return MarkedFact(stored, digest, document_id(org_id, dataset, digest))
