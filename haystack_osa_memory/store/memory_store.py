"""`MemoryStore`: the one object that owns the connection, the schema names and the SQL repositories.

Like pgvector-haystack's ``PgvectorDocumentStore``, components take a store (``store=``), nest its
``to_dict()`` in their own and call its repositories; only the store touches the connection. Its
settings come from the constructor, never from the environment: the connection string is a
``Secret`` (``PG_CONN_STR`` by default), resolved on first use.

A store built from a `MemoryConfig` whose connection string was given in code (or is the embedded
database's URI, which is never exported to the environment) holds it as a `ConnectionSecret`: used in
this process, serialised as the environment variable `CONNECTION_ENV`. A saved pipeline never holds the
value; whoever loads it sets ``PG_CONN_STR`` to the database it should reach.

The store owns its connection pool: it holds the pool from its first database use and lets go of it in
:meth:`MemoryStore.close` (or at the end of a ``with`` block); close a store when done with it.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from haystack import default_from_dict, default_to_dict
from haystack.utils import Secret, deserialize_secrets_inplace
from haystack.utils.auth import EnvVarSecret

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import ConfigurationError
from haystack_osa_memory.store import database
from haystack_osa_memory.store.facts import FactRepository
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.store.sizing import BufferFit, buffer_fit, count_facts
from haystack_osa_memory.store.tokens import ConsoleSessions, TokenStore

if TYPE_CHECKING:  # the schema module is imported when the check runs (start-up time)
    from datetime import timedelta

    import psycopg

    from haystack_osa_memory.store.schema import InitReport, SchemaState

R = TypeVar("R")

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
    "prepared_statements",
)

#: Guards each store's hold on its pool (taken once, released once).
_holding_lock = threading.Lock()

#: The defaults of those fields: `MemoryConfig`'s own.
_DEFAULTS: dict[str, Any] = {name: MemoryConfig.model_fields[name].get_default() for name in STORE_FIELDS}


#: The release from which the database components require ``store=``.
STORE_REQUIRED_FROM = "0.2.0"


def store_from_environment(component: str) -> MemoryStore:
    """The store a database component built without ``store=`` falls back to (`MemoryStore()`, reading
    ``PG_CONN_STR`` on first use), with a `DeprecationWarning` naming the new form.

    The warning points at the first caller outside this package and Haystack (the code that built the
    component or loaded the pipeline).
    """
    level, frame = 1, sys._getframe(0)
    while frame.f_back is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] in _INTERNAL:
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"{component} without store= is deprecated and stops loading in {STORE_REQUIRED_FROM}: pass "
        f"store=MemoryStore(...) ({component}(store=MemoryStore()) reads PG_CONN_STR as before; in YAML, "
        "a `store:` block of type haystack_osa_memory.store.memory_store.MemoryStore in its init_parameters)",
        DeprecationWarning,
        stacklevel=level,
    )
    return MemoryStore()


_INTERNAL = frozenset({"haystack_osa_memory", "haystack"})


class MemoryStore:
    """The knowledge base memory lives in: connection, table names, timeouts, and the SQL on them.

    Usage:
    ```python
    from haystack.utils import Secret
    from haystack_osa_memory import MemoryStore, ScopedMemoryRetriever

    store = MemoryStore(connection_string=Secret.from_env_var("PG_CONN_STR"), chunk_table="kb_chunks")
    retriever = ScopedMemoryRetriever(store=store, top_k=8)
    ...
    store.close()  # or: with MemoryStore(...) as store: ...
    ```

    The store is the one owner of its database connections: its repositories (`facts`, `lifecycle`,
    `tokens`, :meth:`console_sessions`, any other built by :meth:`repository`), :meth:`reading`,
    :meth:`transaction`, :meth:`count_facts`, :meth:`buffer_fit`, :meth:`check_schema`, :meth:`prepare_schema`
    and :meth:`probe` all act through it. Pools stay keyed by connection string and timeouts, as
    `haystack_osa_memory.store.database` keeps them, and are reference-counted: a store holds its pool
    from its first use until :meth:`close`, and the pool closes when the last store holding it does. Two
    stores on one database therefore share a pool, and closing one never cuts the other's connections
    (closing the pool under them would fail their operations in flight). A closed store may be used
    again: it then holds the pool anew.
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
        prepared_statements: bool = _DEFAULTS["prepared_statements"],
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
            there (`haystack_osa_memory.store.scope_cache`), and the bound of small assignments' rows kept
            (at most `scope_memo.MEMO_MAX_FACTS`); 0 holds none.
        :param prepared_statements: Prepare statements on the pool's connections (always planned for their own
            parameters); off behind a pooler that cannot keep named prepared statements.
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
        self.prepared_statements = prepared_statements
        try:
            self.config = MemoryConfig(**{name: getattr(self, name) for name in STORE_FIELDS})
        except ValueError as e:
            msg = f"invalid MemoryStore settings: {e}"
            raise ConfigurationError(msg) from None
        #: The connection string whose pool this store holds (`database.hold_pool`), or None.
        self._holding: str | None = None

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

    def _hold(self) -> str:
        """The resolved connection string, its pool held by this store from now until :meth:`close`."""
        conn_str = self.conn_str
        with _holding_lock:
            if self._holding is None:
                database.hold_pool(conn_str, self.config)
                self._holding = conn_str
            return self._holding

    @cached_property
    def facts(self) -> FactRepository:
        """Governing rows and chunks: atomic writes, scoped reads, ACL lookups."""
        return FactRepository(self._hold(), self.config)

    @cached_property
    def lifecycle(self) -> LifecycleRepository:
        """Reads, feedback, review, forget, kill switches, audit."""
        return LifecycleRepository(self._hold(), self.config)

    @cached_property
    def tokens(self) -> TokenStore:
        """Bearer tokens."""
        return TokenStore(self._hold(), self.config)

    def console_sessions(self, *, idle: timedelta, absolute: timedelta) -> ConsoleSessions:
        """The review console's server-side sessions (`ConsoleSessions`) on this store's pool."""
        return ConsoleSessions(self._hold(), self.config, idle=idle, absolute=absolute)

    def repository(self, factory: Callable[[str, MemoryConfig], R]) -> R:
        """A repository of a higher layer (``factory(conn_str, config)``, such as the console's
        ``ConsoleQueries``) on this store's pool, held from now until :meth:`close`."""
        return factory(self._hold(), self.config)

    @contextmanager
    def reading(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection of this store on which each statement commits on its own (reads only:
        `database.read`). Database failures become `DatabaseError`."""
        with database.read(self._hold(), self.config) as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection of this store inside one transaction (`database.transaction`). Database
        failures become `DatabaseError`."""
        with database.transaction(self._hold(), self.config) as conn:
            yield conn

    def count_facts(self) -> dict[str, int]:
        """Facts, assignments with facts, governing rows and chunks in the knowledge base (`sizing.count_facts`)."""
        return count_facts(self._hold(), self.config)

    def buffer_fit(self) -> BufferFit:
        """The recall rows beside the server's shared buffers (`sizing.buffer_fit`)."""
        return buffer_fit(self._hold(), self.config)

    def check_schema(self) -> SchemaState:
        """Check, changing nothing, that the database's schema is the one this package expects
        (`schema.check_schema`; a direct connection, not a pooled one, to see the real failure).

        :raises SchemaError: not initialised, behind, ahead, or not matching the store's settings.
        :raises DatabaseError: the database could not be read.
        """
        from haystack_osa_memory.store.schema import check_schema

        return check_schema(self.conn_str, self.config)

    def prepare_schema(self, *, embedded: bool = False) -> tuple[SchemaState, InitReport | None]:
        """What a server, `Memory` or a command runs at start (`schema.prepare_schema`): :meth:`check_schema`,
        except that on the embedded default database (``embedded``, ours alone) a missing or older schema is
        brought up to date first (the report of that, else ``None``).

        :raises SchemaError: not initialised, behind, ahead, or not matching the store's settings (on a
            database that is not the embedded one).
        :raises DatabaseError: the database could not be read.
        """
        from haystack_osa_memory.store.schema import prepare_schema

        conn_str = self.conn_str
        # `schema.prepare_schema` takes a config without a connection string for the embedded database.
        config = self.config.model_copy(update={"pg_conn_str": None if embedded else conn_str})
        return prepare_schema(conn_str, config)

    def probe(self, check_sql: Any = None, params: Any = None) -> tuple[str, str | None]:
        """Connect directly (not through the pool, to see the real reason) and run one query
        (`database.probe`): `ok`, `unreachable`, `unauthorised` or `erroring`, with the detail or None."""
        return database.probe(self.conn_str, self.config, check_sql, params)

    def close(self) -> None:
        """Let go of the connection pool (closed when no other store on the same database holds it) and
        of the repositories built on it. Idempotent; the store may be used again afterwards."""
        with _holding_lock:
            held, self._holding = self._holding, None
        for name in ("facts", "lifecycle", "tokens"):
            self.__dict__.pop(name, None)
        if held is not None:
            database.release_pool(held, self.config)

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

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
