"""Two `osa-memory serve` processes (each with its workers) on one database behave as one server.

- a token revoked through one is refused by the other at once (each request verifies its token in the
  database; only during a database outage is a recently verified token accepted, for `offline_grace`);
- a kill switch set through one acts at once on both;
- the same fact stored through both at the same moment is one row;
- a call answered by either worker of either process sees the same facts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import drop_schema, new_schema_config
from tests.e2e.conftest import Server, call, serve_workers

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]


class WorkersServer(Server):
    """A `Server` started with ``--workers 2`` (the default on this 2-CPU machine, made explicit)."""

    def start(self) -> None:
        import subprocess

        from tests.e2e.conftest import OSA_MEMORY, wait_for_status

        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*OSA_MEMORY, "serve", "--port", str(self.port), "--log-level", "warning", "--workers", "2"],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for_status(self.proc, self.port, self.log, 90, "osa-memory serve --workers 2")


@pytest.fixture(scope="module")
def pair(pg_conn_str: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    config = new_schema_config(pg_conn_str)
    ensure_schema(pg_conn_str, config)
    folder = tmp_path_factory.mktemp("pair")
    one = WorkersServer(config, pg_conn_str, folder / "one.log")
    two = WorkersServer(config, pg_conn_str, folder / "two.log")
    one.start()
    try:
        two.start()
        try:
            yield one, two
        finally:
            two.stop()
    finally:
        one.stop()
        drop_schema(pg_conn_str, config.kb_schema)


def _status_code(server: Server, token: str) -> int:
    """HTTP status of one MCP request with this bearer token (a new connection each time, so that the
    kernel hands successive requests to either worker)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {token}"}
    return httpx.post(server.url, json=body, timeout=10, headers=headers).status_code


def test_a_token_revoked_through_one_server_is_refused_by_the_other_at_once(pair: tuple[Server, Server]) -> None:
    one, two = pair
    issued = one.token("asg-revoke")
    for server in pair:
        assert [_status_code(server, issued["token"]) for _ in range(4)] == [200] * 4
    done = one.cli("token", "revoke", issued["token_id"])
    assert done.returncode == 0, done.stderr
    # Both processes, every worker: several calls each, so that both workers of each are asked.
    for server in (two, one):
        assert [_status_code(server, issued["token"]) for _ in range(6)] == [401] * 6


def test_a_kill_switch_set_through_one_acts_at_once_on_both(pair: tuple[Server, Server]) -> None:
    one, two = pair
    token = one.token("asg-switch")["token"]
    done = one.cli("assignment", "disable", "asg-switch", "--org", "acme", "--reason", "incident")
    assert done.returncode == 0, done.stderr
    try:
        for server in (two, one):
            for _ in range(3):
                failed, text = call(server.url, token, "kb_memory_store", {"fact": "must not be written"})
                assert failed
                assert "Memory is off" in str(text)
    finally:
        assert one.cli("assignment", "enable", "asg-switch", "--org", "acme").returncode == 0
    failed, _ = call(two.url, token, "kb_memory_store", {"fact": "written once memory is back on"})
    assert not failed
    with psycopg.connect(one.pg_conn_str) as conn:
        written = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.{} WHERE metadata->>'assignment_id' = 'asg-switch'").format(
                sql.Identifier(one.config.kb_schema), sql.Identifier(one.config.governing_table)
            )
        ).fetchone()
    assert written is not None
    assert written[0] == 1


def test_the_same_fact_stored_through_both_at_once_is_one_row(pair: tuple[Server, Server]) -> None:
    one, two = pair
    token = one.token("asg-race")["token"]
    fact = "The release train leaves on Thursdays at 14:00 UTC"
    results: list[tuple[bool, Any]] = []
    barrier = threading.Barrier(4)

    def store(server: Server) -> None:
        barrier.wait()
        results.append(call(server.url, token, "kb_memory_store", {"fact": fact, "topic": "release"}))

    threads = [threading.Thread(target=store, args=(server,)) for server in (one, two, one, two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4
    assert not any(failed for failed, _ in results), results
    ids = {data["document_id"] for _, data in results}
    assert len(ids) == 1
    with psycopg.connect(one.pg_conn_str) as conn:
        names = {"schema": sql.Identifier(one.config.kb_schema)}
        governing = conn.execute(
            sql.SQL("SELECT count(*) FROM {schema}.{gov} WHERE id = %s").format(
                gov=sql.Identifier(one.config.governing_table), **names
            ),
            (ids.pop(),),
        ).fetchone()
        chunks = conn.execute(
            sql.SQL("SELECT count(*) FROM {schema}.{chunk} WHERE content LIKE %s").format(
                chunk=sql.Identifier(one.config.chunk_table), **names
            ),
            (f"%{fact}",),
        ).fetchone()
    assert governing is not None
    assert governing[0] == 1
    assert chunks is not None
    assert chunks[0] == 1
    # Recalled through either process: the one fact.
    for server in pair:
        failed, data = call(server.url, token, "kb_memory_recall", {"query": "when does the release train leave"})
        assert not failed
        assert [f["content"] for f in data["facts"]] == [fact]


def test_each_process_runs_two_workers(pair: tuple[Server, Server]) -> None:
    """Two workers each, forked from their `serve` process (which loaded the models they share)."""
    import psutil

    for server in pair:
        assert server.proc is not None
        workers = serve_workers(server.proc.pid)
        assert len(workers) == 2, [p.cmdline() for p in psutil.Process(server.proc.pid).children()]
    logs = [Path(server.log).read_text(errors="replace") for server in pair]
    assert not any("Traceback" in log for log in logs), logs
