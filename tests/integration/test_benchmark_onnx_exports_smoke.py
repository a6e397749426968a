"""Smoke test of benchmarks/onnx_exports.py: the model exported both ways, each way's sessions timed side by side,
the graphs' nodes and the vectors' differences reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark, run_with_json

pytestmark = [pytest.mark.slow, pytest.mark.embeddings]


def test_both_exports_are_measured_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_with_json("onnx_exports", ["--queries", "3", "--facts", "2", "--rounds", "2"], tmp_path)
    printed = capsys.readouterr().out
    assert result["precision"] == {"query": "int8", "fact": "int8-cls"}  # the product's defaults
    assert result["nodes"]["eager"] < result["nodes"]["sdpa"]  # the shape bookkeeping and NaN guards are gone
    for kind in ("query", "fact"):
        k = result[kind]
        assert len(k["sdpa"]["rounds_ms"]) == len(k["eager"]["rounds_ms"]) == 2
        assert all(ms > 0 for w in ("sdpa", "eager") for ms in k[w]["rounds_ms"])
        assert k["ratio"] == pytest.approx(k["eager"]["cpu_ms"] / k["sdpa"]["cpu_ms"])
        assert k["max_difference"] < 0.05  # the same model: quantization rounding apart
        assert f"{k['sdpa']['cpu_ms']:12.3f}" in printed


def test_counts_must_be_positive() -> None:
    script = load_benchmark(REPO / "benchmarks" / "onnx_exports.py", "onnx_exports_under_test")
    with pytest.raises(SystemExit):
        script.main(["--rounds", "0"])
