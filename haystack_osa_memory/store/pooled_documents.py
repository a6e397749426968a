"""pgvector-haystack's document store over the knowledge base, searching on the store's pooled connections.

A plain ``PgvectorDocumentStore`` opens a connection of its own on first use (and runs ``CREATE
EXTENSION IF NOT EXISTS vector`` on it), then shares that one connection and its cursors between all
callers: one per pipeline built, outside the pool, and not safe to share between threads.
`PooledPgvectorDocumentStore` runs its keyword search on a connection checked out of the pool the
`MemoryStore` uses (statement timeout and scope settings included) for each query, so one instance
serves every thread. Its other operations are the plain store's.

Usage:
```python
from haystack_integrations.components.retrievers.pgvector import PgvectorKeywordRetriever
from haystack_osa_memory import MemoryStore
from haystack_osa_memory.store.pooled_documents import PooledPgvectorDocumentStore

retriever = PgvectorKeywordRetriever(document_store=PooledPgvectorDocumentStore(store=MemoryStore()))
retriever.run(query="refund policy", top_k=5)
```
"""

from __future__ import annotations

from typing import Any

import numpy as np
from haystack.core.serialization import generate_qualified_class_name
from haystack.dataclasses import Document
from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore
from haystack_integrations.document_stores.pgvector.converters import _from_pg_to_haystack_documents
from psycopg.rows import dict_row

from haystack_osa_memory.store.database import read
from haystack_osa_memory.store.memory_store import MemoryStore


def _vector(value: Any) -> Any:
    """An embedding as the plain store reads it: pooled connections have no pgvector loader registered
    (the rest of the store reads vectors as text), so the text form is parsed here."""
    if isinstance(value, str):
        return np.array([float(v) for v in value[1:-1].split(",")], dtype=np.float32)
    return value


class PooledPgvectorDocumentStore(PgvectorDocumentStore):
    """The chunk table of a `MemoryStore` as a ``PgvectorDocumentStore`` whose keyword retrieval uses pooled
    connections (no connection of its own, no ``CREATE EXTENSION``: the schema check guarantees both).

    It saves as a plain ``PgvectorDocumentStore`` (with ``create_extension`` off), which is what
    ``PgvectorKeywordRetriever.from_dict`` loads; a loaded pipeline connects on its own.
    """

    def __init__(self, *, store: MemoryStore) -> None:
        """
        :param store: The knowledge base: its connection string, chunk table, schema, embedding dimension
            and text-search language are the document store's, its pool the one queries run on.
        """
        super().__init__(
            connection_string=store.connection_string,
            create_extension=False,
            schema_name=store.kb_schema,
            table_name=store.chunk_table,
            embedding_dimension=store.embedding_dimension,
            language=store.language,
            keyword_index_name=f"{store.chunk_table}_keyword_index",
            hnsw_index_name=f"{store.chunk_table}_hnsw_index",
        )
        self.store = store

    def to_dict(self) -> dict[str, Any]:
        """Serialise as the plain ``PgvectorDocumentStore`` with the same settings (the connection string as
        its secret's reference, never its value)."""
        data: dict[str, Any] = super().to_dict()
        data["type"] = generate_qualified_class_name(PgvectorDocumentStore)
        return data

    def _keyword_retrieval(
        self, query: str, *, filters: dict[str, Any] | None = None, top_k: int = 10
    ) -> list[Document]:
        """The plain store's keyword query (``PgvectorKeywordRetriever`` calls it), on a pooled connection.

        :raises ValueError: ``query`` is empty.
        :raises DatabaseError: the database failed.
        """
        if not query:
            msg = "query must be a non-empty string"
            raise ValueError(msg)
        statement, where_params = self._build_keyword_retrieval_query(query=query, top_k=top_k, filters=filters)
        with read(self.store.conn_str, self.store.config) as conn, conn.cursor(row_factory=dict_row) as cursor:
            records = cursor.execute(statement, (query, *where_params)).fetchall()
        for record in records:
            if record.get("embedding") is not None:
                record["embedding"] = _vector(record["embedding"])
        documents: list[Document] = _from_pg_to_haystack_documents(records)
        return documents
