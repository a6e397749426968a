"""A `serve` parent killed with SIGKILL (as the out-of-memory killer does) leaves nothing serving: its workers
exit, the port is free again, and the embedded PostgreSQL it started stops."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from tests.e2e.test_serve_shutdown_and_logs import postmaster_pid, running, start_serve

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

#: Seconds the workers get to notice that their parent is gone (they should take well under one).
WORKERS_GONE_WITHIN = 10.0
#: Seconds for the embedded PostgreSQL to be stopped after the last of its users is gone.
DATABASE_GONE_WITHIN = 30.0


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def all_gone(pids: list[int], seconds: float) -> list[int]:
    """The pids of ``pids`` still running after ``seconds`` (polled)."""
    deadline = time.monotonic() + seconds
    alive = [p for p in pids if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if running(p)]
    return alive


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test saw; whichever still runs afterwards is killed (a failed test must not leave a server)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if running(pid):
            psutil.Process(pid).kill()


@pytest.mark.parametrize("workers", [2, 1])
def test_a_killed_parent_leaves_no_worker_no_listener_and_no_database(
    tmp_path: Path, leftovers: list[int], workers: int
) -> None:
    data_dir = tmp_path / "data"
    log = tmp_path / "serve.log"
    parent, port = start_serve(data_dir, log, "--workers", str(workers))
    postmaster = postmaster_pid(data_dir)
    # Everything the parent started, PostgreSQL aside (pg_ctl hands the postmaster to init).
    descendants = [p.pid for p in psutil.Process(parent.pid).children(recursive=True)]
    leftovers.extend([*descendants, postmaster])
    if workers > 1:
        assert len(descendants) >= workers, log.read_text()
    assert listening(port)

    parent.send_signal(signal.SIGKILL)
    parent.wait(10)

    assert all_gone(descendants, WORKERS_GONE_WITHIN) == [], f"orphans still running\n{log.read_text()}"
    assert not listening(port), "the killed server's port still accepts connections"
    with socket.socket() as s:  # a restart can bind it
        s.bind(("127.0.0.1", port))
    assert all_gone([postmaster], DATABASE_GONE_WITHIN) == [], "the embedded PostgreSQL outlived its server"
