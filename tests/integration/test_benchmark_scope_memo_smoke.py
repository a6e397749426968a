"""Smoke test of benchmarks/scope_memo.py: a few short blocks each way in this process against the session's
PostgreSQL (``PG_CONN_STR``). It checks that both ways ran and were measured, that recalls were answered from
memory in the memo's blocks, and that the repository is left with its memo; the figures themselves come from
the full run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("phase", ["recall", "store"])
def test_scope_memo_benchmark_switches_and_measures(pg_conn_str: str, tmp_path: Path, phase: str) -> None:
    script = load_benchmark(REPO / "benchmarks" / "scope_memo.py", "scope_memo_under_test")
    out = tmp_path / "memo.json"
    argv = ["--phase", phase, "--assignments", "2", "--facts", "5", "--block", "4", "--rounds", "2"]
    assert script.main([*argv, "--warmup", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["machine"]["cores"] >= 1
    result = data["result"]
    assert (result["phase"], result["block"], result["rounds"]) == (phase, 4, 2)
    assert result["server"]["exact_ms"] > 0
    assert result["server"]["memo_ms"] > 0
    assert result["total"]["ratio"] > 0
    memo = result["memo"]
    assert memo["reads"] >= 2  # each scope read once at least
    if phase == "recall":
        assert memo["hits"] > 0  # nothing written: answered from memory
        assert memo["changed"] == 0
    else:
        assert memo["changed"] > 0  # every store changes its scope
