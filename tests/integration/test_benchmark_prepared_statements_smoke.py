"""Smoke test of benchmarks/prepared_statements.py: a few short blocks each way in this process against the
session's PostgreSQL; both ways measured, and the pool's connections left preparing afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from haystack_osa_memory.store.database import PREPARE_AFTER, get_pool
from tests.conftest import REPO, load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("phase", ["recall", "store"])
def test_both_ways_are_measured(pg_conn_str: str, tmp_path: Path, phase: str, monkeypatch: pytest.MonkeyPatch) -> None:
    script = load_benchmark(REPO / "benchmarks" / "prepared_statements.py", "prepared_statements_under_test")
    seen: list[object] = []
    real_to = script.two_ways

    def two_ways(args: object, prefix: str, ways: object, to: object) -> object:
        def spying(memory: object) -> object:
            switch = to(memory)  # type: ignore[operator]

            def both(prepared: bool) -> None:
                switch(prepared)
                store = memory.kb  # type: ignore[attr-defined]
                pool = get_pool(store.conn_str, store.config)
                seen.append((prepared, {conn.prepare_threshold for conn in pool._pool}))

            return both

        return real_to(args, prefix, ways, spying)

    monkeypatch.setattr(script, "two_ways", two_ways)
    out = tmp_path / "prepared.json"
    argv = ["--phase", phase, "--assignments", "2", "--facts", "5", "--block", "4", "--rounds", "2", "--warmup", "2"]
    assert script.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))["result"]
    assert result["phase"] == phase
    assert result["server"]["unprepared_ms"] > 0
    assert result["server"]["prepared_ms"] > 0
    assert result["total"]["ratio"] > 0
    # Each block ran with every idle connection switched, and the last switch is back to preparing.
    assert (False, {None}) in seen
    assert (True, {PREPARE_AFTER}) in seen
    assert seen[-1] == (True, {PREPARE_AFTER})
