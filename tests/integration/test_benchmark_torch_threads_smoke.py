"""Smoke test of benchmarks/torch_threads.py: four fresh processes, each way measured and printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark

pytestmark = [pytest.mark.slow, pytest.mark.embeddings]


def test_each_way_runs_in_its_own_process_and_is_compared_with_one_thread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_benchmark(REPO / "benchmarks" / "torch_threads.py", "torch_threads_under_test")
    out = tmp_path / "threads.json"
    result = script.main(["--calls", "5", "--json", str(out)])
    printed = capsys.readouterr().out
    assert result is not None
    assert json.loads(out.read_text())["ways"] == result["ways"]
    ways = {w["way"]: w for w in result["ways"]}
    assert list(ways) == [label for label, _, _ in script.WAYS]
    assert ways["1 thread, 1 caller"]["torch_threads"] == 1
    assert ways["1 thread, 2 callers"]["torch_threads"] == 1
    assert ways["per CPU, 2 callers"]["torch_threads"] == ways["per CPU, 1 caller"]["torch_threads"] >= 1
    base = ways["1 thread, 1 caller"]
    for way in ways.values():
        assert way["cpu_ms"] > 0
        assert way["wall_ms"] > 0
        assert way["cpu_ratio"] == pytest.approx(way["cpu_ms"] / base["cpu_ms"])
        assert f"{way['way']:22s} {way['torch_threads']:13d}" in printed
    assert base["cpu_ratio"] == 1.0


def test_calls_must_be_positive() -> None:
    script = load_benchmark(REPO / "benchmarks" / "torch_threads.py", "torch_threads_under_test")
    with pytest.raises(SystemExit):
        script.main(["--calls", "0"])
