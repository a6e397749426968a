"""Prometheus metrics (`haystack_osa_memory.mcp.metrics`): bounded labels, and multiprocess mode with real
worker processes: their counts add up in one scrape, and the gauges of exited or killed workers drop out.

This process only serves and scrapes the endpoint; the metrics are written by worker subprocesses.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

# Imported before any test exports a metrics folder: this process then keeps in-memory values, and no
# test leaves later ones writing files into a folder that is gone.
import prometheus_client  # noqa: F401
import pytest

from haystack_osa_memory import instruments
from haystack_osa_memory.durable_queue import DurableQueue
from haystack_osa_memory.errors import DatabaseError, InvalidInputError, MemoryOffError, NotFoundError
from haystack_osa_memory.mcp import metrics
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
SECRET = "the staging VPN password is hunter2-Zebra"
SERVED = ("kb_memory_recall", "kb_memory_store")

# A worker: what the MCP app's process does, with a fake pool (no database needed) whose statistics
# are known. It waits on stdin when asked to stay alive, exits without atexit when "killed".
WORKER = textwrap.dedent(
    """
    import os, sys
    from haystack_osa_memory import instruments
    from haystack_osa_memory.errors import NotFoundError
    from haystack_osa_memory.mcp import metrics
    from haystack_osa_memory.store import database

    secret = sys.argv[2]
    database.pool_stats = lambda pop=False: [{
        "pool_size": 3, "pool_available": 1, "pool_max": 8, "requests_waiting": 2,
        "requests_num": 7 if pop else 0, "requests_queued": 2 if pop else 0,
        "requests_wait_ms": 500 if pop else 0, "requests_errors": 1 if pop else 0,
    }]
    # A big assignment held in memory (rows as the database returns them; no database needed), read once,
    # then one of its facts dropped.
    import numpy as np
    from haystack_osa_memory.store import scope_cache

    class Cursor:
        def execute(self, *args):
            return self

        def fetchall(self):
            vec = b"\\x00\\x03\\x00\\x00" + np.array([1, 0, 0], ">f4").tobytes()
            return [(2, 3, 2, 2, 3, f"d{i}", None, i + 1, vec, 1.0, None, True) for i in range(2)]

    cache = scope_cache.ScopeCache(100, 3)
    statements = scope_cache.Statements(check=None, rows_after=None)
    scope = {"org_id": "acme", "assignment_id": secret}
    with cache.use(Cursor(), statements, scope, scope_cache.Check(2, 3, 2)) as held:
        assert len(held) == 2
    cache.drop_facts(("acme", secret), {"d0"})
    assert metrics.start_worker(["kb_memory_recall", "kb_memory_store"])
    metrics.record_tool_call(metrics.tool_label("kb_memory_recall", ["kb_memory_recall"]), 0.02, None)
    metrics.record_tool_call("kb_memory_store", 0.3, NotFoundError(f"no fact {secret}"))
    metrics.record_tool_call(metrics.tool_label(secret, ["kb_memory_recall"]), 0.001, RuntimeError(secret))
    instruments.observe_embed_batch(1)
    instruments.observe_embed_batch(5)
    if sys.argv[1] == "kill":
        os._exit(0)
    if sys.argv[1] == "stay":
        print("ready", flush=True)
        sys.stdin.read()
    """
)


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the exposition ``text`` (labels matched exactly, in any order)."""
    for line in text.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if found == labels:
            return float(match.group(3))
    raise AssertionError(f"no sample {name}{labels} in:\n{text}")


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[metrics.MetricsEndpoint]:
    served = metrics.serve_metrics("127.0.0.1", free_port(), offline_buffer=tmp_path / "offline.jsonl")
    try:
        yield served
    finally:
        served.close()


def run_worker(mode: str, **kwargs: Any) -> subprocess.Popen[str]:
    """A worker process (it inherits the metrics folder the endpoint exported)."""
    return subprocess.Popen([sys.executable, "-c", WORKER, mode, SECRET], cwd=REPO, text=True, **kwargs)


# -- labels --------------------------------------------------------------------------------------


def test_tool_label_keeps_served_names_only() -> None:
    assert metrics.tool_label("kb_memory_recall", SERVED) == "kb_memory_recall"
    assert metrics.tool_label(SECRET, SERVED) == "unknown"
    assert metrics.tool_label("deploy_pipeline", SERVED) == "unknown"


def test_error_kind_is_the_class_name_never_the_message() -> None:
    assert metrics.error_kind(NotFoundError(SECRET)) == "NotFoundError"
    assert metrics.error_kind(InvalidInputError(SECRET)) == "InvalidInputError"
    assert metrics.error_kind(DatabaseError(SECRET)) == "DatabaseError"
    assert metrics.error_kind(MemoryOffError()) == "MemoryOffError"
    assert metrics.error_kind(RuntimeError(SECRET)) == "internal"
    assert metrics.error_kind(ValueError(SECRET)) == "internal"
    assert metrics.error_kind(asyncio.CancelledError()) == "cancelled"


def test_every_metric_is_documented() -> None:
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    assert [name for name in metrics.METRIC_NAMES if f"`{name}" not in text] == []


# -- off unless serve asked for it -------------------------------------------------------------


def test_metrics_are_off_without_the_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(metrics.ENV_DIR, raising=False)
    assert metrics.start_worker(SERVED) is False
    metrics.record_tool_call("kb_memory_recall", 0.1, NotFoundError(SECRET))  # no-op, no error
    instruments.observe_embed_batch(3)  # no sink installed
    assert instruments.set_embed_batch_sink(None) is None


# -- the endpoint --------------------------------------------------------------------------------


def test_endpoint_owns_a_private_folder_and_gives_it_back(tmp_path: Path) -> None:
    before = {name: os.environ.get(name) for name in (metrics.ENV_DIR, metrics.PROMETHEUS_DIR)}
    served = metrics.serve_metrics("127.0.0.1", free_port())
    try:
        assert os.environ[metrics.ENV_DIR] == os.environ[metrics.PROMETHEUS_DIR] == str(served.directory)
        assert stat.S_IMODE(served.directory.stat().st_mode) == 0o700
        assert httpx.get(served.url, timeout=5).status_code == 200
    finally:
        served.close()
    assert not served.directory.exists()
    assert {name: os.environ.get(name) for name in before} == before


def test_a_taken_port_is_an_error_and_leaves_nothing_behind() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = os.environ.get(metrics.ENV_DIR)
        with pytest.raises(OSError, match=r"(?i)address"):
            metrics.serve_metrics("127.0.0.1", port)
        assert os.environ.get(metrics.ENV_DIR) == before


def test_offline_queue_depth_is_read_from_the_queue(endpoint: metrics.MetricsEndpoint, tmp_path: Path) -> None:
    text = httpx.get(endpoint.url, timeout=5).text
    assert sample(text, "osa_memory_offline_queue_depth") == 0
    queue = DurableQueue(tmp_path / "offline.jsonl")
    first, _ = queue.append({"fact": SECRET, "org_id": "acme", "assignment_id": "case-secret-7"})
    queue.append({"fact": "another", "org_id": "acme", "assignment_id": "case-secret-7"})
    queue.reject({first["id"]}, "token revoked")
    text = httpx.get(endpoint.url, timeout=5).text
    assert sample(text, "osa_memory_offline_queue_depth") == 1
    assert sample(text, "osa_memory_offline_queue_rejected") == 1
    assert SECRET not in text
    assert "case-secret-7" not in text
    assert "acme" not in text


def test_workers_add_up_and_dead_workers_leave_the_gauges(endpoint: metrics.MetricsEndpoint) -> None:
    for mode in ("exit", "kill"):  # one exits normally (atexit), one dies without atexit
        done = run_worker(mode, stderr=subprocess.PIPE)
        _, stderr = done.communicate(timeout=60)
        assert done.returncode == 0, stderr
    alive = run_worker("stay", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert alive.stdout is not None
        assert alive.stdout.readline().strip() == "ready"
        text = httpx.get(endpoint.url, timeout=5).text
    finally:
        alive.communicate("", timeout=30)

    # Histograms and counters: every process's counts, dead or alive.
    assert sample(text, "osa_memory_tool_duration_seconds_count", tool="kb_memory_recall") == 3
    assert sample(text, "osa_memory_tool_duration_seconds_count", tool="kb_memory_store") == 3
    assert sample(text, "osa_memory_tool_duration_seconds_count", tool="unknown") == 3
    assert sample(text, "osa_memory_tool_duration_seconds_bucket", tool="kb_memory_recall", le="0.025") == 3
    assert sample(text, "osa_memory_tool_duration_seconds_bucket", tool="kb_memory_store", le="0.25") == 0
    assert sample(text, "osa_memory_tool_errors_total", tool="kb_memory_store", kind="NotFoundError") == 3
    assert sample(text, "osa_memory_tool_errors_total", tool="unknown", kind="internal") == 3
    assert sample(text, "osa_memory_embed_batch_size_count") == 6
    assert sample(text, "osa_memory_embed_batch_size_sum") == 18
    assert sample(text, "osa_memory_embed_batch_size_bucket", le="1.0") == 3
    # Pool counters: popped once per sample, so each process's 7 requests count once per sample taken.
    requests = sample(text, "osa_memory_db_pool_requests_total")
    assert requests >= 3 * 7
    assert requests % 7 == 0
    assert sample(text, "osa_memory_db_pool_wait_seconds_total") == requests / 7 * 0.5
    # Pool gauges: the live worker's only (the exited one marked itself dead, the killed one was pruned).
    assert sample(text, "osa_memory_db_pool_connections") == 3
    assert sample(text, "osa_memory_db_pool_in_use") == 2
    assert sample(text, "osa_memory_db_pool_idle") == 1
    assert sample(text, "osa_memory_db_pool_max") == 8
    assert sample(text, "osa_memory_db_pool_waiting") == 2
    # Held assignments: counts of every process, gauges of the live one (its one scope, one fact left).
    assert sample(text, "osa_memory_held_full_reads_total") == 3
    assert sample(text, "osa_memory_held_dropped_total") == 3
    assert sample(text, "osa_memory_held_appends_total") == 0
    assert sample(text, "osa_memory_held_scopes") == 1
    assert sample(text, "osa_memory_held_facts") == 1
    assert sample(text, "osa_memory_held_bytes") > 0
    assert SECRET not in text
    assert "hunter2" not in text

    # Once the last worker has exited, no pool gauge counts it any more; the counts stay.
    text = httpx.get(endpoint.url, timeout=5).text
    assert not re.search(r"^osa_memory_db_pool_connections ", text, re.MULTILINE)
    assert sample(text, "osa_memory_tool_duration_seconds_count", tool="kb_memory_recall") == 3


def test_labels_are_only_tool_and_kind(endpoint: metrics.MetricsEndpoint) -> None:
    done = run_worker("exit", stderr=subprocess.PIPE)
    assert done.wait(60) == 0
    text = httpx.get(endpoint.url, timeout=5).text
    names = set(re.findall(r'(\w+)="', text))
    assert names <= {"tool", "kind", "le"}, names
    tools = set(re.findall(r'tool="([^"]*)"', text))
    assert tools <= {*SERVED, "unknown"}, tools
    kinds = set(re.findall(r'kind="([^"]*)"', text))
    assert kinds <= {"NotFoundError", "internal"}, kinds
