from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict

from haystack_osa_memory.privacy.redaction import compile_policy

logger = logging.getLogger(__name__)


@component
class PrivacyRedactor:
    """Redacts private addresses, users' home directories and secrets before anything is embedded or stored.

    Each document's content goes through `haystack_osa_memory.privacy.redaction.redact`: private IPv4/IPv6
    addresses, `/home/<user>`-style paths, cloud keys and forge/chat tokens, JWTs, PEM private keys,
    `password=`/`token:` values and URL passwords become typed placeholders such as
    `[REDACTED-SECRET]`. Documents are never mutated: a changed document is a copy with the redacted
    content, `meta["redactions"]` (its count; 0 when nothing was found) and, when its id was derived
    from the old content, a new id (the old one hashes the secret). An embedding computed on the
    unredacted text is dropped, as it encodes what was removed. Documents without text pass through.

    Usage example:
    ```python
    from haystack import Document
    from haystack_osa_memory.components.privacy_redactor import PrivacyRedactor

    redactor = PrivacyRedactor(
        extra_patterns={"email": {"regex": r"[\\w.+-]+@[\\w-]+\\.[\\w.]+", "placeholder": "[REDACTED-EMAIL]"}}
    )
    out = redactor.run(documents=[Document(content="DB at 10.0.3.7, password=hunter2, ask bob@example.com")])
    out["documents"][0].content  # 'DB at [REDACTED-PRIVATE-IP], password=[REDACTED-PASSWORD], ask [REDACTED-EMAIL]'
    out["redactions"], out["redactions_by_class"]  # (3, {'password': 1, 'private_ip': 1, 'email': 1})
    ```
    """

    def __init__(
        self,
        enabled_classes: list[str] | None = None,
        extra_patterns: dict[str, dict[str, str]] | None = None,
    ) -> None:
        """
        :param enabled_classes: Built-in classes to apply, from `private_key`, `jwt`, `secret`, `password`,
            `user_path`, `private_ip`; default all of them. An empty list applies only `extra_patterns`.
        :param extra_patterns: More patterns, `name -> {"regex": ..., "placeholder": "[REDACTED-NAME]"}`, run
            after the built-ins and counted under their name; a named group `value` limits the replacement
            to that group. Keep them linear-time (no nested quantifiers).
        :raises ConfigurationError: an unknown class, or a bad name, regex or placeholder (the message says
            what is allowed).
        """
        self._policy = compile_policy(enabled_classes, extra_patterns)
        self.enabled_classes = None if enabled_classes is None else list(enabled_classes)
        self.extra_patterns = None if extra_patterns is None else {k: dict(v) for k, v in extra_patterns.items()}

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, enabled_classes=self.enabled_classes, extra_patterns=self.extra_patterns)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyRedactor:
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document], redactions=int, redactions_by_class=dict[str, int])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        """
        Redact every document's content.

        :param documents: Documents to be embedded or stored.
        :returns: `documents` (redacted copies, same order), `redactions` (total replacements) and
            `redactions_by_class` (replacements per class; classes with none are left out).
        """
        out: list[Document] = []
        by_class: dict[str, int] = {}
        for doc in documents:
            if doc.content is None:
                out.append(doc)
                continue
            result = self._policy.redact(doc.content)
            for name, n in result.counts.items():
                by_class[name] = by_class.get(name, 0) + n
            meta = {**doc.meta, "redactions": result.total}
            if not result.total:
                out.append(replace(doc, meta=meta))
                continue
            auto_id = replace(doc, id="").id == doc.id
            changes: dict[str, Any] = {"content": result.text, "meta": meta}
            if doc.embedding is not None or doc.sparse_embedding is not None:
                logger.warning(
                    "Dropping the embedding of document %s: it was computed before %d redaction(s)",
                    doc.id if not auto_id else "(content-derived id)",
                    result.total,
                )
                changes.update(embedding=None, sparse_embedding=None)
            if auto_id:
                changes["id"] = ""  # recomputed from the redacted content
            out.append(replace(doc, **changes))
        total = sum(by_class.values())
        if total:
            logger.info("Redacted %d item(s) in %d document(s): %s", total, len(documents), by_class)
        ordered = {name: by_class[name] for name in self._policy.classes if name in by_class}
        return {"documents": out, "redactions": total, "redactions_by_class": ordered}
