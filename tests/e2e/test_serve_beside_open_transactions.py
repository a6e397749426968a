"""`osa-memory serve` on a busy team database: another session holds a transaction open on the
governing and chunk tables (a long report, a queue worker); the server still becomes ready, stores
and recalls within seconds, and the other transaction is not disturbed (the start runs no DDL)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import drop_schema, new_schema_config
from tests.e2e.conftest import Server, call

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


@pytest.fixture
def config(pg_conn_str: str) -> Iterator[MemoryConfig]:
    cfg = new_schema_config(pg_conn_str)
    ensure_schema(pg_conn_str, cfg)
    yield cfg
    drop_schema(pg_conn_str, cfg.kb_schema)


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
        held = other.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND relation = to_regclass(%s)",
            (f'"{config.kb_schema}"."{config.governing_table}"',),
        ).fetchone()
        assert held == (1,)
        assert other.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        other.rollback()
