"""`MemoryStore`: the one object that owns the connection, the schema names and the SQL repositories.

Like pgvector-haystack's ``PgvectorDocumentStore``, components take a store (``store=``), nest its
``to_dict()`` in their own and call its repositories; only the store touches the connection. Its
settings come from the constructor, never from the environment: the connection string is a
``Secret`` (``PG_CONN_STR`` by default), resolved on first use.

A store built from a `MemoryConfig` whose connection string was given in code (or is the embedded
database's URI, which is never exported to the environment) holds it as a `ConnectionSecret`: used in
this process, serialised as the environment variable `CONNECTION_ENV`. A saved pipeline never holds the
value; whoever loads it sets ``PG_CONN_STR`` to the database it should reach.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from haystack import default_from_dict, default_to_dict
from haystack.utils import Secret, deserialize_secrets_inplace
from haystack.utils.auth import EnvVarSecret

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import ConfigurationError
from haystack_osa_memory.store.facts import FactRepository
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.store.tokens import TokenStore

#: The environment variable a serialised store names for its connection string.
CONNECTION_ENV = "PG_CONN_STR"


@dataclass(frozen=True)
class ConnectionSecret(EnvVarSecret):
    """A connection string given in code: this process uses it; serialised, it is the environment variable
    it should be read from elsewhere (never the value, as with any environment-variable secret).

    A pipeline loaded from what it wrote is an ordinary environment-variable secret.
    """

    _value: str = field(default="", repr=False)

    def resolve_value(self) -> str:
        return self._value

    def _to_dict(self) -> dict[str, Any]:
        # Fail closed: a saved pipeline would reach the database the variable names, not this one.
        named = [os.environ[name] for name in self._env_vars if os.environ.get(name)]
        if named and named[0] != self._value:
            names = " or ".join(self._env_vars)
            msg = (
                f"this connection string was given in code but {names} names another database, so a saved "
                f"pipeline would reach that one: set {names} to the same database, or give the store "
                "connection_string=Secret.from_env_var(NAME) naming a variable that holds it"
            )
            raise ConfigurationError(msg)
        return super()._to_dict()


#: The `MemoryConfig` fields a store carries (what reaching the knowledge base needs).
STORE_FIELDS = (
    "kb_schema",
    "governing_table",
    "chunk_table",
    "memory_schema",
    "embedding_dimension",
    "language",
    "statement_timeout_ms",
    "pool_timeout",
    "admitted_statuses",
    "redaction_off",
    "scope_cache_facts",
)

#: The defaults of those fields: `MemoryConfig`'s own.
_DEFAULTS: dict[str, Any] = {name: MemoryConfig.model_fields[name].get_default() for name in STORE_FIELDS}


class MemoryStore:
    """The knowledge base memory lives in: connection, table names, timeouts, and the SQL on them.

    Usage:
    ```python
    from haystack.utils import Secret
    from haystack_osa_memory import MemoryStore, ScopedMemoryRetriever

    store = MemoryStore(connection_string=Secret.from_env_var("PG_CONN_STR"), chunk_table="kb_chunks")
    retriever = ScopedMemoryRetriever(store=store, top_k=8)
    ```
    """

    def __init__(
        self,
        *,
        connection_string: Secret = Secret.from_env_var(CONNECTION_ENV),
        kb_schema: str = _DEFAULTS["kb_schema"],
        governing_table: str = _DEFAULTS["governing_table"],
        chunk_table: str = _DEFAULTS["chunk_table"],
        memory_schema: str = _DEFAULTS["memory_schema"],
        embedding_dimension: int = _DEFAULTS["embedding_dimension"],
        language: str = _DEFAULTS["language"],
        statement_timeout_ms: int = _DEFAULTS["statement_timeout_ms"],
        pool_timeout: float = _DEFAULTS["pool_timeout"],
        admitted_statuses: list[str] | None = None,
        redaction_off: list[str] | None = None,
        scope_cache_facts: int = _DEFAULTS["scope_cache_facts"],
    ) -> None:
        """
        :param connection_string: PostgreSQL connection string (a secret, resolved on first use).
        :param kb_schema: Schema of the knowledge-base tables (chunks, governing rows, `osa_fact_terms`).
        :param governing_table: The governing table (one row per knowledge-base document).
        :param chunk_table: The chunk table (pgvector-haystack's layout).
        :param memory_schema: Schema of memory's own tables (tokens, audit, feedback, switches).
        :param embedding_dimension: Dimension of the chunk table's `embedding` column.
        :param language: PostgreSQL text-search configuration of the lexical ranking.
        :param statement_timeout_ms: Longest a statement may run.
        :param pool_timeout: Longest to wait for a pooled connection, in seconds.
        :param admitted_statuses: Statuses recall and the ACL admit (default `["approved"]`).
        :param redaction_off: Redaction classes left alone in the free text the store writes (reasons,
            notes); default none.
        :param scope_cache_facts: Facts of big assignments held in memory per process, ranked exactly from
            there (`haystack_osa_memory.store.scope_cache`); 0 holds none.
        :raises ConfigurationError: a name or value is not allowed (checked here, not at first query).
        """
        self.connection_string = connection_string
        self.kb_schema = kb_schema
        self.governing_table = governing_table
        self.chunk_table = chunk_table
        self.memory_schema = memory_schema
        self.embedding_dimension = embedding_dimension
        self.language = language
        self.statement_timeout_ms = statement_timeout_ms
        self.pool_timeout = pool_timeout
        self.admitted_statuses = list(
            admitted_statuses if admitted_statuses is not None else _DEFAULTS["admitted_statuses"]
        )
        self.redaction_off = list(redaction_off or _DEFAULTS["redaction_off"])
        self.scope_cache_facts = scope_cache_facts
        try:
            self.config = MemoryConfig(**{name: getattr(self, name) for name in STORE_FIELDS})
        except ValueError as e:
            msg = f"invalid MemoryStore settings: {e}"
            raise ConfigurationError(msg) from None

    @classmethod
    def from_config(cls, config: MemoryConfig, connection_string: Secret | None = None) -> MemoryStore:
        """The store of a `MemoryConfig`.

        Without ``connection_string`` the store connects to ``config.pg_conn_str`` when it is set (the
        team's database, or the embedded one's URI: a `ConnectionSecret` serialised as `CONNECTION_ENV`);
        otherwise it reads that variable on first use.
        """
        values: dict[str, Any] = {name: getattr(config, name) for name in STORE_FIELDS}
        values["admitted_statuses"], values["redaction_off"] = (
            list(config.admitted_statuses),
            list(config.redaction_off),
        )
        if connection_string is None:
            connection_string = (
                ConnectionSecret(_env_vars=(CONNECTION_ENV,), _value=config.pg_conn_str)
                if config.pg_conn_str
                else Secret.from_env_var(CONNECTION_ENV)
            )
        return cls(connection_string=connection_string, **values)

    @property
    def conn_str(self) -> str:
        """The resolved connection string.

        :raises ConfigurationError: the secret resolves to nothing.
        """
        value = self._resolved()
        if not value:
            names = list(getattr(self.connection_string, "_env_vars", ())) or [CONNECTION_ENV]
            msg = (
                f"no database connection string: set {' or '.join(names)} to the database's URI (for the "
                "embedded database, the URI `haystack_osa_memory.store.database.start_embedded` returns), "
                "or let `osa-memory` start the embedded default"
            )
            raise ConfigurationError(msg)
        return str(value)

    def _resolved(self) -> str | None:
        """What ``connection_string`` resolves to now (``None`` when its variable is unset)."""
        try:
            value = self.connection_string.resolve_value()
        except ValueError:  # a strict environment-variable secret whose variable is unset
            return None
        return str(value) if value else None

    @cached_property
    def facts(self) -> FactRepository:
        """Governing rows and chunks: atomic writes, scoped reads, ACL lookups."""
        return FactRepository(self.conn_str, self.config)

    @cached_property
    def lifecycle(self) -> LifecycleRepository:
        """Reads, feedback, review, forget, kill switches, audit."""
        return LifecycleRepository(self.conn_str, self.config)

    @cached_property
    def tokens(self) -> TokenStore:
        """Bearer tokens."""
        return TokenStore(self.conn_str, self.config)

    def to_dict(self) -> dict[str, Any]:
        """Serialise (the connection string as its secret's reference, never its value).

        :raises ConfigurationError: the store connects to a database given in code while its variable names
            another one (`ConnectionSecret`).
        """
        return default_to_dict(
            self,
            connection_string=self.connection_string.to_dict(),
            **{name: getattr(self, name) for name in STORE_FIELDS},
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryStore:
        """Deserialise what :meth:`to_dict` wrote."""
        deserialize_secrets_inplace(data["init_parameters"], keys=["connection_string"])
        return default_from_dict(cls, data)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, MemoryStore)
            and self.connection_string == other.connection_string
            and all(getattr(self, name) == getattr(other, name) for name in STORE_FIELDS)
        )

    __hash__ = None  # type: ignore[assignment]
