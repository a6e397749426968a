"""Smoke test of benchmarks/pg_statements.py, run as its users run it (its own process): without ``PG_CONN_STR``
it starts an embedded PostgreSQL of its own with pg_stat_statements loaded, and counts a store's statements per
call; a server that does not preload the extension is refused with what to do. The figures themselves come from
the full run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = REPO / "benchmarks" / "pg_statements.py"
SMALL = ["--assignments", "2", "--facts", "5", "--calls", "12", "--warmup", "2"]


def test_a_store_s_statements_are_counted_per_call(tmp_path: Path) -> None:
    out = tmp_path / "statements.json"
    env = {k: v for k, v in os.environ.items() if k != "PG_CONN_STR"}  # its own server, the extension loaded
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--phase", "store", *SMALL, "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    assert (result["phase"], result["calls"]) == ("store", 12)
    assert result["cluster_cpu_ms"] >= 0
    assert result["process_cpu_ms"] > 0
    writes = [s for s in result["statements"] if s["statement"].startswith("WITH g AS (INSERT INTO")]
    assert [w["runs_per_call"] for w in writes] == [1.0]  # one fact-writing statement per store
    assert writes[0]["exec_ms"] > 0
    assert "statements' own time" in done.stdout


def test_a_server_without_the_extension_is_refused(pg_conn_str: str) -> None:
    done = run_benchmark(SCRIPT, ["--phase", "recall", *SMALL], pg_conn_str, succeeds=False)
    assert done.returncode != 0
    assert "does not preload pg_stat_statements" in done.stderr
