"""Secret detection for the curation gate (feedback notes, proposals)."""

from __future__ import annotations

import re

# Interim patterns until the privacy guard lands; replaced by haystack_osa_memory.redaction.
_SECRET_PATTERNS = {
    "aws-access-key": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "forge-token": re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36}\b|\bglpat-[A-Za-z0-9_-]{20}\b"),
    "chat-token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"),
    "jwt": re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b"),
    "private-key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "password": re.compile(r"(?i)\b(?:password|passwd|secret|api[_-]?key|token)\s*[:=]\s*\S{4,}"),
}


def secret_classes(text: str) -> list[str]:
    """Names of the secret classes found in ``text`` (empty when clean)."""
    return sorted(name for name, pattern in _SECRET_PATTERNS.items() if pattern.search(text))
