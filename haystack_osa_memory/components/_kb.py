"""Shared settings of the components that reach the knowledge base (connection and table names)."""

from __future__ import annotations

from typing import Any

from haystack.utils import Secret

from haystack_osa_memory.config import MemoryConfig


class KnowledgeBaseSettings:
    """Mixin: connection string secret + table names, turned into a :class:`MemoryConfig` on demand."""

    connection_string: Secret
    kb_schema: str
    governing_table: str
    chunk_table: str
    embedding_dimension: int
    language: str

    def _init_kb(
        self,
        connection_string: Secret,
        kb_schema: str,
        governing_table: str,
        chunk_table: str,
        embedding_dimension: int,
        language: str,
    ) -> None:
        self.connection_string = connection_string
        self.kb_schema = kb_schema
        self.governing_table = governing_table
        self.chunk_table = chunk_table
        self.embedding_dimension = embedding_dimension
        self.language = language
        # Validates names now, so a bad table name fails at construction, not at first query.
        # Operational settings (statement and pool timeouts) come from the environment.
        self._config = MemoryConfig.from_env(
            kb_schema=kb_schema,
            governing_table=governing_table,
            chunk_table=chunk_table,
            embedding_dimension=embedding_dimension,
            language=language,
        )

    def _kb_dict(self) -> dict[str, Any]:
        return {
            "connection_string": self.connection_string.to_dict(),
            "kb_schema": self.kb_schema,
            "governing_table": self.governing_table,
            "chunk_table": self.chunk_table,
            "embedding_dimension": self.embedding_dimension,
            "language": self.language,
        }

    def _conn_str(self) -> str:
        value = self.connection_string.resolve_value()
        if not value:
            from haystack_osa_memory.errors import ConfigurationError

            msg = "no database connection string: set PG_CONN_STR (or let `osa-memory` start the embedded default)"
            raise ConfigurationError(msg)
        return str(value)
