"""Smoke test of benchmarks/first_recall.py: a 300-fact lexical run in this process against the session's
PostgreSQL (``PG_CONN_STR``). It checks that every figure is produced, that the import refreshed the
statistics and that the first recall answered; the figures themselves come from the full run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_first_recall_benchmark_runs(pg_conn_str: str, tmp_path: Path) -> None:
    script = load_benchmark(REPO / "benchmarks" / "first_recall.py", "first_recall_under_test")
    out = tmp_path / "first_recall.json"
    assert script.main(["--facts", "300", "--modes", "lexical", "--json", str(out)]) == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["machine"]["cores"] >= 1
    (result,) = data["results"]
    assert (result["facts"], result["mode"], result["stored"], result["facts_returned"]) == (300, "lexical", 300, 8)
    assert result["analyzed"] is True
    assert result["first_recall_ms"] > 0
    assert result["later_recalls_p50_ms"] > 0
