"""Token roles, console sessions, the schema migration and the console's database role, on a real PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from haystack_osa_memory import AuthenticationError, Caller, InvalidInputError, Memory, MemoryConfig
from haystack_osa_memory.console.queries import ConsoleQueries, QueueFilter
from haystack_osa_memory.errors import DatabaseError
from haystack_osa_memory.store.database import fact_scope
from haystack_osa_memory.store.lifecycle import LifecycleRepository, Scope
from haystack_osa_memory.store.schema import SCHEMA_VERSION, ensure_schema
from haystack_osa_memory.store.tokens import ConsoleSessions, TokenStore
from tests.conftest import drop_schema, new_schema_config
from tests.e2e.conftest import OSA_MEMORY, env_for

pytestmark = pytest.mark.integration


@pytest.fixture
def tokens(pg_conn_str: str, config: MemoryConfig) -> TokenStore:
    return TokenStore(pg_conn_str, config)


@pytest.mark.parametrize("role", ["reviewer", "admin"])
def test_a_person_token_is_refused_where_agents_act(tokens: TokenStore, role: str) -> None:
    """`verify` and `verify_with_expiry` are what `/mcp` and the REST wrappers accept: never a person's token."""
    issued = tokens.create_person(org_id="acme", role=role, name="Ana Silva", expires_in=timedelta(days=30))
    with pytest.raises(AuthenticationError, match="invalid, expired or revoked token"):
        tokens.verify(issued.token)
    with pytest.raises(AuthenticationError, match="invalid, expired or revoked token"):
        tokens.verify_with_expiry(issued.token)
    me = tokens.verify_person(issued.token)
    assert (me.org_id, me.role, me.name, me.token_id) == ("acme", role, "Ana Silva", issued.token_id)


def test_an_agent_token_cannot_sign_in_to_the_console(tokens: TokenStore) -> None:
    agent = tokens.create(org_id="acme", assignment_id="asg-1")
    assert tokens.verify(agent.token).assignment_id == "asg-1"
    with pytest.raises(AuthenticationError, match="agent token cannot sign in"):
        tokens.verify_person(agent.token)
    for wrong in ("", "osam_x", agent.token[:-1] + ("A" if agent.token[-1] != "A" else "B")):
        with pytest.raises(AuthenticationError, match="invalid, expired or revoked token"):
            tokens.verify_person(wrong)


@pytest.mark.parametrize(
    ("role", "name", "expected"),
    [
        ("agent", "Ana", "role 'agent' is not allowed for a person"),
        ("owner", "Ana", "role 'owner' is not allowed"),
        ("reviewer", "", "name '' is not allowed"),
        ("reviewer", "x" * 81, "is not allowed: 1-80 printable"),
        ("reviewer", "Ana\u202egnorw", "bidirectional-override"),
        ("reviewer", "Ana\nSilva", "control"),
    ],
)
def test_person_tokens_check_role_and_name(tokens: TokenStore, role: str, name: str, expected: str) -> None:
    with pytest.raises(InvalidInputError, match=expected):
        tokens.create_person(org_id="acme", role=role, name=name)


def test_sessions_end_on_logout_revocation_idle_and_absolute_expiry(
    pg_conn_str: str, config: MemoryConfig, tokens: TokenStore
) -> None:
    me = tokens.create_person(org_id="acme", role="reviewer", name="Ana Silva")
    long = ConsoleSessions(pg_conn_str, config, idle=timedelta(minutes=30), absolute=timedelta(hours=8))
    first, second = long.start(me.identity), long.start(me.identity)
    assert first != second
    session = long.get(first)
    assert session is not None
    assert session.identity == me.identity
    long.end(first)
    assert long.get(first) is None
    assert long.get(second) is not None
    assert tokens.revoke(me.token_id)
    assert long.get(second) is None  # revoking the token ends its sessions
    assert long.get("not-a-session") is None
    assert long.get("") is None
    assert long.get("x" * 500) is None

    other = tokens.create_person(org_id="acme", role="admin", name="Bo Admin")
    idle = ConsoleSessions(pg_conn_str, config, idle=timedelta(seconds=2), absolute=timedelta(hours=8))
    kept = idle.start(other.identity)
    for _ in range(3):  # requests within the idle limit keep it alive past the limit in total
        time.sleep(0.9)
        assert idle.get(kept) is not None
    dropped = idle.start(other.identity)
    time.sleep(2.5)
    assert idle.get(dropped) is None
    short = ConsoleSessions(pg_conn_str, config, idle=timedelta(minutes=30), absolute=timedelta(seconds=2))
    capped = short.start(other.identity)
    assert short.get(capped) is not None
    time.sleep(2.5)
    assert short.get(capped) is None


def test_an_expired_person_token_ends_its_sessions(pg_conn_str: str, config: MemoryConfig, tokens: TokenStore) -> None:
    me = tokens.create_person(org_id="acme", role="reviewer", name="Ana Silva", expires_in=timedelta(seconds=2))
    sessions = ConsoleSessions(pg_conn_str, config, idle=timedelta(minutes=30), absolute=timedelta(hours=8))
    session_id = sessions.start(me.identity)
    assert sessions.get(session_id) is not None
    time.sleep(2.5)
    assert sessions.get(session_id) is None


def test_token_list_shows_roles_and_names_and_filters_by_org(tokens: TokenStore) -> None:
    agent = tokens.create(org_id="acme", assignment_id="asg-1")
    person = tokens.create_person(org_id="acme", role="admin", name="Bo Admin")
    tokens.create_person(org_id="globex", role="reviewer", name="Cy Other")
    rows = {r["token_id"]: r for r in tokens.list("acme")}
    assert set(rows) == {agent.token_id, person.token_id}
    assert (rows[agent.token_id]["role"], rows[agent.token_id]["assignments"]) == ("agent", ["asg-1"])
    assert (rows[person.token_id]["role"], rows[person.token_id]["name"]) == ("admin", "Bo Admin")
    assert rows[person.token_id]["assignments"] == []
    assert tokens.org_of(person.token_id) == "acme"
    assert tokens.org_of("0" * 16) is None


def test_the_cli_creates_reviewer_and_admin_tokens(pg_conn_str: str, config: MemoryConfig) -> None:
    env = env_for(config, pg_conn_str)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*OSA_MEMORY, *args], env=env, capture_output=True, text=True, timeout=120)

    made = cli(
        "token", "create", "--role", "reviewer", "--org", "acme", "--name", "Ana Silva", "--expires-in", "30d", "--json"
    )
    assert made.returncode == 0, made.stderr
    data = json.loads(made.stdout)
    assert (data["role"], data["org"], data["name"], data["assignments"]) == ("reviewer", "acme", "Ana Silva", [])
    tokens = TokenStore(pg_conn_str, config)
    assert tokens.verify_person(data["token"]).role == "reviewer"
    with pytest.raises(AuthenticationError):
        tokens.verify(data["token"])
    refused = [
        (("--role", "reviewer", "--org", "acme", "--name", "A", "--assignment", "asg-1"), "drop --assignment"),
        (("--role", "admin", "--org", "acme"), "add --name"),
        (("--org", "acme"), "needs at least one --assignment"),
        (("--role", "root", "--org", "acme", "--name", "A"), "role 'root' is not allowed"),
    ]
    for args, message in refused:
        done = cli("token", "create", *args)
        assert done.returncode == 1, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
    listed = cli("token", "list", "--json")
    assert any(r["role"] == "reviewer" and r["name"] == "Ana Silva" for r in json.loads(listed.stdout))


def test_upgrade_keeps_agent_tokens_working(pg_conn_str: str) -> None:
    """A token made before token roles existed stays an agent token after `init` brings the schema up."""
    cfg = new_schema_config(pg_conn_str)
    try:
        ensure_schema(pg_conn_str, cfg, target_version=SCHEMA_VERSION - 1)
        names = cfg.sql_names()
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    """INSERT INTO {mem}.tokens (token_id, secret_sha256, org_id, assignment_id, assignment_ids)
                    VALUES ('00000000000000aa', encode(sha256('s'::bytea), 'hex'), 'acme', 'asg-1', ARRAY['asg-1'])"""
                ).format(**names)
            )
        assert ensure_schema(pg_conn_str, cfg).applied == [SCHEMA_VERSION]
        rows = TokenStore(pg_conn_str, cfg).list()
        assert [(r["token_id"], r["role"], r["assignments"]) for r in rows] == [
            ("00000000000000aa", "agent", ["asg-1"])
        ]
    finally:
        drop_schema(pg_conn_str, cfg.kb_schema)


@pytest.fixture
def console_db(pg_conn_str: str) -> Iterator[tuple[MemoryConfig, str]]:
    """A knowledge base with row-level security on and a console role; yields it and the role's URI."""
    cfg = new_schema_config(pg_conn_str)
    role = f"console_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        report = ensure_schema(pg_conn_str, cfg, row_level_security=True, console_role=role)
        assert report.row_level_security
        assert report.console_role == role
        yield cfg, make_conninfo(pg_conn_str, user=role)
    finally:
        drop_schema(pg_conn_str, cfg.kb_schema)
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {0} CASCADE; DROP ROLE {0}").format(sql.Identifier(role)))


def test_the_console_role_reviews_its_org_only_and_owns_nothing(
    pg_conn_str: str, console_db: tuple[MemoryConfig, str]
) -> None:
    cfg, console_uri = console_db
    memory = Memory(cfg, use_default_embedders=False)
    acme = Caller(org_id="acme", assignment_id="asg-1", token_id="a" * 16)
    globex = Caller(org_id="globex", assignment_id="asg-1", token_id="b" * 16)
    mine = memory.propose("fact", "Deploys", "Deploys go through the staging gate first.", caller=acme)["document_id"]
    theirs = memory.propose("fact", "Secret plan", "Globex ships the rocket on Friday.", caller=globex)["document_id"]
    kept = memory.store("The billing service listens on port 8080.", caller=acme)["document_id"]

    queries = ConsoleQueries(console_uri, cfg)
    page = queries.queue("acme", QueueFilter(), None)
    assert [i["document_id"] for i in page["items"]] == [mine]
    assert queries.fact("acme", theirs) is None
    assert queries.fact("acme", mine) is not None
    assert queries.queue("globex", QueueFilter(), None)["items"][0]["document_id"] == theirs

    lifecycle = LifecycleRepository(console_uri, cfg)
    with fact_scope("acme", ""):
        with pytest.raises(InvalidInputError, match="no proposed or flagged fact"):  # RLS hides globex's row
            lifecycle.review(theirs, accept=True, actor="reviewer:test", note=None)
        assert lifecycle.review(mine, accept=True, actor="reviewer:test", note="ok")["status"] == "approved"
        assert lifecycle.forget(Scope("acme", "asg-1"), kept, reason="wrong port", actor="reviewer:test")
    lifecycle.set_switch("acme", "asg-1", enabled=False, actor="admin:test", reason="incident")
    assert [s["assignment_id"] for s in lifecycle.switches()] == ["asg-1"]
    lifecycle.set_switch("acme", "asg-1", enabled=True, actor="admin:test", reason=None)
    assert {r["action"] for r in queries.audit("acme")} >= {"review", "forget", "switch"}
    person = TokenStore(pg_conn_str, cfg).create_person(org_id="acme", role="reviewer", name="Ana Silva")
    assert TokenStore(console_uri, cfg).verify_person(person.token).org_id == "acme"
    assert TokenStore(console_uri, cfg).revoke(person.token_id)
    assert memory.recall("staging gate", caller=acme)["facts"][0]["document_id"] == mine

    names = cfg.sql_names()
    forbidden = [
        sql.SQL("INSERT INTO {schema}.{gov} (id, org_id, dataset, source) VALUES ('x', 'acme', 'd', 'agent_fact')"),
        sql.SQL("DELETE FROM {schema}.{gov}"),
        sql.SQL("UPDATE {mem}.tokens SET org_id = 'globex'"),
        sql.SQL("INSERT INTO {mem}.tokens (token_id, secret_sha256, org_id) VALUES ('x', 'y', 'acme')"),
        sql.SQL("CREATE TABLE {schema}.evil (id int)"),
        sql.SQL("DROP TABLE {mem}.audit"),
        sql.SQL("DELETE FROM {mem}.audit"),
    ]
    with psycopg.connect(console_uri, autocommit=True) as conn:
        for statement in forbidden:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement.format(**names))
        # Without an org in the session, the console role sees no fact at all.
        rows = conn.execute(sql.SQL("SELECT count(*) FROM {schema}.{gov}").format(**names)).fetchone()
        assert rows is not None
        assert rows[0] == 0


def test_the_console_role_is_refused_without_its_grants(pg_conn_str: str, config: MemoryConfig) -> None:
    """A role that `init --console-role` never granted cannot read the queue (the grants are what works)."""
    role = f"nogrant_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        with pytest.raises(DatabaseError, match="InsufficientPrivilege"):
            ConsoleQueries(make_conninfo(pg_conn_str, user=role), config).queue("acme", QueueFilter(), None)
    finally:
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_each_console_role_step_takes_the_lock_it_declares(pg_conn_str: str, config: MemoryConfig) -> None:
    """What `init --dry-run` tells a DBA about the console role's grants and policies is what PostgreSQL takes."""
    from haystack_osa_memory.store import schema
    from tests.integration.test_guest_database import LOCK_MODES, _strongest

    role = f"console_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
        try:
            names = schema.Names.of(config)
            steps = schema._console_steps(role, policies=True)
            assert sum(1 for s in steps if s.lock == schema.ACCESS_EXCLUSIVE) == 3  # one policy per fact table
            for step in steps:
                table = step.table(names)
                with conn.transaction():
                    conn.execute(step.build(names))
                    held = _strongest(conn, table) if table else None
                if step.lock == schema.NO_TABLE_LOCK:
                    assert held in (None, "AccessShareLock"), step.build(names).as_string(conn)
                    continue
                declared = next(mode for label, mode in LOCK_MODES.items() if step.lock.startswith(label + " "))
                allowed = {declared, None} if step.lock.endswith("else none") else {declared}
                assert held in allowed, (step.build(names).as_string(conn), held)
        finally:
            conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(sql.Identifier(role)))


def test_init_dry_run_lists_the_console_role_steps_and_runs_none(pg_conn_str: str, config: MemoryConfig) -> None:
    report = ensure_schema(pg_conn_str, config, dry_run=True, console_role="nobody_yet")
    statements = [s.statement for s in report.steps]
    assert any("GRANT SELECT, UPDATE (revoked_at) ON" in s and '"nobody_yet"' in s for s in statements)
    assert not any("CREATE POLICY" in s for s in statements)  # row-level security is off here
    assert report.console_role == "nobody_yet"


def test_a_person_name_is_redacted_before_it_is_kept(tokens: TokenStore) -> None:
    """The name lands on every page and in every audit row of the person: no secret may ride along."""
    secret = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    issued = tokens.create_person(org_id="acme", role="reviewer", name=f"Ana {secret}")
    assert secret not in issued.identity.name
    assert issued.identity.name.startswith("Ana ")
    assert all(secret not in (r["name"] or "") for r in tokens.list("acme"))
