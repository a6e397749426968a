"""Settings of haystack-osa-memory, read from the environment (see docs/configuration.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from psycopg import sql
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from haystack_osa_memory.errors import ConfigurationError
from haystack_osa_memory.markers import IDENTIFIER_PATTERN

EmbedderChoice = Literal["auto", "none", "minilm"]
Precision = Literal["float32", "int8"]

#: Environment variable -> setting name. Documented one by one in docs/configuration.md.
ENVIRONMENT: dict[str, str] = {
    "PG_CONN_STR": "pg_conn_str",
    "OSA_MEMORY_DATA_DIR": "data_dir",
    "OSA_MEMORY_KB_SCHEMA": "kb_schema",
    "OSA_MEMORY_CHUNK_TABLE": "chunk_table",
    "OSA_MEMORY_GOVERNING_TABLE": "governing_table",
    "OSA_MEMORY_SCHEMA": "memory_schema",
    "OSA_MEMORY_EMBEDDING_DIM": "embedding_dimension",
    "OSA_MEMORY_LANGUAGE": "language",
    "OSA_MEMORY_EMBEDDER": "embedder",
    "OSA_MEMORY_EMBEDDER_TIMEOUT": "embedder_timeout",
    "OSA_MEMORY_QUERY_PRECISION": "query_precision",
    "OSA_MEMORY_DATASET": "dataset",
    "OSA_MEMORY_STATEMENT_TIMEOUT_MS": "statement_timeout_ms",
    "OSA_MEMORY_POOL_TIMEOUT": "pool_timeout",
    "OSA_MEMORY_ENABLED": "enabled",
    "OSA_MEMORY_TRUST_FLOOR": "trust_floor",
    "OSA_MEMORY_SUGGEST_SUPERSEDES": "suggest_supersedes",
    "OSA_MEMORY_BUFFER": "buffer_path",
    "OSA_MEMORY_OFFLINE_GRACE": "offline_grace",
    "OSA_MEMORY_REDACTION_OFF": "redaction_off",
    "OSA_MEMORY_SCOPE_CACHE_FACTS": "scope_cache_facts",
}


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/osa-memory``, else ``~/.local/share/osa-memory``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "osa-memory"


class MemoryConfig(BaseModel):
    """Where the knowledge base lives and how memory behaves.

    Usage:
    ```python
    from haystack_osa_memory import MemoryConfig

    config = MemoryConfig.from_env()           # PG_CONN_STR, OSA_MEMORY_* variables
    config = MemoryConfig(chunk_table="kb_chunks", embedding_dimension=768)
    ```
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    pg_conn_str: str | None = Field(default=None, repr=False)
    data_dir: Path = Field(default_factory=default_data_dir)
    kb_schema: str = "public"
    chunk_table: str = "haystack_documents"
    governing_table: str = "org_documents"
    memory_schema: str = "osa_memory"
    embedding_dimension: int = Field(default=384, ge=1, le=16000)
    language: str = "english"
    embedder: EmbedderChoice = "auto"
    embedder_timeout: float = Field(default=5.0, gt=0, le=120)
    query_precision: Precision = "int8"
    dataset: str = "osa-memory"
    admitted_statuses: tuple[str, ...] = ("approved",)
    statement_timeout_ms: int = Field(default=15000, ge=100, le=600000)
    pool_timeout: float = Field(default=5.0, gt=0, le=120)
    enabled: bool = True
    trust_floor: float = Field(default=0.3, ge=0, le=1)
    #: `kb_memory_store` searches the scope for facts the new one probably replaces (`possibly_supersedes`).
    suggest_supersedes: bool = True
    buffer_path: Path | None = None
    offline_grace: float = Field(default=900.0, ge=0, le=86400)
    redaction_off: tuple[str, ...] = ()
    #: Facts of big assignments held in memory per process for exact ranking (`store.scope_cache`); 0: none.
    scope_cache_facts: int = Field(default=50_000, ge=0, le=10_000_000)

    @field_validator("redaction_off", mode="before")
    @classmethod
    def _redaction_off(cls, value: object) -> object:
        from haystack_osa_memory.privacy.redaction import CLASSES

        items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if isinstance(items, list | tuple):
            unknown = sorted(set(items) - set(CLASSES))
            if unknown:
                msg = f"unknown redaction classes {unknown}; allowed: {list(CLASSES)}"
                raise ValueError(msg)
            return tuple(items)
        return value

    @property
    def offline_buffer_path(self) -> Path:
        """Where facts wait while the database is unreachable (default: `<data_dir>/offline-buffer.jsonl`)."""
        return self.buffer_path or self.data_dir / "offline-buffer.jsonl"

    def sql_names(self) -> dict[str, sql.Identifier]:
        """The configured schemas and tables as SQL identifiers, keyed as our statements name them:
        `schema` (knowledge base), `gov` (governing table), `chunk` (chunk table), `mem` (memory schema)."""
        return {
            "schema": sql.Identifier(self.kb_schema),
            "gov": sql.Identifier(self.governing_table),
            "chunk": sql.Identifier(self.chunk_table),
            "mem": sql.Identifier(self.memory_schema),
        }

    @field_validator("kb_schema", "chunk_table", "governing_table", "memory_schema", "language")
    @classmethod
    def _sql_name(cls, value: str) -> str:
        if not value or len(value) > 63 or not value.replace("_", "a").isalnum() or not value.isascii():
            msg = f"{value!r} is not allowed as a PostgreSQL name: use 1 to 63 ASCII letters, digits or '_'"
            raise ValueError(msg)
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        if not IDENTIFIER_PATTERN.fullmatch(value):
            msg = f"dataset {value!r} is not allowed: 1 to 128 characters from letters, digits and '._:@-'"
            raise ValueError(msg)
        return value

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> MemoryConfig:
        """Build the settings from environment variables (empty values count as unset) and overrides."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for variable, name in ENVIRONMENT.items():
            raw = env.get(variable)
            if raw:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            msg = f"invalid osa-memory settings: {problems}"
            raise ConfigurationError(msg) from None
