"""Secret detection for the curation gate (feedback notes, proposals): refuse rather than redact."""

from __future__ import annotations

from haystack_osa_memory.redaction import redact

#: Redaction classes that are secrets (private addresses and user paths are redacted, not refused).
SECRET_CLASSES = ("private_key", "jwt", "secret", "password")


def secret_classes(text: str) -> list[str]:
    """Names of the secret classes found in ``text`` (empty when clean)."""
    counts = redact(text, enabled_classes=SECRET_CLASSES).counts
    return sorted(name for name, n in counts.items() if n)
