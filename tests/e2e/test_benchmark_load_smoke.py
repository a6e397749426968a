"""Smoke test of the load benchmark (benchmarks/load.py): a real `serve --workers 2` driven by official MCP
clients from two processes, on the session's PostgreSQL, lexical mode for speed.

Every call must succeed, no recall may return another assignment's fact, and the figures it prints
and writes must be there and plausible (calls counted, latencies ordered, server memory measured).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_benchmark

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

HARNESS = REPO / "benchmarks" / "load.py"


def test_load_benchmark_smoke(pg_conn_str: str, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    plot = tmp_path / "load.png"
    args = [
        "--sweep", "2,4",
        "--assignments", "3",
        "--facts", "30",
        "--duration", "3",
        "--workers", "2",
        "--embedder", "none",
        "--json", str(out),
        "--plot", str(plot),
    ]  # fmt: skip
    done = run_benchmark(HARNESS, args, pg_conn_str)
    report = json.loads(out.read_text())
    assert [(r["phase"], r["clients"]) for r in report["results"]] == [
        ("recall", 2),
        ("store", 2),
        ("recall", 4),
        ("store", 4),
    ]
    for r in report["results"]:
        assert r["calls"] > 0, r
        assert r["errors"] == 0, r
        assert r["cross_scope"] == 0, r
        assert 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p95"] <= r["latency_ms"]["p99"], r
        assert r["per_second"] == pytest.approx(r["calls"] / r["seconds"], rel=0.01)
        assert r["server_rss_mib"] > 50, r  # the serve process and its workers were measured
    assert plot.stat().st_size > 10_000
    assert "calls/s" in done.stdout
