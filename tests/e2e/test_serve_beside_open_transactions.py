"""`osa-memory serve` on a busy team database: another session holds a transaction open on the
governing and chunk tables (a long report, a queue worker); the server still becomes ready, stores
and recalls within seconds, and the other transaction is not disturbed (the start runs no DDL)."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import Roles
from tests.e2e.conftest import Server, call
from tests.integration.test_guest_database import fact_rows, still_holds_its_lock

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_serve_starts_stores_and_recalls_while_the_team_holds_locks(
    pg_conn_str: str, config: MemoryConfig, tmp_path: Path
) -> None:
    names = config.sql_names()
    with psycopg.connect(pg_conn_str) as other:
        other.execute(sql.SQL("LOCK TABLE {schema}.{gov} IN ACCESS SHARE MODE").format(**names))
        other.execute(sql.SQL("SELECT id FROM {schema}.{chunk} FOR SHARE").format(**names))
        server = Server(config, pg_conn_str, tmp_path / "serve.log")
        started = time.monotonic()
        server.start()
        try:
            ready = time.monotonic() - started
            token = server.token("asg-locks")["token"]
            t0 = time.monotonic()
            failed, stored = call(server.url, token, "kb_memory_store", {"fact": "Queue workers hold read locks"})
            assert not failed, stored
            failed, recalled = call(server.url, token, "kb_memory_recall", {"query": "queue workers read locks"})
            assert not failed, recalled
            assert recalled["facts"][0]["document_id"] == stored["document_id"]
            assert time.monotonic() - t0 < 15
            assert ready < 45
        finally:
            server.stop()
        assert still_holds_its_lock(other, config)
        other.rollback()


def test_serve_runs_as_the_runtime_role_with_row_level_security(
    team_db: tuple[Roles, MemoryConfig], pg_conn_str: str, tmp_path: Path
) -> None:
    """`serve` connected as a role with row rights only, on tables whose owner ran `init
    --runtime-role --row-level-security`: it starts, stores and recalls over MCP, scopes apart; the
    owner (held by FORCE) and any session without a scope see no fact."""
    from haystack_osa_memory.store.tokens import TokenStore

    roles, cfg = team_db
    server = Server(cfg, roles.uri("runtime"), tmp_path / "serve.log")
    try:
        ensure_schema(roles.uri("owner"), cfg, row_level_security=True)
        server.start()
        tokens = TokenStore(roles.uri("owner"), cfg)  # the owner issues tokens; the runtime role only reads them
        alice = tokens.create(org_id="acme", assignment_id="asg-alice").token
        bob = tokens.create(org_id="acme", assignment_id="asg-bob").token
        failed, stored = call(server.url, alice, "kb_memory_store", {"fact": "Alice's build cache lives in s3 cache-a"})
        assert not failed, stored
        failed, recalled = call(server.url, alice, "kb_memory_recall", {"query": "build cache"})
        assert not failed, recalled
        assert [f["document_id"] for f in recalled["facts"]] == [stored["document_id"]]
        failed, other = call(server.url, bob, "kb_memory_recall", {"query": "build cache"})
        assert not failed, other
        assert other["facts"] == []
        assert fact_rows(roles.uri("owner"), cfg) == 0
        assert fact_rows(pg_conn_str, cfg) == 1  # a superuser bypasses RLS: the fact is really there
    finally:
        server.stop()
