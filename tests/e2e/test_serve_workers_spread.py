"""`serve --workers 2` spreads connections over its workers (`mcp/listening.py`): 32 connections opened at once
are held by both workers, each a fair share, where one shared socket let the first worker woken take nearly all;
and a second `serve` on the same port is refused, as before, rather than joining the first."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from haystack_osa_memory.mcp.listening import reuse_port
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import new_schema_config
from tests.e2e.conftest import OSA_MEMORY, Server, serve_workers, serving

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not reuse_port(), reason="SO_REUSEPORT spreads connections on Linux only"),
]

CONNECTIONS = 32
BURSTS = 10


@pytest.fixture(scope="module")
def two_workers(pg_conn_str: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = new_schema_config(pg_conn_str)
    ensure_schema(pg_conn_str, config)
    with serving(Server(config, pg_conn_str, tmp_path_factory.mktemp("spread") / "server.log", workers=2)) as srv:
        yield srv


def held_by_each(workers: list[psutil.Process], port: int) -> list[int]:
    """How many established connections to ``port`` each worker holds."""
    return [
        sum(1 for c in w.net_connections(kind="tcp") if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port)
        for w in workers
    ]


def listening(workers: list[psutil.Process], port: int) -> bool:
    """Whether every worker listens on ``port`` (the first answers /status while the other may still start)."""
    return all(
        any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in w.net_connections(kind="tcp"))
        for w in workers
    )


def test_connections_opened_at_once_are_spread_over_both_workers(two_workers: Server) -> None:
    assert two_workers.proc is not None
    workers = serve_workers(two_workers.proc.pid)
    assert len(workers) == 2
    deadline = time.monotonic() + 60
    while not listening(workers, two_workers.port):
        assert time.monotonic() < deadline, "a worker did not listen within 60 s"
        time.sleep(0.1)
    for _ in range(BURSTS):  # as a load generator opens its connections
        clients = []
        for _ in range(CONNECTIONS):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", two_workers.port))
            clients.append(c)
        time.sleep(0.3)  # all accepted before the first request, as a load generator's connections are
        for c in clients:
            c.setblocking(True)
            c.sendall(b"GET /status HTTP/1.1\r\nHost: localhost\r\n\r\n")  # kept alive after the answer
        for c in clients:
            assert c.recv(65536).startswith(b"HTTP/1.1 200")
        held = held_by_each(workers, two_workers.port)
        try:
            assert sum(held) == CONNECTIONS
            # Spread by a hash of each connection's addresses: at most 4 of 32 on one worker, in one of ten
            # bursts, is a chance of ~3e-4; with one shared socket, 32/0, 31/1 and 28/4 were common.
            assert min(held) >= 5, held
        finally:
            for c in clients:
                c.close()
        time.sleep(0.2)


def test_a_second_serve_on_the_same_port_is_refused(two_workers: Server, tmp_path: Path) -> None:
    log = tmp_path / "second.log"
    with log.open("ab") as out:
        done = subprocess.run(
            [*OSA_MEMORY, "serve", "--port", str(two_workers.port), "--workers", "2", "--log-level", "warning"],
            env=two_workers.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
    assert done.returncode == 3, log.read_text()
    assert "in use" in log.read_text()
    assert two_workers.proc is not None
    assert two_workers.proc.poll() is None  # the first one serves on
