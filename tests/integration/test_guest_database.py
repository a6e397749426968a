"""Living in a team's database: explicit ordered migrations (`init`, `--dry-run`), a start that only
checks the version, the runtime role's rights, and row-level security that holds even when our own
scope condition is broken."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.errors import DatabaseError, SchemaError
from haystack_osa_memory.store import schema
from haystack_osa_memory.store.database import close_pools, fact_scope, read
from haystack_osa_memory.store.facts import COMMON_LEXEMES, FactRepository
from haystack_osa_memory.store.schema import MIGRATIONS, SCHEMA_VERSION, check_schema, ensure_schema
from tests.conftest import Roles, drop_schema, new_schema_config

pytestmark = pytest.mark.integration

LOCK_MODES = {
    "ACCESS EXCLUSIVE": "AccessExclusiveLock",
    "SHARE ROW EXCLUSIVE": "ShareRowExclusiveLock",
    "SHARE UPDATE EXCLUSIVE": "ShareUpdateExclusiveLock",
    "SHARE": "ShareLock",
    "ROW EXCLUSIVE": "RowExclusiveLock",
}
STRENGTH = [
    "AccessShareLock",
    "RowShareLock",
    "RowExclusiveLock",
    "ShareUpdateExclusiveLock",
    "ShareLock",
    "ShareRowExclusiveLock",
    "ExclusiveLock",
    "AccessExclusiveLock",
]


@pytest.fixture
def fresh(pg_conn_str: str) -> Iterator[MemoryConfig]:
    """A configuration whose schema does not exist yet."""
    cfg = new_schema_config(pg_conn_str)
    yield cfg
    close_pools()
    drop_schema(pg_conn_str, cfg.kb_schema)


def _tables_in(pg_conn_str: str, name: str) -> list[str]:
    with psycopg.connect(pg_conn_str) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (name,)).fetchall()
    return [r[0] for r in rows]


def test_dry_run_prints_every_statement_with_its_lock_and_runs_none(pg_conn_str: str, fresh: MemoryConfig) -> None:
    plan = ensure_schema(pg_conn_str, fresh, dry_run=True)
    assert _tables_in(pg_conn_str, fresh.kb_schema) == []
    assert [s.version for s in plan.steps if s.version] == sorted(s.version for s in plan.steps if s.version)
    assert {s.version for s in plan.steps if s.version} == set(range(1, SCHEMA_VERSION + 1))
    team = {s.table for s in plan.steps if s.team_table}
    assert team == {f"{fresh.kb_schema}.{fresh.chunk_table}", f"{fresh.kb_schema}.{fresh.governing_table}"}
    assert all(s.lock for s in plan.steps)
    assert any("CREATE INDEX CONCURRENTLY" in s.statement for s in plan.steps if s.team_table)
    assert plan.version_before is None
    assert plan.version_after == SCHEMA_VERSION

    report = ensure_schema(pg_conn_str, fresh)
    assert report.applied == list(range(1, SCHEMA_VERSION + 1))
    assert "osa_fact_terms" in _tables_in(pg_conn_str, fresh.kb_schema)
    again = ensure_schema(pg_conn_str, fresh, dry_run=True)
    assert again.steps == []
    assert again.version_before == SCHEMA_VERSION
    assert ensure_schema(pg_conn_str, fresh).applied == []


def _strongest(conn: psycopg.Connection[Any], table: str) -> str | None:
    rows = conn.execute(
        "SELECT mode FROM pg_locks WHERE pid = pg_backend_pid() AND relation = to_regclass(%s)", (table,)
    ).fetchall()
    modes = [r[0] for r in rows]
    return max(modes, key=STRENGTH.index) if modes else None


def test_each_step_takes_the_lock_it_declares(pg_conn_str: str, fresh: MemoryConfig) -> None:
    """Every statement run inside a transaction, then the strongest lock it holds on its table read from
    pg_locks: what `init --dry-run` tells a DBA is what PostgreSQL takes."""
    steps = [step for m in MIGRATIONS for step in m.steps]
    steps += list(schema.RLS_STEPS)
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        role = f"rt_{fresh.kb_schema}"
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
        try:
            names = schema.Names.of(fresh)
            steps += list(schema._grant_steps(role))
            checked = 0
            for step in steps:
                if step.when is not None and not step.when(conn, names):
                    continue
                table = step.table(names)
                existed = bool(table and conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0])  # type: ignore[index]
                if not step.in_transaction:
                    assert step.lock == schema.SHARE_UPDATE_EXCLUSIVE  # CONCURRENTLY, documented
                    conn.execute(step.build(names))
                    continue
                with conn.transaction():
                    conn.execute(step.build(names))
                    held = _strongest(conn, table) if table else None
                if step.lock in (schema.NEW_TABLE,) and not existed:
                    continue
                if step.lock == schema.NO_TABLE_LOCK:
                    assert held in (None, "AccessShareLock"), (step.build(names).as_string(conn), held)
                    continue
                declared = next(mode for label, mode in LOCK_MODES.items() if step.lock.startswith(label + " "))
                allowed = {declared, None} if step.lock.endswith("else none") else {declared}
                assert held in allowed, (step.build(names).as_string(conn), held, declared)
                checked += 1
            assert checked >= 20
        finally:
            conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(sql.Identifier(role)))


def _catalog(pg_conn_str: str, name: str) -> dict[str, Any]:
    """Columns, indexes, triggers, policies and storage options of one schema, names made neutral."""
    with psycopg.connect(pg_conn_str) as conn:
        columns = conn.execute(
            """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attstorage, a.attidentity
            FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2""",
            (name,),
        ).fetchall()
        indexes = conn.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = %s ORDER BY 1", (name,)).fetchall()
        triggers = conn.execute(
            """SELECT t.tgname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal ORDER BY 1""",
            (name,),
        ).fetchall()
        options = conn.execute(
            """SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY 1""",
            (name,),
        ).fetchall()
    return {
        "columns": columns,
        "indexes": [r[0].replace(name, "S") for r in indexes],
        "triggers": triggers,
        "options": options,
    }


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_upgrade_from_each_earlier_version_reaches_the_fresh_schema(pg_conn_str: str, version: int) -> None:
    """A database left at ``version`` (its migrations applied, a fact stored where the tables allow it)
    upgrades to exactly the schema a fresh install has, and keeps working."""
    old, new = new_schema_config(pg_conn_str), new_schema_config(pg_conn_str)
    try:
        assert ensure_schema(pg_conn_str, old, target_version=version).applied == list(range(1, version + 1))
        with pytest.raises(SchemaError, match=rf"version {version}, this osa-memory needs {SCHEMA_VERSION}"):
            check_schema(pg_conn_str, old)
        report = ensure_schema(pg_conn_str, old)
        assert report.version_before == version
        assert report.applied == list(range(version + 1, SCHEMA_VERSION + 1))
        ensure_schema(pg_conn_str, new)
        assert _catalog(pg_conn_str, old.kb_schema) == _catalog(pg_conn_str, new.kb_schema)
        memory = Memory(old, use_default_embedders=False)
        me = Caller(org_id="acme", assignment_id="asg-up")
        memory.store("Upgraded databases keep storing facts", caller=me)
        assert memory.recall("upgraded databases", caller=me)["facts"][0]["content"].startswith("Upgraded")
    finally:
        close_pools()
        drop_schema(pg_conn_str, old.kb_schema)
        drop_schema(pg_conn_str, new.kb_schema)


def test_start_checks_the_version_and_changes_nothing(pg_conn_str: str, config: MemoryConfig) -> None:
    names = config.sql_names()
    me = Caller(org_id="acme", assignment_id="asg-check")
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {mem}.schema_version VALUES (%s, now())").format(**names), (SCHEMA_VERSION + 1,)
        )
        with pytest.raises(SchemaError, match="newer than this osa-memory"):
            Memory(config, use_default_embedders=False).warm_up()
        conn.execute(sql.SQL("DELETE FROM {mem}.schema_version").format(**names))
        conn.execute(sql.SQL("INSERT INTO {mem}.schema_version VALUES (6, now())").format(**names))
        with pytest.raises(SchemaError, match="run `osa-memory init`"):
            Memory(config, use_default_embedders=False).warm_up()
        conn.execute(sql.SQL("INSERT INTO {mem}.schema_version VALUES (%s, now())").format(**names), (SCHEMA_VERSION,))

    # Another session holds read locks on both team tables (a long report, a queue worker): starting,
    # storing and recalling must neither wait for it nor disturb it.
    with psycopg.connect(pg_conn_str) as other:
        other.execute(sql.SQL("LOCK TABLE {schema}.{gov} IN ACCESS SHARE MODE").format(**names))
        other.execute(sql.SQL("SELECT id FROM {schema}.{chunk} FOR SHARE").format(**names))
        memory = Memory(config.model_copy(update={"statement_timeout_ms": 3000}), use_default_embedders=False)
        memory.store("Reports lock nothing we need", caller=me)
        assert memory.recall("reports lock", caller=me)["facts"][0]["content"] == "Reports lock nothing we need"
        assert still_holds_its_lock(other, config)


def still_holds_its_lock(other: psycopg.Connection[Any], config: MemoryConfig) -> bool:
    """Whether ``other`` is still inside its transaction, holding its lock on the governing table."""
    held = other.execute(
        "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND relation = to_regclass(%s)",
        (f'"{config.kb_schema}"."{config.governing_table}"',),
    ).fetchone()
    return held == (1,) and other.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS


def fact_rows(uri: str, config: MemoryConfig) -> int:
    """Fact governing rows the role of ``uri`` can see."""
    with psycopg.connect(uri) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {schema}.{gov} WHERE source = 'agent_fact'").format(**config.sql_names())
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_init_gives_up_on_a_held_lock_instead_of_queueing_everyone(pg_conn_str: str, fresh: MemoryConfig) -> None:
    ensure_schema(pg_conn_str, fresh, target_version=4)
    names = fresh.sql_names()
    with psycopg.connect(pg_conn_str) as other:
        other.execute(sql.SQL("SELECT count(*) FROM {schema}.{gov}").format(**names))  # ACCESS SHARE, held
        with pytest.raises(DatabaseError, match="lock"):
            ensure_schema(pg_conn_str, fresh, lock_timeout_ms=300)
        other.rollback()
    assert ensure_schema(pg_conn_str, fresh).version_before == 4


# -- roles and row-level security --------------------------------------------------------------------


ALICE = Caller(org_id="acme", assignment_id="asg-alpha")
BOB = Caller(org_id="acme", assignment_id="asg-beta")
FACT = "The quarterly refund ledger lives in bucket ledger-q3"


def _as(roles: Roles, who: str, cfg: MemoryConfig) -> MemoryConfig:
    return cfg.model_copy(update={"pg_conn_str": roles.uri(who)})


def _customer_rows(roles: Roles, cfg: MemoryConfig) -> None:
    names = cfg.sql_names()
    with psycopg.connect(roles.uri("team"), autocommit=True) as conn:
        for i in range(3):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {schema}.{gov} (id, org_id, dataset, source, audience) "
                    "VALUES (%s, 'acme', 'kb', 'upload', 'customer')"
                ).format(**names),
                (f"cust-{i}",),
            )
            conn.execute(
                sql.SQL("INSERT INTO {schema}.{chunk} (id, content, meta) VALUES (%s, %s, %s)").format(**names),
                (
                    f"cust-{i}",
                    f"Customer guide {i}: the refund ledger is reviewed quarterly",
                    f'{{"document_id": "cust-{i}"}}',
                ),
            )


def _visible(uri: str, cfg: MemoryConfig) -> tuple[int, int, int]:
    names = cfg.sql_names()
    with psycopg.connect(uri) as conn:
        gov = conn.execute(sql.SQL("SELECT count(*) FROM {schema}.{gov}").format(**names)).fetchone()
        chunk = conn.execute(sql.SQL("SELECT count(*) FROM {schema}.{chunk}").format(**names)).fetchone()
        facts = conn.execute(
            sql.SQL("SELECT count(*) FROM {schema}.{chunk} WHERE content LIKE '%%ledger-q3%%'").format(**names)
        ).fetchone()
    assert gov
    assert chunk
    assert facts
    return gov[0], chunk[0], facts[0]


def test_runtime_role_serves_with_row_rights_only(team_db: tuple[Roles, MemoryConfig]) -> None:
    roles, cfg = team_db
    runtime = _as(roles, "runtime", cfg)
    memory = Memory(runtime, use_default_embedders=False)
    stored = memory.store(FACT, topic="billing", caller=ALICE)
    assert memory.recall("refund ledger bucket", caller=ALICE)["facts"][0]["document_id"] == stored["document_id"]
    assert memory.forget(stored["document_id"], "moved", caller=ALICE)["forgotten"] is True
    names = cfg.sql_names()
    with psycopg.connect(roles.uri("runtime"), autocommit=True) as conn:
        for ddl in (
            sql.SQL("CREATE TABLE {schema}.intruder (id int)"),
            sql.SQL("ALTER TABLE {schema}.{gov} ADD COLUMN intruder int"),
            sql.SQL("DROP TABLE {mem}.tokens"),
            sql.SQL("UPDATE {mem}.tokens SET revoked_at = NULL"),
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(ddl.format(**names))
    with pytest.raises(DatabaseError):
        ensure_schema(roles.uri("runtime"), cfg, row_level_security=True)


def _statistics_rows(uri: str, cfg: MemoryConfig) -> int:
    """Rows of `COMMON_LEXEMES` (PostgreSQL's statistics of the recall rows' lexeme keys) the role sees."""
    with psycopg.connect(uri, autocommit=True) as conn:
        return len(conn.execute(COMMON_LEXEMES, {"schema": cfg.kb_schema}).fetchall())


def test_row_level_security_hides_facts_from_everyone_without_the_scope(team_db: tuple[Roles, MemoryConfig]) -> None:
    roles, cfg = team_db
    _customer_rows(roles, cfg)
    memory = Memory(_as(roles, "runtime", cfg), use_default_embedders=False)
    memory.store(FACT, caller=ALICE)
    memory.store("Bob's deploy window is Tuesday, see ledger-q3 notes", caller=BOB)
    # Without RLS the team's role and the owner read our facts (what the issue reported).
    assert _visible(roles.uri("team"), cfg) == (5, 5, 2)
    assert _visible(roles.uri("owner"), cfg) == (5, 5, 2)

    with psycopg.connect(roles.uri("owner"), autocommit=True) as conn:
        conn.execute(sql.SQL("ANALYZE {schema}.osa_fact_terms").format(**cfg.sql_names()))
    assert _statistics_rows(roles.uri("runtime"), cfg) == 1

    report = ensure_schema(roles.uri("owner"), cfg, row_level_security=True)
    assert report.row_level_security
    assert check_schema(roles.admin, cfg).row_level_security
    close_pools()
    for who in ("team", "owner"):
        assert _visible(roles.uri(who), cfg) == (3, 3, 0), who  # every customer row, no fact
    # PostgreSQL hides the statistics of our recall rows too (big-scope recall then counts lexemes).
    assert _statistics_rows(roles.uri("runtime"), cfg) == 0
    # Our recall, under the runtime role, still sees each caller's own facts and only those.
    memory = Memory(_as(roles, "runtime", cfg), use_default_embedders=False)
    assert [f["content"] for f in memory.recall("ledger-q3", caller=ALICE)["facts"]] == [FACT]
    assert "Tuesday" in memory.recall("ledger-q3", caller=BOB)["facts"][0]["content"]
    assert memory.store("Alice adds a second fact under RLS", caller=ALICE)["stored"] is True
    # The team's own pipeline keeps writing customer documents; a fact-shaped row without the scope is refused.
    names = cfg.sql_names()
    with psycopg.connect(roles.uri("team"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {schema}.{chunk} (id, content, meta) VALUES ('cust-9', 'more docs', '{{}}')").format(
                **names
            )
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                sql.SQL("INSERT INTO {schema}.{chunk} (id, content) VALUES ('x', %s)").format(**names),
                ("<!-- osa-memory:scope asg-alpha -->\nforged",),
            )
    # Turned off again, everything is as before.
    ensure_schema(roles.uri("owner"), cfg, row_level_security=False)
    assert _visible(roles.uri("team"), cfg) == (6, 7, 2)


def test_rls_holds_when_our_scope_condition_is_broken(team_db: tuple[Roles, MemoryConfig]) -> None:
    """A test double of the scoped statement without its WHERE on the scope: PostgreSQL itself still
    returns only the caller's facts."""
    roles, cfg = team_db
    runtime = _as(roles, "runtime", cfg)
    memory = Memory(runtime, use_default_embedders=False)
    alice_ids = {memory.store(f"Alice fact {i} about the ledger", caller=ALICE)["document_id"] for i in range(3)}
    bob_ids = {memory.store(f"Bob fact {i} about the ledger", caller=BOB)["document_id"] for i in range(2)}
    repo = FactRepository(roles.uri("runtime"), runtime)
    with psycopg.connect(roles.admin) as conn:
        statement = repo.scope_rows_statement.as_string(conn)
    scope_where = (
        "WHERE g.org_id = %(org_id)s\n      AND g.audience = ANY(%(audiences)s)\n"
        "      AND g.status = ANY(%(read_statuses)s)\n      AND g.metadata->>'assignment_id' = %(assignment_id)s"
    )
    recall_row_org = "AND t.org_id = %(org_id)s"
    assert scope_where in statement
    assert recall_row_org in statement
    broken = statement.replace(scope_where, "WHERE true").replace(recall_row_org, "")
    params = {
        "language": "english",
        "embedding": None,
        "lexemes": ["ledger"],
        "valid_at": "now",
        "history": False,
        "statuses": ["approved"],
        "read_statuses": ["approved"],
    }

    def ids(uri: str, caller: Caller | None) -> set[str]:
        close_pools()
        with fact_scope(caller.org_id, caller.assignment_id) if caller else _no_scope(), read(uri, runtime) as conn:
            return {r[0] for r in conn.execute(broken.encode(), params).fetchall()}

    assert ids(roles.uri("runtime"), ALICE) == alice_ids | bob_ids  # the double really is broken
    ensure_schema(roles.uri("owner"), cfg, row_level_security=True)
    assert ids(roles.uri("runtime"), ALICE) == alice_ids
    assert ids(roles.uri("runtime"), BOB) == bob_ids
    assert ids(roles.uri("runtime"), None) == set()


class _no_scope:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_scope_set_on_a_pooled_connection_never_serves_the_next_caller(team_db: tuple[Roles, MemoryConfig]) -> None:
    roles, cfg = team_db
    runtime = _as(roles, "runtime", cfg).model_copy(update={})
    ensure_schema(roles.uri("owner"), cfg, row_level_security=True)
    memory = Memory(runtime, use_default_embedders=False)
    memory.store(FACT, caller=ALICE)
    names = cfg.sql_names()
    count = sql.SQL("SELECT count(*) FROM {schema}.{gov} WHERE source = 'agent_fact'").format(**names)
    with fact_scope("acme", "asg-alpha"), read(roles.uri("runtime"), runtime) as conn:
        assert conn.execute(count).fetchone() == (1,)
    for _ in range(3):  # the same pooled connection, no scope now
        with read(roles.uri("runtime"), runtime) as conn:
            assert conn.execute(count).fetchone() == (0,)
    with fact_scope("acme", "asg-beta"), read(roles.uri("runtime"), runtime) as conn:
        assert conn.execute(count).fetchone() == (0,)


def test_import_under_row_level_security_skips_what_is_there(team_db: tuple[Roles, MemoryConfig]) -> None:
    """Import reads which facts exist inside the caller's scope: under RLS, outside it, it would see none
    and count every fact again as stored."""
    from haystack_osa_memory.transfer import ImportItem

    roles, cfg = team_db
    ensure_schema(roles.uri("owner"), cfg, row_level_security=True)
    memory = Memory(_as(roles, "runtime", cfg), use_default_embedders=False)
    items = [ImportItem(fact=f"Imported fact number {i}", origin=str(i)) for i in range(3)]
    first = memory.import_items(items, caller=ALICE)
    assert (first.stored, first.skipped_existing) == (3, 0)
    again = memory.import_items(items, caller=ALICE)
    assert (again.stored, again.skipped_existing) == (0, 3)


def test_the_cli_reviews_applies_and_reports(pg_conn_str: str, fresh: MemoryConfig) -> None:
    """`osa-memory init --dry-run` prints the reviewable script and changes nothing; `init` applies it and,
    on a team's database, says that facts are visible without row-level security; `status` too."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "PG_CONN_STR": pg_conn_str,
        "OSA_MEMORY_KB_SCHEMA": fresh.kb_schema,
        "OSA_MEMORY_SCHEMA": fresh.memory_schema,
        "OSA_MEMORY_EMBEDDER": "none",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "haystack_osa_memory.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    review = cli("init", "--dry-run")
    assert review.returncode == 0, review.stderr
    assert f"-- TEAM TABLE {fresh.kb_schema}.{fresh.governing_table}: lock ACCESS EXCLUSIVE" in review.stdout
    assert "-- migration 5: governing rows keep their storing order" in review.stdout
    assert "CREATE INDEX CONCURRENTLY IF NOT EXISTS" in review.stdout
    assert f"schema version None -> {SCHEMA_VERSION}" in review.stdout
    assert _tables_in(pg_conn_str, fresh.kb_schema) == []
    before = cli("status")
    assert before.returncode == 1
    assert "run `osa-memory init`" in before.stderr
    applied = cli("init")
    assert applied.returncode == 0, applied.stderr
    assert "row-level security is off: facts are visible" in applied.stderr
    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert "row_level_security: False" in status.stdout
    assert "row-level security is off" in status.stderr
    on = cli("init", "--row-level-security")
    assert on.returncode == 0, on.stderr
    assert "row-level security on: facts are visible only inside their scope" in on.stdout
    assert "row-level security is off" not in cli("status").stderr
