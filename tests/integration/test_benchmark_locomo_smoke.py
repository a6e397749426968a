"""Smoke test of the LoCoMo benchmark harness (benchmarks/locomo.py) on a tiny made-up LoCoMo-format file.

The harness runs as a separate process against the session's PostgreSQL (``PG_CONN_STR``), lexical
mode for speed. It must store every turn, score every question that has evidence, report metrics
in [0, 1], and find a question whose evidence is one distinctive turn at rank 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HARNESS = REPO / "benchmarks" / "locomo.py"


def _turns(session: int, speakers: tuple[str, str], texts: list[str]) -> list[dict[str, str]]:
    return [{"speaker": speakers[i % 2], "dia_id": f"D{session}:{i + 1}", "text": text} for i, text in enumerate(texts)]


def tiny_locomo() -> list[dict[str, Any]]:
    """Two conversations, 12 turns, 6 questions (one without evidence, malformed evidence ids included)."""
    ines = ("Ines", "Tomas")
    kayak = {
        "sample_id": "tiny conv/1",  # needs sanitising into an assignment id
        "conversation": {
            "speaker_a": "Ines",
            "speaker_b": "Tomas",
            "session_1_date_time": "9:15 am on 3 March, 2024",
            "session_1": _turns(
                1,
                ines,
                [
                    "Morning Tomas! How was your week?",
                    "Busy, but good. I finally repainted the shed a deep green.",
                    "I bought a yellow sea kayak in Porto last weekend.",
                    "Nice! Are you going to paddle along the Douro?",
                ],
            ),
            "session_2_date_time": "6:40 pm on 17 March, 2024",
            "session_2": _turns(
                2,
                ines,
                [
                    "My sourdough starter is called Bartholomew and it smells of green apples.",
                    "Ha, that is a great name for a starter.",
                    "The kayak club meets every Thursday at the old harbour.",
                ],
            ),
        },
        "qa": [
            {
                "question": "What colour is the sea kayak Ines bought in Porto?",
                "answer": "yellow",
                "evidence": ["D1:03"],
                "category": 4,
            },
            {
                "question": "What is the sourdough starter called?",
                "answer": "Bartholomew",
                "evidence": ["D2:1; D:1:2"],
                "category": 1,
            },
            {"question": "Would Ines enjoy a sailing holiday?", "answer": "probably", "evidence": [], "category": 3},
        ],
    }
    noor = ("Noor", "Kofi")
    garden = {
        "sample_id": "tiny-conv-2",
        "conversation": {
            "speaker_a": "Noor",
            "speaker_b": "Kofi",
            "session_1_date_time": "2:05 pm on 9 July, 2023",
            "session_1": _turns(
                1,
                noor,
                [
                    "I planted twelve tomato seedlings on the balcony.",
                    "Which variety did you choose?",
                    "Mostly San Marzano, plus two cherry plants.",
                    "My cousin Adaeze is visiting from Accra in August.",
                    "Great, you can show her the tomatoes then.",
                ],
            ),
        },
        "qa": [
            {
                "question": "Which tomato variety did Noor plant?",
                "answer": "San Marzano",
                "evidence": ["D1:3"],
                "category": 4,
            },
            {
                "question": "When is Adaeze visiting?",
                "answer": "August 2023",
                "evidence": ["D1:4", "D"],
                "category": 2,
            },
            {
                "question": "How many tomato seedlings did Kofi plant?",
                "adversarial_answer": "twelve",
                "evidence": ["D1:1"],
                "category": 5,
            },
        ],
    }
    return [kayak, garden]


def run_harness(pg_conn_str: str, tmp_path: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The harness on the tiny file, lexical, per-question results in ``out``; it must exit 0."""
    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps(tiny_locomo()), encoding="utf-8")
    env = {**os.environ, "PG_CONN_STR": pg_conn_str, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            *(sys.executable, str(HARNESS), "--data", str(data), "--embedder", "none", "--json", str(out)),
            *("--per-question", "--no-progress", *extra),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_locomo_harness_on_a_tiny_file(pg_conn_str: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = run_harness(pg_conn_str, tmp_path, out)
    printed = proc.stdout
    for label in ("R@1", "R@5", "R@10", "R@20", "R@50", "MRR", "nDCG@10", "no-cat-5", "store:", "latency"):
        assert label in printed, f"{label!r} missing from the printed report:\n{printed}"

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["conversations"] == 2
    assert report["turns"] == 12
    assert report["questions"] == 6
    assert report["scored_questions"] == 5  # the question without evidence is not scored
    assert report["dropped_evidence_ids"] == 1  # "D" names no turn
    (result,) = report["results"].values()
    assert result["timing"]["facts"] == 12
    assert result["timing"]["queries"] == 5
    metrics = result["metrics"]
    assert {"all", "no-cat-5", "cat-1", "cat-2", "cat-4", "cat-5"} <= set(metrics)
    for group, values in metrics.items():
        for name in ("R@1", "R@5", "R@10", "R@20", "R@50", "MRR", "nDCG@10"):
            assert 0.0 <= values[name] <= 1.0, (group, name, values[name])
    assert metrics["all"]["n"] == 5
    assert metrics["no-cat-5"]["n"] == 4

    by_question = {q["question"]: q for q in result["per_question"]}
    kayak = by_question["What colour is the sea kayak Ines bought in Porto?"]
    assert kayak["evidence"] == ["D1:3"]  # "D1:03" normalised
    assert kayak["top"][0] == ["D1:3"]
    assert kayak["R@1"] == 1.0
    assert kayak["MRR"] == 1.0
    starter = by_question["What is the sourdough starter called?"]
    assert starter["evidence"] == ["D2:1", "D1:2"]  # "D2:1; D:1:2" split and normalised
    assert starter["top"][0] == ["D2:1"]


def test_storing_one_turn_per_memory_store_recalls_the_same(pg_conn_str: str, tmp_path: Path) -> None:
    """`--store-through memory` stores each turn with `Memory.store` (as `kb_memory_store` does, with the
    search for what it may replace): recall answers as after the batched store pipeline."""
    tops = {}
    for path in ("pipeline", "memory"):
        out = tmp_path / f"{path}.json"
        run_harness(pg_conn_str, tmp_path, out, "--store-through", path)
        (result,) = json.loads(out.read_text(encoding="utf-8"))["results"].values()
        assert result["timing"]["facts"] == 12
        tops[path] = {q["question"]: q["top"] for q in result["per_question"]}
    assert len(tops["memory"]) == 5
    assert tops["memory"] == tops["pipeline"]


@pytest.mark.embeddings
def test_document_precision_flag(pg_conn_str: str, tmp_path: Path) -> None:
    """`--document-precision int8` stores the turns with int8 MiniLM vectors (queries keep the product's
    precision); the report says which precisions ran."""
    out = tmp_path / "int8.json"
    proc = run_harness(pg_conn_str, tmp_path, out, "--embedder", "minilm", "--document-precision", "int8")
    assert "MiniLM precision: documents int8, queries int8" in proc.stdout
    report = json.loads(out.read_text(encoding="utf-8"))
    assert (report["document_precision"], report["query_precision"]) == ("int8", "int8")
    (result,) = report["results"].values()
    assert result["timing"]["facts"] == 12
    assert result["timing"]["degraded_queries"] == 0
    by_question = {q["question"]: q for q in result["per_question"]}
    assert by_question["What colour is the sea kayak Ines bought in Porto?"]["top"][0] == ["D1:3"]
