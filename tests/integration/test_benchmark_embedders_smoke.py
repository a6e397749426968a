"""Smoke test of the embedder comparison (benchmarks/embedders.py) on a tiny LoCoMo-format file.

Only our MiniLM embedders and sentence-transformers' torch backend run (no ONNX or OpenVINO
packages needed). The script's ``main(argv)`` runs in this process against the session's PostgreSQL
(``PG_CONN_STR``): agreement, query latency, document throughput and LoCoMo recall through the
product must be printed and plausible; the fresh-process memory probe runs once, for ours.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO, load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.embeddings]

SCRIPT = REPO / "benchmarks" / "embedders.py"
BACKENDS = ["ours-int8", "ours-fp32", "st-torch"]


def load_script() -> ModuleType:
    return load_benchmark(SCRIPT, "embedders_under_test")


def _turns(session: int, speakers: tuple[str, str], texts: list[str]) -> list[dict[str, str]]:
    return [{"speaker": speakers[i % 2], "dia_id": f"D{session}:{i + 1}", "text": text} for i, text in enumerate(texts)]


def tiny_locomo() -> list[dict[str, Any]]:
    """One conversation, 6 turns, 3 questions with evidence."""
    return [
        {
            "sample_id": "emb-kayak",
            "conversation": {
                "speaker_a": "Ines",
                "speaker_b": "Tomas",
                "session_1_date_time": "9:15 am on 3 March, 2024",
                "session_1": _turns(
                    1,
                    ("Ines", "Tomas"),
                    [
                        "Morning Tomas! How was your week?",
                        "Busy, but good. I finally repainted the shed a deep green.",
                        "I bought a yellow sea kayak in Porto last weekend.",
                        "My sourdough starter is called Bartholomew and it smells of green apples.",
                        "The kayak club meets every Thursday at the old harbour.",
                        "x",
                    ],
                ),
            },
            "qa": [
                {"question": "What colour is the kayak Ines bought?", "evidence": ["D1:3"], "category": 4},
                {"question": "What is the sourdough starter called?", "evidence": ["D1:4"], "category": 4},
                {"question": "When does the kayak club meet?", "evidence": ["D1:5"], "category": 4},
            ],
        }
    ]


def test_embedder_benchmark_core(pg_conn_str: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps(tiny_locomo()), encoding="utf-8")
    out = tmp_path / "embedders.json"
    argv = ["--data", str(data), "--backends", ",".join(BACKENDS), "--json", str(out), "--no-memory"]
    argv += ["--agreement-texts", "6", "--queries", "3", "--throughput-texts", "6", "--throughput-rounds", "1"]
    assert load_script().main(argv) == 0
    printed = capsys.readouterr().out

    for label in ("doc cos min/mean", "query cos min/mean", "query p50/p95 ms", "p50 vs ours", "docs/s", "R@10"):
        assert label in printed, f"{label!r} missing from the printed table:\n{printed}"
    rows = {line.split()[0]: line for line in printed.splitlines() if line.split()[:1] and line.split()[0] in BACKENDS}
    assert set(rows) == set(BACKENDS), printed
    assert re.search(r"\b1\.00x\b", rows["ours-int8"]), rows["ours-int8"]  # ours is the ratio's base

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["unavailable"] == {}
    agreement = report["agreement"]
    # The same model, the same float32 arithmetic: sentence-transformers' torch backend gives our vectors.
    assert agreement["st-torch"]["doc_cos_min"] > 0.99
    assert agreement["st-torch"]["query_cos_min"] > 0.99
    assert agreement["ours-fp32"]["doc_cos_min"] > 0.9999  # the reference against itself
    # ours-int8 stores facts in the product's default precision (`int8-cls`: int8, the first token quantized apart).
    assert 0.98 < agreement["ours-int8"]["doc_cos_min"] <= 1.0 + 1e-6
    assert 0.85 < agreement["ours-int8"]["query_cos_min"] <= 1.0  # int8 queries: close, not equal
    for name in BACKENDS:
        assert agreement[name]["dimension"] == 384
        latency = report["latency"][name]
        assert latency["n"] == 3
        assert 0 < latency["p50_ms"] <= latency["p95_ms"] < 5000
        assert report["throughput"][name]["texts"] == 6
        assert report["throughput"][name]["texts_per_s"] > 0
        locomo = report["locomo"][name]
        assert locomo["questions"] == 3
        assert 0.0 <= locomo["R@5"] <= locomo["R@10"] <= 1.0
        assert locomo["R@10"] >= 2 / 3  # three distinctive one-turn answers among six facts
        assert locomo["degraded_queries"] == 0
    _check_document_cpu(report, printed, texts=12)  # the 6 turns, twice


def _check_document_cpu(report: dict[str, Any], printed: str, texts: int) -> None:
    assert "document CPU per text" in printed, printed
    figures = report["document_cpu"]
    assert list(figures) == ["float32-alone", "float32-batch8", "float16-alone", "int8-alone"]
    for name, f in figures.items():
        assert f["texts"] == texts, name
        assert 0 < f["cpu_ms_per_text"] < 5000, name
        assert 0 < f["wall_ms_per_text"] < 5000, name
        assert re.search(rf"^  {name} +cpu +[0-9.]+ ms/text", printed, re.MULTILINE), printed
    assert figures["float32-alone"]["cpu_vs_float32_alone"] == 1.0


def test_document_cpu_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--document-cpu-only``: no backend comparison, no database; the four ways of embedding a fact."""
    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps(tiny_locomo()), encoding="utf-8")
    out = tmp_path / "document_cpu.json"
    assert load_script().main(["--data", str(data), "--document-cpu-only", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text(encoding="utf-8"))
    assert "agreement" not in report
    assert "doc cos min/mean" not in printed
    assert report["machine"]["load_avg_at_end"]
    _check_document_cpu(report, printed, texts=12)


def test_memory_probe_runs_in_a_fresh_process(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, str(SCRIPT), "--probe", "ours-fp32", "--work-dir", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    assert probe["name"] == "ours-fp32"
    assert "error" not in probe, probe
    assert 10 < probe["delta_mb"] < 2000  # the model and its runtime are loaded
    assert probe["loaded_mb"] > probe["base_mb"]
    assert 0 < probe["load_seconds"] < 120
