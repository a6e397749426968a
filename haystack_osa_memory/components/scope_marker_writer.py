from __future__ import annotations

from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict

from haystack_osa_memory.markers import check_identifier, marked_fact
from haystack_osa_memory.store.facts import FACT_AUDIENCE, FACT_SOURCE
from haystack_osa_memory.validation import check_fact, check_topic

#: Input meta keys copied into the governing row's metadata.
_CARRIED_META = ("kind", "expires_at", "paths", "personas", "valid_from", "valid_to")


@component
class ScopeMarkerWriter:
    """Turns plain facts into scoped knowledge-base documents and their governing rows.

    For each input document it prefixes the content with the assignment's scope-marker line,
    computes the content hash (sha256 of the exact stored bytes) and the deterministic document id
    (from org, dataset and that hash), and prepares the governing row. An embedding already on the
    input document (computed on the plain fact text) is kept. Nothing is written here.

    Usage example:
    ```python
    from haystack import Document
    from haystack_osa_memory import ScopeMarkerWriter

    writer = ScopeMarkerWriter()
    out = writer.run(documents=[Document(content="Staging deploys need the VPN", meta={"topic": "deploy"})],
                     org_id="acme", assignment_id="asg-1")
    out["documents"][0].content   # '<!-- osa-memory:scope asg-1 -->\\nStaging deploys need the VPN'
    out["governing_rows"][0]["metadata"]  # {'assignment_id': 'asg-1', 'osa_memory': True, 'topic': 'deploy'}
    ```
    """

    def __init__(
        self,
        dataset: str = "osa-memory",
        source: str = FACT_SOURCE,
        audience: str = FACT_AUDIENCE,
        status: str = "approved",
    ) -> None:
        """
        :param dataset: Dataset of the governing rows (part of the document id).
        :param source: Source written to the governing rows.
        :param audience: Audience written to the governing rows; facts are `ai_internal`.
        :param status: Status of newly stored facts.
        """
        check_identifier(dataset, "dataset")
        if audience == "customer":
            msg = "audience 'customer' is not allowed for agent facts: use 'ai_internal' (facts never reach customers)"
            raise ValueError(msg)
        self.dataset = dataset
        self.source = source
        self.audience = audience
        self.status = status

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self, dataset=self.dataset, source=self.source, audience=self.audience, status=self.status
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScopeMarkerWriter:
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document], governing_rows=list[dict[str, Any]])
    def run(
        self,
        documents: list[Document],
        org_id: str,
        assignment_id: str,
        specialist_id: str | None = None,
        status: str | None = None,
        stored_by: str | None = None,
    ) -> dict[str, Any]:
        """
        Mark and identify facts for one assignment.

        :param documents: Plain facts (content = fact text; optional meta `topic`, `title`, `kind`,
            `expires_at`, `paths`, `personas`, `valid_from`, `valid_to` (ISO 8601) and `supersedes` (ids of
            facts of the same scope it replaces)).
        :param org_id: The caller's org (from trusted context).
        :param assignment_id: The caller's assignment (from trusted context).
        :param specialist_id: The caller's specialist, if any.
        :param status: Overrides the status of new facts for this run (e.g. `proposed`).
        :param stored_by: Who stores (token id), recorded in the governing row's metadata.
        :returns: `documents` (marked chunks, id = document id) and `governing_rows` (one per document).
        :raises InvalidInputError: a fact or topic is not allowed; nothing is returned.
        """
        check_identifier(org_id, "org")
        check_identifier(assignment_id, "assignment")
        if specialist_id is not None:
            check_identifier(specialist_id, "specialist")
        out_docs: dict[str, Document] = {}
        rows: dict[str, dict[str, Any]] = {}
        for doc in documents:
            text = check_fact(doc.content, redacted=True)  # placeholders may have lengthened it
            topic = check_topic(doc.meta.get("topic"), redacted=True)
            stored, digest, doc_id = marked_fact(text, org_id, assignment_id, self.dataset)
            metadata: dict[str, Any] = {"assignment_id": assignment_id, "osa_memory": True}
            if topic is not None:
                metadata["topic"] = topic
            for key in _CARRIED_META:
                if doc.meta.get(key) is not None:
                    metadata[key] = doc.meta[key]
            if stored_by is not None:
                metadata["stored_by"] = stored_by
            rows[doc_id] = {
                "id": doc_id,
                "org_id": org_id,
                "specialist_id": specialist_id,
                "dataset": self.dataset,
                "source": self.source,
                "audience": self.audience,
                "status": status or self.status,
                "content_hash": digest,
                "title": doc.meta.get("title") or topic,
                "metadata": metadata,
            }
            if doc.meta.get("supersedes"):
                # Not metadata: the writer supersedes these in its transaction and links them (`supersedes`).
                rows[doc_id]["supersedes"] = list(doc.meta["supersedes"])
            chunk_meta: dict[str, Any] = {
                "document_id": doc_id,
                "org_id": org_id,
                "dataset": self.dataset,
                "source": self.source,
                "audience": self.audience,
                "osa_memory": True,
                "content_hash": digest,
            }
            if topic is not None:
                chunk_meta["topic"] = topic
            out_docs[doc_id] = Document(id=doc_id, content=stored, embedding=doc.embedding, meta=chunk_meta)
        return {"documents": list(out_docs.values()), "governing_rows": list(rows.values())}
