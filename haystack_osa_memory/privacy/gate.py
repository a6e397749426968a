"""The privacy rules for free text other than facts.

Secret detection for the curation gate (feedback notes, proposals): refuse rather than redact. And
redaction of every short free-text field that is kept in the database (topics, forget reasons,
feedback and review notes, kill-switch reasons, proposal titles, paths and personas) with the same
configured classes as facts, so that none of them is a side channel around the fact's redaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from haystack_osa_memory.config import enabled_redaction_classes
from haystack_osa_memory.privacy.redaction import RedactionResult, redact

#: Redaction classes that are secrets (private addresses and user paths are redacted, not refused).
SECRET_CLASSES = ("private_key", "jwt", "secret", "password")


def secret_classes(text: str) -> list[str]:
    """Names of the secret classes found in ``text`` (empty when clean)."""
    counts = redact(text, enabled_classes=SECRET_CLASSES).counts
    return sorted(name for name, n in counts.items() if n)


def redact_field(text: str, redaction_off: Sequence[str] = ()) -> RedactionResult:
    """Redact a free-text field with every class except those switched off (``MemoryConfig.redaction_off``)."""
    return redact(text, enabled_classes=enabled_redaction_classes(redaction_off))


def redact_optional(text: str | None, redaction_off: Sequence[str] = ()) -> str | None:
    """:func:`redact_field`'s text, or ``None`` for a field that was not given."""
    return None if text is None else redact_field(text, redaction_off).text
