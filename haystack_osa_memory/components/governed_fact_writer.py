from __future__ import annotations

from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict

from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.store.facts import FactRepository
from haystack_osa_memory.store.memory_store import MemoryStore, store_from_environment


@component
class GovernedFactWriter:
    """Writes facts as governing row + chunk, both in one transaction, upserting by document id.

    A crash or error between the two writes rolls both back: a fact is never half visible, and
    retrying the same store completes it. Storing the same fact again updates it in place.

    Usage example:
    ```python
    from haystack import Pipeline
    from haystack_osa_memory import GovernedFactWriter, MemoryStore, ScopeMarkerWriter

    pipe = Pipeline()
    pipe.add_component("mark", ScopeMarkerWriter())
    pipe.add_component("write", GovernedFactWriter(store=MemoryStore()))  # PG_CONN_STR
    pipe.connect("mark.documents", "write.documents")
    pipe.connect("mark.governing_rows", "write.governing_rows")
    ```
    """

    def __init__(
        self,
        store: MemoryStore | None = None,
        audit: bool = True,
    ) -> None:
        """
        :param store: The knowledge base (`MemoryStore`: connection, table names, timeouts). Required:
            without it the component still falls back to `MemoryStore()` (the `PG_CONN_STR` secret, read on
            first use) and warns (`DeprecationWarning`); from 0.2.0 it will not load.
        :param audit: Append an audit row per fact (in the store's memory schema) in the same transaction.
        """
        self.store = store if store is not None else store_from_environment("GovernedFactWriter")
        self.audit = audit
        self._repo: FactRepository | None = None

    def warm_up(self) -> None:
        """Resolve the connection string (safe to call twice)."""
        if self._repo is None:
            self._repo = self.store.facts

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, audit=self.audit, store=self.store.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GovernedFactWriter:
        params = data["init_parameters"]
        if isinstance(params.get("store"), dict):
            params["store"] = MemoryStore.from_dict(params["store"])
        return default_from_dict(cls, data)

    @component.output_types(document_ids=list[str], statuses=list[str])
    def run(
        self,
        documents: list[Document],
        governing_rows: list[dict[str, Any]],
        actor: str | None = None,
        action: str = "store",
    ) -> dict[str, list[str]]:
        """
        :param documents: Marked chunks from `ScopeMarkerWriter` (id = document id).
        :param governing_rows: Their governing rows, same ids.
        :param actor: Who writes (token id, `cli:<user>`), recorded in the audit (with `audit`).
        :param action: Audit action name (`store`, `propose`, `import`).
        :returns: `document_ids` written (in input order) and each one's `statuses` after the write (storing
            the text of a fact waiting for review keeps its status).
        :raises InvalidInputError: documents and rows do not pair up by id; nothing is written.
        :raises DatabaseError: the database failed; nothing is written.
        """
        rows = {row["id"]: row for row in governing_rows}
        if len(rows) != len(documents) or any(doc.id not in rows for doc in documents):
            msg = "every document needs exactly one governing row with the same id (use ScopeMarkerWriter)"
            raise InvalidInputError(msg)
        for doc in documents:
            if doc.embedding is not None and len(doc.embedding) != self.store.embedding_dimension:
                stored = self.store.embedding_dimension
                msg = f"embedding has {len(doc.embedding)} dimensions, the chunk table stores {stored}"
                raise InvalidInputError(msg)
        self.warm_up()
        assert self._repo is not None
        items = [
            (rows[doc.id], {"id": doc.id, "content": doc.content, "embedding": doc.embedding, "meta": doc.meta})
            for doc in documents
        ]
        audit = {"actor": actor or "unknown", "action": action} if self.audit else None
        written = self._repo.write_statuses(items, audit=audit)
        return {"document_ids": [doc_id for doc_id, _ in written], "statuses": [status for _, status in written]}
