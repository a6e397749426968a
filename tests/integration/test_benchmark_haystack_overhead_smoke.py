"""Smoke test of benchmarks/haystack_overhead.py: a few short blocks of each part, each way, in this process
against the session's PostgreSQL; both ways measured, and the package's way left in place afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from haystack.core.pipeline.base import PipelineBase

import haystack_osa_memory.pipeline_inputs as pipeline_inputs
from haystack_osa_memory.components.fact_document import FactDocument
from haystack_osa_memory.pipeline_spans import lean_component_span
from tests.conftest import REPO, load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize(("part", "phase"), [("spans", "recall"), ("documents", "recall"), ("copies", "store")])
def test_each_part_is_measured_both_ways(pg_conn_str: str, tmp_path: Path, part: str, phase: str) -> None:
    lean_of = FactDocument.__dict__["of"]
    lean_copy = pipeline_inputs.copy_document
    script = load_benchmark(REPO / "benchmarks" / "haystack_overhead.py", "haystack_overhead_under_test")
    out = tmp_path / "overhead.json"
    argv = [
        "--part",
        part,
        "--phase",
        phase,
        "--assignments",
        "2",
        "--facts",
        "5",
        "--block",
        "4",
        "--rounds",
        "2",
        "--warmup",
        "2",
    ]
    assert script.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))["result"]
    assert result["part"] == part
    assert result["server"]["haystack_ms"] > 0
    assert result["server"]["lean_ms"] > 0
    assert result["total"]["ratio"] > 0
    # The package's way is what is left (the last switch is to it).
    assert PipelineBase.__dict__["_create_component_span"].__func__ is lean_component_span
    assert FactDocument.__dict__["of"] is lean_of
    assert pipeline_inputs.copy_document is lean_copy


def test_an_unknown_part_is_refused() -> None:
    script = load_benchmark(REPO / "benchmarks" / "haystack_overhead.py", "haystack_overhead_under_test")
    with pytest.raises(SystemExit):
        script.main(["--part", "everything"])
