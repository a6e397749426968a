"""The settings of haystack-osa-memory: one model, `MemoryConfig`, with every setting's environment variable,
default and meaning (docs/configuration.md is generated from it by `haystack_osa_memory.config_docs`).

A `MemoryConfig(...)` built in code holds what its caller gave and the defaults, nothing from the
environment. The environment is read by one explicit loader, `MemoryConfig.from_env()`
(`haystack_osa_memory.settings`), which the command line, `serve` and a bare `Memory()` use.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from psycopg import sql
from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator
from pydantic.fields import FieldInfo

from haystack_osa_memory.markers import IDENTIFIER_PATTERN

EmbedderChoice = Literal["auto", "none", "minilm"]
Precision = Literal["float32", "float16", "int8", "int8-cls", "mixed"]
#: What runs the MiniLM forward pass (`components.minilm_embedders`).
Runtime = Literal["onnx", "torch"]

#: Key of a field's ``json_schema_extra``: the environment variable that sets it.
ENV_KEY = "env"
#: Key of a field's ``json_schema_extra``: its default as the configuration reference shows it.
SHOWN_DEFAULT_KEY = "shown_default"
#: ``OSA_MEMORY_PG_SHARED_BUFFERS``: a size in kB, MB or GB.
_SHARED_BUFFERS_PATTERN = r"^[1-9][0-9]{0,6}(kB|MB|GB)$"


def setting(default: Any = None, *, env: str | None, doc: str, shown: str | None = None, **kwargs: Any) -> Any:
    """A `MemoryConfig` field: its default, the environment variable that sets it and what it means."""
    extra: dict[str, JsonValue] = {ENV_KEY: env} if env else {}
    if shown is not None:
        extra[SHOWN_DEFAULT_KEY] = shown
    if "default_factory" not in kwargs:
        kwargs["default"] = default
    return Field(description=doc, json_schema_extra=extra or None, **kwargs)


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/osa-memory``, else ``~/.local/share/osa-memory`` (the platform's data location)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "osa-memory"


def enabled_redaction_classes(redaction_off: Iterable[str] = ()) -> list[str]:
    """The built-in redaction classes applied when ``redaction_off`` are switched off, in their order."""
    from haystack_osa_memory.privacy.redaction import CLASSES

    off = set(redaction_off)
    return [c for c in CLASSES if c not in off]


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

    pg_conn_str: str | None = setting(
        env="PG_CONN_STR",
        repr=False,
        doc="Your PostgreSQL with pgvector (`postgresql://user:pass@host:5432/db`). Unset: the embedded "
        "PostgreSQL + pgvector is started under `OSA_MEMORY_DATA_DIR`; `osa-memory` (and `serve`, for its "
        "workers) exports its URI as `PG_CONN_STR`, while `Memory()` in your application uses it without "
        "touching your process's environment. Saved pipelines (`dumps()`) name this variable for their "
        'connection, never its value (see "Saving the pipelines").',
    )
    console_pg_conn_str: str | None = setting(
        env="OSA_MEMORY_CONSOLE_PG_CONN_STR",
        repr=False,
        doc="The review console's connection (`osa-memory console`), as its own database role "
        "(`init --console-role`, docs/console.md). Unset: `PG_CONN_STR`.",
    )
    data_dir: Path = setting(
        env="OSA_MEMORY_DATA_DIR",
        default_factory=default_data_dir,
        shown="`$XDG_DATA_HOME/osa-memory` or `~/.local/share/osa-memory`",
        doc="Embedded database (`pgdata/`) and the offline buffer (`--data-dir` on the command line). "
        "Survives restarts.",
    )
    pg_shared_buffers: str | None = setting(
        env="OSA_MEMORY_PG_SHARED_BUFFERS",
        shown="an eighth of the machine's memory, 128MB to 1GB",
        doc="`shared_buffers` of the embedded PostgreSQL when this process starts it (`512MB`, `2GB`; kB, MB "
        "or GB). PostgreSQL's own default, 128MB, holds the recall rows and indexes of ~30,000 facts; past "
        "it, recall in a big assignment reads pages from the operating system's cache (~0.84x the recall "
        "time at 100,000 facts with 1GB, benchmarks/README.md). A server already running, started by "
        "another process, keeps its setting. Your own PostgreSQL (`PG_CONN_STR`) keeps yours: see "
        "docs/operations.md.",
    )
    kb_schema: str = setting(
        "public", env="OSA_MEMORY_KB_SCHEMA", doc="Schema of the knowledge-base tables (chunks and governing rows)."
    )
    chunk_table: str = setting(
        "haystack_documents",
        env="OSA_MEMORY_CHUNK_TABLE",
        doc="The pgvector-haystack chunk table (shared with your customer documents).",
    )
    governing_table: str = setting("org_documents", env="OSA_MEMORY_GOVERNING_TABLE", doc="The governing rows table.")
    memory_schema: str = setting(
        "osa_memory",
        env="OSA_MEMORY_SCHEMA",
        doc="Private tables: tokens, feedback, reads, audit, switches, schema version.",
    )
    embedding_dimension: int = setting(
        384,
        env="OSA_MEMORY_EMBEDDING_DIM",
        ge=1,
        le=16000,
        doc="Dimension of the chunk table's `embedding` column; must match an existing table.",
    )
    language: str = setting(
        "english",
        env="OSA_MEMORY_LANGUAGE",
        doc="PostgreSQL text-search configuration for BM25 (`simple`, `german`, ...).",
    )
    embedder: EmbedderChoice = setting(
        "auto",
        env="OSA_MEMORY_EMBEDDER",
        doc="`auto` (MiniLM when the `embeddings` extra is installed, else lexical), `minilm`, or `none`. Any "
        "other Haystack embedder: edit the served YAML pipelines (below), or pass it to "
        "`Memory(document_embedder=..., text_embedder=...)`. Under `serve`, `none` (and `auto` without the "
        "extra) removes the YAML's `embed` component.",
    )
    embedder_timeout: float = setting(
        5.0,
        env="OSA_MEMORY_EMBEDDER_TIMEOUT",
        gt=0,
        le=120,
        doc="Seconds a query embedding may take; then recall answers lexically and says `degraded`.",
    )
    query_precision: Precision = setting(
        "int8",
        env="OSA_MEMORY_QUERY_PRECISION",
        doc="How the MiniLM model embeds recall queries: `int8` (int8 linear layers: about a quarter of the "
        "float32 time, LoCoMo recall unchanged, see `docs/traps.md`), `int8-cls` (int8 with the first token's "
        "activations quantized apart: closer to float32, a little more CPU), `mixed` (int8 but the feed-forward "
        "outputs), `float16` (float16 weights) or `float32` (the sentence-transformers vector). Stored facts "
        "follow `OSA_MEMORY_DOCUMENT_PRECISION`. Under `serve` the YAML pipeline's `precision` applies.",
    )
    document_precision: Precision = setting(
        "int8-cls",
        env="OSA_MEMORY_DOCUMENT_PRECISION",
        doc="How the MiniLM model embeds stored facts (store, import, reflect's observations): `int8-cls` (every "
        "linear layer in int8, the first token's activations quantized apart from the other tokens', whose scale "
        "its outliers would otherwise set: on ONNX Runtime ~0.7x the CPU of `mixed` and closer to float32, see "
        "`docs/traps.md`), `mixed` (int8 linear layers but each layer's feed-forward output: on ONNX Runtime 0.55x "
        "the CPU of float32 with LoCoMo within 0.005 of float32 facts), `float32` (the sentence-transformers "
        "vector), `float16` (torch: float16 weights, float32 arithmetic, the float32 vector within ~1e-4 at about "
        "two thirds of its CPU; ONNX Runtime runs it as float32) or `int8` (every linear layer, one activation "
        "scale per pass: about a third of float32's CPU, but LoCoMo R@1 and MRR fall by ~0.009). The quantized ones "
        "embed one fact per forward pass, so that its vector depends only on its text; float32 concurrent stores "
        "share batched passes. See "
        "`benchmarks/README.md`. Facts stored before a change keep their vectors. Also bound into the served "
        "store YAML's MiniLM document embedder (its `precision`).",
    )
    embedder_runtime: Runtime = setting(
        "onnx",
        env="OSA_MEMORY_EMBEDDER_RUNTIME",
        doc="What runs the MiniLM model's forward pass: `onnx` (ONNX Runtime; the model is exported from torch when "
        "it loads, once per model and version, in a child process, and cached under `$XDG_CACHE_HOME/osa-memory`: "
        "int8 queries at about 0.75 of torch's CPU and closer to float32, `mixed` facts at about 0.56 of torch's "
        "float16 CPU, float32 ones at its CPU, and ~300 MB less memory per `serve`) or `torch` (TorchScript). Bound "
        'into the served YAML\'s MiniLM embedders (their `runtime`). See `benchmarks/README.md`, "ONNX Runtime".',
    )
    dataset: str = setting(
        "osa-memory", env="OSA_MEMORY_DATASET", doc="Dataset of fact documents (part of the document id)."
    )
    admitted_statuses: tuple[str, ...] = setting(
        ("approved",), env=None, doc="Statuses recall and the access filter admit"
    )
    statement_timeout_ms: int = setting(
        15000,
        env="OSA_MEMORY_STATEMENT_TIMEOUT_MS",
        ge=100,
        le=600000,
        doc="Per-statement timeout: database trouble is an error, not a hang.",
    )
    prepared_statements: bool = setting(
        True,
        env="OSA_MEMORY_PREPARED_STATEMENTS",
        doc="Prepare each statement on a connection's second run of it, planned afresh for every run "
        "(`plan_cache_mode = force_custom_plan`, never a generic plan): ~20% less PostgreSQL CPU per call. "
        "`false` behind a pooler that cannot keep named prepared statements (PgBouncer in transaction mode "
        "before 1.21, or without `max_prepared_statements`).",
    )
    pool_timeout: float = setting(
        5.0,
        env="OSA_MEMORY_POOL_TIMEOUT",
        gt=0,
        le=120,
        doc="Seconds to wait for a database connection before answering that the database is unreachable.",
    )
    enabled: bool = setting(
        True,
        env="OSA_MEMORY_ENABLED",
        doc="Server-level kill switch: `false` makes every tool answer `Memory is off for this assignment`.",
    )
    trust_floor: float = setting(
        0.3,
        env="OSA_MEMORY_TRUST_FLOOR",
        ge=0,
        le=1,
        doc="A flag that takes trust below this turns the fact `flagged` (not recalled).",
    )
    suggest_supersedes: bool = setting(
        True,
        env="OSA_MEMORY_SUGGEST_SUPERSEDES",
        doc="`kb_memory_store` looks for facts the new one probably replaces and returns them as "
        "`possibly_supersedes` (one extra scoped search per store).",
    )
    buffer_path: Path | None = setting(
        env="OSA_MEMORY_BUFFER",
        shown="`<data dir>/offline-buffer.jsonl`",
        doc="Durable buffer of facts stored while the database is unreachable.",
    )
    offline_grace: float = setting(
        900.0,
        env="OSA_MEMORY_OFFLINE_GRACE",
        ge=0,
        le=86400,
        doc="Seconds a token verified before an outage keeps working while the database is unreachable "
        "(revocations made during the outage apply when it ends). Per worker process: with `serve --workers "
        "N`, a request during an outage that reaches a worker which never verified its token is refused (503).",
    )
    call_slots: int = setting(
        2,
        env="OSA_MEMORY_CALL_SLOTS",
        ge=0,
        le=1024,
        doc="Calls each `serve` process runs in worker threads at once (their token check and tool run); the rest "
        "wait their turn on the event loop. Threads beyond a couple only take turns at the interpreter lock, "
        "at a cost per call. `0`: no limit (anyio's 40 threads). See `OSA_MEMORY_CALL_LEASE` and "
        'benchmarks/README.md, "Call slots".',
    )
    call_lease: float = setting(
        0.05,
        env="OSA_MEMORY_CALL_LEASE",
        gt=0,
        le=60,
        doc="Seconds a call holds its slot (`OSA_MEMORY_CALL_SLOTS`): a call still running after this gives its "
        "slot to the next and runs on beside it, so a slow call delays the others by at most this.",
    )
    redaction_off: tuple[str, ...] = setting(
        (),
        env="OSA_MEMORY_REDACTION_OFF",
        doc="Comma-separated privacy-guard classes to switch off: `private_key`, `jwt`, `secret`, `password`, "
        "`user_path`, `private_ip`.",
    )
    scope_cache_facts: int = setting(
        50_000,
        env="OSA_MEMORY_SCOPE_CACHE_FACTS",
        ge=0,
        le=10_000_000,
        doc="Facts of big assignments (past 5,000 facts) each process holds in memory to rank them exactly "
        "(`store.scope_cache`): vectors, lengths and lexemes, ~2.2 kB per fact with 384-d vectors (~110 MB at "
        "the default, per `serve` worker). An assignment bigger than this takes the index path instead. Small "
        "assignments' rows are kept too, within at most 12,000 facts more (`store.scope_memo`). `0` holds none. "
        'See docs/operations.md, "Sizing".',
    )
    token: str | None = setting(
        env="OSA_MEMORY_TOKEN",
        repr=False,
        doc="The bearer token `osa-memory mcp-stdio` sends, and the variable `mcp-config` refers to.",
    )
    pipelines_dir: Path | None = setting(
        env="OSA_MEMORY_PIPELINES_DIR",
        shown="the shipped pipelines",
        doc="Set by `osa-memory serve` for its own worker processes, not for you to set: the pipelines folder "
        "they serve (`serve --pipelines-dir`).",
    )
    metrics_dir: Path | None = setting(
        env="OSA_MEMORY_METRICS_DIR",
        doc="Set by `osa-memory serve --metrics-port` for its own worker processes, not for you to set: the "
        "private folder of the workers' Prometheus samples (docs/operations.md).",
    )

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

    @field_validator("token", "console_pg_conn_str")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return (value or "").strip() or None

    @field_validator("pg_shared_buffers")
    @classmethod
    def _shared_buffers(cls, value: str | None) -> str | None:
        import re

        value = (value or "").strip() or None
        if value is not None and not re.match(_SHARED_BUFFERS_PATTERN, value):
            msg = f"OSA_MEMORY_PG_SHARED_BUFFERS must be a size such as 512MB or 2GB (kB, MB or GB), got {value!r}"
            raise ValueError(msg)
        return value

    @property
    def offline_buffer_path(self) -> Path:
        """Where facts wait while the database is unreachable (default: `<data_dir>/offline-buffer.jsonl`)."""
        return self.buffer_path or self.data_dir / "offline-buffer.jsonl"

    @property
    def enabled_redaction_classes(self) -> list[str]:
        """The built-in redaction classes this configuration applies: all but `redaction_off`."""
        return enabled_redaction_classes(self.redaction_off)

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
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> MemoryConfig:
        """Build the settings from environment variables (empty values count as unset) and overrides.

        The one reader of the environment (`haystack_osa_memory.settings.load_config`); ``environ`` replaces
        the process environment.

        :raises ConfigurationError: a value is not allowed (the message names its variable).
        """
        from haystack_osa_memory.settings import load_config

        return load_config(environ, overrides)


def variable_of(field: FieldInfo) -> str | None:
    """The environment variable that sets a `MemoryConfig` field, if any."""
    extra = field.json_schema_extra
    value = extra.get(ENV_KEY) if isinstance(extra, dict) else None
    return value if isinstance(value, str) else None


#: Environment variable -> setting name, for every `MemoryConfig` field an environment variable sets.
ENVIRONMENT: dict[str, str] = {
    variable: name for name, field in MemoryConfig.model_fields.items() if (variable := variable_of(field)) is not None
}
