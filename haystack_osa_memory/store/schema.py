"""`osa-memory init` and the schema checks every other start runs: apply the migrations
(`haystack_osa_memory.store.migrations`, statements in `haystack_osa_memory.store.ddl`) above the database's
version, turn row-level security on or off and grant the roles' rights
(`haystack_osa_memory.store.row_security`); or check, without changing anything, that the database is at
this package's version. Idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import DatabaseError, SchemaError
from haystack_osa_memory.store.database import connection_kwargs, note_row_level_security

# Names other modules, tests and notebooks import from here (they lived in this module before).
from haystack_osa_memory.store.ddl import CREATE_GOVERNING_TABLE as CREATE_GOVERNING_TABLE
from haystack_osa_memory.store.migrations import MIGRATIONS as MIGRATIONS
from haystack_osa_memory.store.migrations import REPAIR_TRIGGERS as REPAIR_TRIGGERS
from haystack_osa_memory.store.migrations import SCHEMA_VERSION as SCHEMA_VERSION
from haystack_osa_memory.store.row_security import CONSOLE_GRANTS as CONSOLE_GRANTS
from haystack_osa_memory.store.row_security import GRANTS as GRANTS
from haystack_osa_memory.store.row_security import RLS_ENABLED as RLS_ENABLED
from haystack_osa_memory.store.row_security import RLS_STEPS as RLS_STEPS
from haystack_osa_memory.store.row_security import SCOPE_ASSIGNMENT as SCOPE_ASSIGNMENT
from haystack_osa_memory.store.row_security import SCOPE_ORG as SCOPE_ORG
from haystack_osa_memory.store.row_security import console_steps as console_steps
from haystack_osa_memory.store.row_security import grant_steps as grant_steps
from haystack_osa_memory.store.row_security import rls_off_steps as rls_off_steps
from haystack_osa_memory.store.steps import ACCESS_EXCLUSIVE as ACCESS_EXCLUSIVE
from haystack_osa_memory.store.steps import ACCESS_EXCLUSIVE_IF_PRESENT as ACCESS_EXCLUSIVE_IF_PRESENT
from haystack_osa_memory.store.steps import NEW_TABLE as NEW_TABLE
from haystack_osa_memory.store.steps import NO_TABLE_LOCK as NO_TABLE_LOCK
from haystack_osa_memory.store.steps import ROW_EXCLUSIVE as ROW_EXCLUSIVE
from haystack_osa_memory.store.steps import SHARE_ROW_EXCLUSIVE as SHARE_ROW_EXCLUSIVE
from haystack_osa_memory.store.steps import SHARE_UPDATE_EXCLUSIVE as SHARE_UPDATE_EXCLUSIVE
from haystack_osa_memory.store.steps import Migration as Migration
from haystack_osa_memory.store.steps import Names as Names
from haystack_osa_memory.store.steps import Statement as Statement
from haystack_osa_memory.store.steps import Step as Step
from haystack_osa_memory.store.steps import gov_table

# Their earlier, private names.
_grant_steps = grant_steps
_console_steps = console_steps
_rls_off_steps = rls_off_steps

VECTOR_SCHEMA = sql.SQL(
    "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
)
TERMS_TRIGGERS_PRESENT = sql.SQL(
    """SELECT count(*) = 2 FROM pg_trigger
    WHERE tgrelid = to_regclass(%s) AND tgname IN ('osa_fact_terms_invalidate', 'osa_fact_terms_truncate')"""
)
READ_VERSION = sql.SQL("SELECT max(version) FROM {schema}.schema_version")
WRITE_VERSION = sql.SQL("INSERT INTO {schema}.schema_version (version, applied_at) VALUES (%s, now())")
EMBEDDING_DIMENSION = sql.SQL(
    """SELECT a.atttypmod FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s AND a.attname = 'embedding' AND NOT a.attisdropped"""
)
TABLE_EXISTS = sql.SQL("SELECT to_regclass(%s) IS NOT NULL")
ANALYZE = sql.SQL("ANALYZE {schema}.{table}")
# Serialise concurrent `init` runs: a session lock held for the whole run (the indexes built
# CONCURRENTLY run outside any transaction).
INIT_LOCK_KEY = sql.SQL("hashtext('osa-memory-init')")
INIT_SESSION_LOCK = sql.SQL("SELECT pg_advisory_lock({key})").format(key=INIT_LOCK_KEY)
INIT_SESSION_UNLOCK = sql.SQL("SELECT pg_advisory_unlock({key})").format(key=INIT_LOCK_KEY)
# `init` waits at most this long for a table lock, then fails: waiting longer would queue every query
# of the team's pipelines on that table behind ours (docs/operations.md).
SET_LOCK_TIMEOUT = sql.SQL("SET lock_timeout = {ms}")
DEFAULT_LOCK_TIMEOUT_MS = 5000

ANALYZE_GOVERNING = Step(lambda n: ANALYZE.format(schema=n.kb, table=n.gov), gov_table, SHARE_UPDATE_EXCLUSIVE)


@dataclass(frozen=True)
class PlannedStep:
    """One statement `init` runs (or would run, with ``--dry-run``)."""

    version: int | None
    purpose: str
    statement: str
    table: str | None
    team_table: bool
    lock: str
    conditional: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "purpose": self.purpose,
            "statement": self.statement,
            "table": self.table,
            "team_table": self.team_table,
            "lock": self.lock,
            "conditional": self.conditional,
        }


@dataclass
class InitReport:
    """What :func:`ensure_schema` did (or, as a dry run, would do)."""

    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    version_before: int | None = None
    version_after: int = SCHEMA_VERSION
    applied: list[int] = field(default_factory=list)
    steps: list[PlannedStep] = field(default_factory=list)
    row_level_security: bool = False
    runtime_role: str | None = None
    console_role: str | None = None
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "existing": self.existing,
            "version_before": self.version_before,
            "version_after": self.version_after,
            "applied": self.applied,
            "row_level_security": self.row_level_security,
            "runtime_role": self.runtime_role,
            "console_role": self.console_role,
            "dry_run": self.dry_run,
            "steps": [s.as_dict() for s in self.steps],
        }


@dataclass(frozen=True)
class SchemaState:
    """What :func:`check_schema` found: the version and whether facts are under row-level security."""

    version: int
    row_level_security: bool


def _exists(conn: psycopg.Connection[Any], schema: str, table: str) -> bool:
    row = conn.execute(TABLE_EXISTS, (f'"{schema}"."{table}"',)).fetchone()
    return bool(row and row[0])


def _tables(config: MemoryConfig) -> dict[str, tuple[str, str]]:
    return {
        f"{config.kb_schema}.{config.chunk_table}": (config.kb_schema, config.chunk_table),
        f"{config.kb_schema}.{config.governing_table}": (config.kb_schema, config.governing_table),
        f"{config.memory_schema}.tokens": (config.memory_schema, "tokens"),
        f"{config.memory_schema}.schema_version": (config.memory_schema, "schema_version"),
        f"{config.memory_schema}.feedback": (config.memory_schema, "feedback"),
        f"{config.memory_schema}.reads": (config.memory_schema, "reads"),
        f"{config.memory_schema}.audit": (config.memory_schema, "audit"),
        f"{config.memory_schema}.switches": (config.memory_schema, "switches"),
        f"{config.kb_schema}.osa_fact_terms": (config.kb_schema, "osa_fact_terms"),
        f"{config.memory_schema}.console_sessions": (config.memory_schema, "console_sessions"),
    }


def _read_version(conn: psycopg.Connection[Any], config: MemoryConfig) -> int | None:
    if not _exists(conn, config.memory_schema, "schema_version"):
        return None
    row = conn.execute(READ_VERSION.format(schema=sql.Identifier(config.memory_schema))).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def _check_dimension(conn: psycopg.Connection[Any], config: MemoryConfig) -> None:
    if not _exists(conn, config.kb_schema, config.chunk_table):
        return
    row = conn.execute(EMBEDDING_DIMENSION, (config.kb_schema, config.chunk_table)).fetchone()
    if row is not None and row[0] not in (-1, config.embedding_dimension):
        msg = (
            f"chunk table {config.kb_schema}.{config.chunk_table} stores {row[0]}-dimensional embeddings "
            f"but OSA_MEMORY_EMBEDDING_DIM is {config.embedding_dimension}; set it to {row[0]} "
            "or use another OSA_MEMORY_CHUNK_TABLE"
        )
        raise SchemaError(msg)


def _names(conn: psycopg.Connection[Any], config: MemoryConfig) -> Names:
    row = conn.execute(VECTOR_SCHEMA).fetchone()
    return Names.of(config, row[0] if row else "public")


def _triggers_present(conn: psycopg.Connection[Any], config: MemoryConfig) -> bool:
    row = conn.execute(TERMS_TRIGGERS_PRESENT, (f'"{config.kb_schema}"."{config.chunk_table}"',)).fetchone()
    return bool(row and row[0])


def _rls_on(conn: psycopg.Connection[Any], config: MemoryConfig) -> bool:
    row = conn.execute(RLS_ENABLED, (f'"{config.kb_schema}"."{config.governing_table}"',)).fetchone()
    return bool(row and row[0])


def _plan(
    conn: psycopg.Connection[Any], n: Names, version: int | None, purpose: str, steps: tuple[Step, ...]
) -> list[PlannedStep]:
    team = n.team_tables()
    planned = []
    for step in steps:
        table = step.table(n)
        planned.append(
            PlannedStep(
                version=version,
                purpose=purpose,
                statement=step.build(n).as_string(conn),
                table=table,
                team_table=table in team,
                lock=step.lock,
                conditional=step.when is not None,
            )
        )
    return planned


def ensure_schema(
    conn_str: str,
    config: MemoryConfig,
    *,
    dry_run: bool = False,
    row_level_security: bool | None = None,
    runtime_role: str | None = None,
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
    target_version: int = SCHEMA_VERSION,
    console_role: str | None = None,
) -> InitReport:
    """`osa-memory init`: apply the migrations above the database's version, in order, each in its own
    transaction, under an advisory lock (two `init` at once run one after the other).

    :param dry_run: Only report the statements it would run (``report.steps``): nothing is executed
        beyond catalog reads.
    :param row_level_security: True: turn on row-level security for facts (`RLS_STEPS`); False: turn it
        off; None: leave it as it is.
    :param runtime_role: Grant this existing role the row rights `serve` needs (`GRANTS`), nothing more.
    :param console_role: Grant this existing role what `osa-memory console` needs (`CONSOLE_GRANTS`), and,
        with row-level security on, the policies that show it one org's facts at a time.
    :param lock_timeout_ms: Give up on a table lock after this long rather than queue the team's
        queries behind us.
    :param target_version: Stop after this version (tests of upgrades from earlier versions).
    Raises:
        SchemaError: the chunk table's embedding dimension differs from the configured one, or the
            database's schema is newer than this package.
        DatabaseError: a statement failed (for example on ``lock_timeout``); what committed before stays.
    """
    report = InitReport(dry_run=dry_run, runtime_role=runtime_role, console_role=console_role)
    try:
        with psycopg.connect(conn_str, **connection_kwargs(config, prepared=False)) as conn:
            conn.execute(SET_LOCK_TIMEOUT.format(ms=sql.Literal(int(lock_timeout_ms))))
            if not dry_run:
                conn.execute(INIT_SESSION_LOCK)
            # Until the next check, sessions set their scope again (row-level security may now be on).
            note_row_level_security(conn_str, config.kb_schema, True)
            try:
                _run_init(conn, config, report, row_level_security, runtime_role, target_version, console_role)
            finally:
                if not dry_run and not conn.closed:
                    conn.execute(INIT_SESSION_UNLOCK)
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = f"init stopped: {type(e).__name__}: {first}"
        if isinstance(e, psycopg.errors.LockNotAvailable):
            msg += (
                f" (another transaction held a lock for more than {lock_timeout_ms} ms; nothing of this step "
                "was applied: retry when it is done, or raise --lock-timeout)"
            )
        raise DatabaseError(msg) from e
    return report


def _run_init(
    conn: psycopg.Connection[Any],
    config: MemoryConfig,
    report: InitReport,
    row_level_security: bool | None,
    runtime_role: str | None,
    target_version: int,
    console_role: str | None = None,
) -> None:
    dry_run = report.dry_run
    _check_dimension(conn, config)
    for label, (schema, table) in _tables(config).items():
        (report.existing if _exists(conn, schema, table) else report.created).append(label)
    version = _read_version(conn, config)
    report.version_before = version
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaError(_ahead(version))
    for migration in MIGRATIONS:
        if (version is not None and migration.version <= version) or migration.version > target_version:
            continue
        n = _names(conn, config)
        report.steps += _plan(conn, n, migration.version, migration.description, migration.steps)
        if dry_run:
            continue
        with conn.transaction():
            for step in migration.steps:
                if step.in_transaction and (step.when is None or step.when(conn, n)):
                    conn.execute(step.build(n))
        for step in migration.steps:
            if not step.in_transaction:
                conn.execute(step.build(n))
        with conn.transaction():
            conn.execute(WRITE_VERSION.format(schema=n.mem), (migration.version,))
        report.applied.append(migration.version)
    extra: list[tuple[str, tuple[Step, ...]]] = []
    if version is not None and version >= 7 and not _triggers_present(conn, config):
        extra.append(("put back the chunk-table triggers that keep osa_fact_terms true", REPAIR_TRIGGERS))
    if row_level_security is True and not (
        _exists(conn, config.kb_schema, config.governing_table) and _rls_on(conn, config)
    ):
        extra.append(("row-level security: facts visible only inside their scope", RLS_STEPS))
    if (
        row_level_security is False
        and _exists(conn, config.kb_schema, config.governing_table)
        and _rls_on(conn, config)
    ):
        extra.append(("row-level security off", rls_off_steps()))
    if runtime_role is not None:
        extra.append((f"rights of the runtime role {runtime_role} (rows only, no DDL)", grant_steps(runtime_role)))
    if console_role is not None:
        has_gov = _exists(conn, config.kb_schema, config.governing_table)
        rls_after = row_level_security is True or (row_level_security is None and has_gov and _rls_on(conn, config))
        extra.append(
            (
                f"rights of the console role {console_role} (review, switches, audit, tokens; no DDL)",
                console_steps(console_role, policies=rls_after),
            )
        )
    n = _names(conn, config)
    for purpose, steps in extra:
        report.steps += _plan(conn, n, None, purpose, steps)
        if not dry_run:
            with conn.transaction():
                for step in steps:
                    conn.execute(step.build(n))
    # Statistics on the scope expression make the planner pick the btree (docs/traps.md); only after
    # a migration (or, in a dry run, when one is pending).
    if report.applied or (dry_run and any(s.version is not None for s in report.steps)):
        report.steps += _plan(conn, n, None, "statistics for the planner", (ANALYZE_GOVERNING,))
        if not dry_run:
            conn.execute(ANALYZE_GOVERNING.build(n))
    if not dry_run:
        report.version_after = max([version or 0, *report.applied])
        report.row_level_security = _exists(conn, config.kb_schema, config.governing_table) and _rls_on(conn, config)
    else:
        pending = any(step.version is not None for step in report.steps)
        report.version_after = SCHEMA_VERSION if pending else (version or 0)
        report.row_level_security = bool(version) and _rls_on(conn, config)


def _ahead(version: int) -> str:
    return (
        f"the database's memory schema is version {version}, newer than this osa-memory ({SCHEMA_VERSION}): "
        "upgrade osa-memory before serving (an older server must not run on a newer schema)"
    )


INIT_HINT = "run `osa-memory init` as the tables' owner (`osa-memory init --dry-run` prints what it will do)"


def check_schema(conn_str: str, config: MemoryConfig) -> SchemaState:
    """Check, without changing anything, that the database's schema is the one this package expects.

    Plain catalog and version reads: no DDL, no ANALYZE, no lock beyond a normal read. What `serve`,
    `Memory` and every command but `init` run at start.

    Raises:
        SchemaError: not initialised, behind (run `osa-memory init`), ahead (upgrade osa-memory), the
            chunk table's dimension differs, or the triggers that keep osa_fact_terms true are missing.
        DatabaseError: the database could not be read.
    """
    try:
        with psycopg.connect(conn_str, **connection_kwargs(config, prepared=False)) as conn:
            version = _read_version(conn, config)
            if version is None:
                msg = f"no osa-memory schema in this database ({config.memory_schema}.schema_version): {INIT_HINT}"
                raise SchemaError(msg)
            if version > SCHEMA_VERSION:
                raise SchemaError(_ahead(version))
            if version < SCHEMA_VERSION:
                msg = f"the memory schema is version {version}, this osa-memory needs {SCHEMA_VERSION}: {INIT_HINT}"
                raise SchemaError(msg)
            _check_dimension(conn, config)
            if not _triggers_present(conn, config):
                msg = (
                    f"the triggers that keep osa_fact_terms true are missing on {config.kb_schema}."
                    f"{config.chunk_table} (was the table recreated?): {INIT_HINT}"
                )
                raise SchemaError(msg)
            state = SchemaState(version, _rls_on(conn, config))
            note_row_level_security(conn_str, config.kb_schema, state.row_level_security)
            return state
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = f"could not read the memory schema: {type(e).__name__}: {first}"
        raise DatabaseError(msg) from e


def prepare_schema(conn_str: str, config: MemoryConfig) -> tuple[SchemaState, InitReport | None]:
    """What a server, `Memory` or a command runs at start: :func:`check_schema`, except on the embedded
    default database (no ``PG_CONN_STR``), which is ours alone: there a missing or older schema is
    brought up to date first (the report of that, else ``None``), so that a newcomer's first `Memory()`
    or `serve` just works."""
    report = None
    if config.pg_conn_str is None:
        try:
            return check_schema(conn_str, config), None
        except SchemaError:
            report = ensure_schema(conn_str, config)
    return check_schema(conn_str, config), report
