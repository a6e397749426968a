"""benchmarks/queue_durability.py runs small: two rounds of each kind for each queue, with no loss counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark

pytestmark = pytest.mark.slow


def test_the_benchmark_runs_small_and_counts_no_loss(tmp_path: Path) -> None:
    script = load_benchmark(REPO / "benchmarks" / "queue_durability.py", "queue_durability_under_test")
    report = script.main(["--rounds", "2", "--throughput-items", "10", "--repeat", "1", "--dir", str(tmp_path)])
    assert set(report["results"]) == {
        f"{k}/{r}" for k in ("jsonl", "sqlite-wal") for r in ("append", "replay", "throughput")
    }
    for name, row in report["results"].items():
        if name.endswith("/throughput"):
            assert row["append_per_s"] > 0
            continue
        assert row["rounds"] == 2
        assert row["acked"] > 0
        assert (row["lost"], row["torn"], row["after_kill_lost"]) == (0, 0, 0), name
    assert [p.name for p in tmp_path.iterdir()] == []  # every round's folder is removed
