"""Smoke test of benchmarks/precisions.py: each precision loads as asked, every figure is measured and printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark, run_with_json

pytestmark = [pytest.mark.slow, pytest.mark.embeddings]


def test_precisions_are_measured_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--queries", "3", "--facts", "3", "--rounds", "2", "--fact-precisions", "mixed,int8-cls,float32"]
    result = run_with_json("precisions", argv, tmp_path)
    printed = capsys.readouterr().out
    assert result["runtime"] == "onnx"
    assert result["loaded"] == {
        "fact mixed": {"runtime": "onnx", "precision": "mixed"},
        "fact int8-cls": {"runtime": "onnx", "precision": "int8-cls"},
        "fact float32": {"runtime": "onnx", "precision": "float32"},
        "query int8": {"runtime": "onnx", "precision": "int8"},
        "query int8-cls": {"runtime": "onnx", "precision": "int8-cls"},
    }
    for kind, first in (("fact", "mixed"), ("query", "int8")):
        for precision, k in result[kind].items():
            assert len(k["rounds_ms"]) == 2
            assert all(ms > 0 for ms in k["rounds_ms"])
            assert k["ratio"] == pytest.approx(k["cpu_ms"] / result[kind][first]["cpu_ms"])
            assert 0.9 < k["cosine_to_float32"]["min"] <= 1.0 + 1e-6
            assert f"{kind + ' ' + precision:22s} {k['cpu_ms']:8.3f}" in printed
    assert result["fact"]["float32"]["cosine_to_float32"]["min"] > 0.99999  # the float32 graph itself


@pytest.mark.parametrize("bad", ["", "int4", "int8,bfloat16"])
def test_unknown_precisions_are_refused(bad: str) -> None:
    script = load_benchmark(REPO / "benchmarks" / "precisions.py", "precisions_under_test")
    with pytest.raises(SystemExit):
        script.main(["--fact-precisions", bad])
