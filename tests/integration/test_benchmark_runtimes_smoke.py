"""Smoke test of benchmarks/runtimes.py: both runtimes load as asked, every figure is measured and printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark, run_with_json

pytestmark = [pytest.mark.slow, pytest.mark.embeddings]


def test_both_runtimes_are_measured_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_with_json("runtimes", ["--queries", "4", "--facts", "3", "--rounds", "2"], tmp_path)
    printed = capsys.readouterr().out
    assert result["loaded"]["torch query"] == {"runtime": "torch", "precision": "int8"}
    assert result["loaded"]["onnx query"] == {"runtime": "onnx", "precision": "int8"}
    assert result["loaded"]["torch fact"] == {"runtime": "torch", "precision": "float16"}
    assert result["loaded"]["onnx fact"] == {"runtime": "onnx", "precision": "int8-cls"}  # the product's default
    for kind in ("query", "fact"):
        k = result[kind]
        assert len(k["torch"]["rounds_ms"]) == len(k["onnx"]["rounds_ms"]) == 2
        assert all(ms > 0 for r in ("torch", "onnx") for ms in k[r]["rounds_ms"])
        assert k["ratio"] == pytest.approx(k["onnx"]["cpu_ms"] / k["torch"]["cpu_ms"])
        assert 0.9 < k["onnx"]["cosine_to_float32"]["min"] <= 1.0 + 1e-6
        assert f"{kind:8s} {k['torch']['cpu_ms']:13.3f}" in printed
    assert result["fact"]["torch"]["cosine_to_float32"]["min"] > 0.9999  # float16 weights: the float32 vectors
    float32 = run_with_json(
        "runtimes", ["--queries", "1", "--facts", "2", "--rounds", "1", "--onnx-facts", "float32"], tmp_path
    )
    assert float32["loaded"]["onnx fact"] == {"runtime": "onnx", "precision": "float32"}
    assert float32["fact"]["onnx"]["cosine_to_float32"]["min"] > 0.99999  # the float32 graph


def test_counts_must_be_positive() -> None:
    script = load_benchmark(REPO / "benchmarks" / "runtimes.py", "runtimes_under_test")
    with pytest.raises(SystemExit):
        script.main(["--queries", "0"])
