from __future__ import annotations

from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.utils import Secret, deserialize_secrets_inplace

from haystack_osa_memory.components._kb import KnowledgeBaseSettings
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.store.facts import FactRepository


@component
class GovernedFactWriter(KnowledgeBaseSettings):
    """Writes facts as governing row + chunk, both in one transaction, upserting by document id.

    A crash or error between the two writes rolls both back: a fact is never half visible, and
    retrying the same store completes it. Storing the same fact again updates it in place.

    Usage example:
    ```python
    from haystack import Pipeline
    from haystack_osa_memory import GovernedFactWriter, ScopeMarkerWriter

    pipe = Pipeline()
    pipe.add_component("mark", ScopeMarkerWriter())
    pipe.add_component("write", GovernedFactWriter())  # PG_CONN_STR
    pipe.connect("mark.documents", "write.documents")
    pipe.connect("mark.governing_rows", "write.governing_rows")
    ```
    """

    def __init__(
        self,
        connection_string: Secret = Secret.from_env_var("PG_CONN_STR"),
        kb_schema: str = "public",
        governing_table: str = "org_documents",
        chunk_table: str = "haystack_documents",
        embedding_dimension: int = 384,
        language: str = "english",
        memory_schema: str | None = None,
    ) -> None:
        """
        :param connection_string: PostgreSQL connection string (secret; env var `PG_CONN_STR` by default).
        :param kb_schema: Schema of the knowledge-base tables.
        :param governing_table: Table of governing rows.
        :param chunk_table: pgvector-haystack chunk table.
        :param embedding_dimension: Dimension of the chunk table's embeddings.
        :param language: PostgreSQL text-search configuration.
        :param memory_schema: Schema of the audit table; when set, every write appends an audit row in the
            same transaction. `None` writes no audit.
        """
        self._init_kb(connection_string, kb_schema, governing_table, chunk_table, embedding_dimension, language)
        self.memory_schema = memory_schema
        if memory_schema is not None:
            self._config = MemoryConfig.model_validate({**self._config.model_dump(), "memory_schema": memory_schema})
        self._repo: FactRepository | None = None

    def warm_up(self) -> None:
        """Resolve the connection string (safe to call twice)."""
        if self._repo is None:
            self._repo = FactRepository(self._conn_str(), self._config)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, memory_schema=self.memory_schema, **self._kb_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GovernedFactWriter:
        deserialize_secrets_inplace(data["init_parameters"], keys=["connection_string"])
        return default_from_dict(cls, data)

    @component.output_types(document_ids=list[str])
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
        :param actor: Who writes (token id, `cli:<user>`), recorded in the audit when `memory_schema` is set.
        :param action: Audit action name (`store`, `propose`, `import`).
        :returns: `document_ids` written (in input order).
        :raises InvalidInputError: documents and rows do not pair up by id; nothing is written.
        :raises DatabaseError: the database failed; nothing is written.
        """
        rows = {row["id"]: row for row in governing_rows}
        if len(rows) != len(documents) or any(doc.id not in rows for doc in documents):
            msg = "every document needs exactly one governing row with the same id (use ScopeMarkerWriter)"
            raise InvalidInputError(msg)
        for doc in documents:
            if doc.embedding is not None and len(doc.embedding) != self.embedding_dimension:
                msg = (
                    f"embedding has {len(doc.embedding)} dimensions, the chunk table stores {self.embedding_dimension}"
                )
                raise InvalidInputError(msg)
        self.warm_up()
        assert self._repo is not None
        items = [
            (rows[doc.id], {"id": doc.id, "content": doc.content, "embedding": doc.embedding, "meta": doc.meta})
            for doc in documents
        ]
        audit = {"actor": actor or "unknown", "action": action} if self.memory_schema is not None else None
        return {"document_ids": self._repo.write(items, audit=audit)}
