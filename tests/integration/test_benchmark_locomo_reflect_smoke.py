"""Smoke test of the LoCoMo harness's reflect measurement (`benchmarks/locomo.py --reflect`) on a tiny
made-up conversation holding repeats (merged) and near-duplicates with other values (never merged)."""

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


def question(text: str, evidence: str) -> dict[str, Any]:
    return {"question": text, "answer": "-", "evidence": [evidence], "category": 4}


def conversation() -> list[dict[str, Any]]:
    # Turns alternate speakers: the repeat (turns 1 and 3) is Ines's twice; the fees differ in their number.
    texts = [
        "I bought a yellow sea kayak in Porto last weekend.",
        "The kayak club fee is 300 euros for the whole season this year.",
        "I bought a yellow sea kayak in Porto last weekend!",
        "The kayak club fee is 350 euros for the whole season this year.",
        "My sourdough starter is called Bartholomew and it smells of green apples.",
        "The kayak club meets every Thursday at the old harbour.",
    ]
    turns = [{"speaker": ("Ines", "Tomas")[i % 2], "dia_id": f"D1:{i + 1}", "text": t} for i, t in enumerate(texts)]
    return [
        {
            "sample_id": "reflect-1",
            "conversation": {
                "speaker_a": "Ines",
                "speaker_b": "Tomas",
                "session_1_date_time": "9:15 am on 3 March, 2024",
                "session_1": turns,
            },
            "qa": [
                question("Where did Ines buy the sea kayak?", "D1:3"),
                question("What was the club fee of 300 euros for?", "D1:2"),
                question("What club fee of 350 euros?", "D1:4"),
                question("When does the kayak club meet?", "D1:6"),
            ],
        }
    ]


def test_reflect_keeps_every_question_answered(pg_conn_str: str, tmp_path: Path) -> None:
    data = tmp_path / "reflect_locomo.json"
    data.write_text(json.dumps(conversation()), encoding="utf-8")
    out = tmp_path / "out.json"
    env = {**os.environ, "PG_CONN_STR": pg_conn_str, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            *(sys.executable, str(HARNESS), "--data", str(data), "--embedder", "none", "--json", str(out)),
            *("--store-through", "memory", "--reflect", "--per-question", "--no-progress"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text(encoding="utf-8"))["results"]
    before, after = results["lexical"], results["lexical+reflect"]
    stats = after["timing"]["reflect"]
    assert (stats["observations"], stats["facts_consolidated"]) == (1, 2)  # the repeated kayak turn only
    assert stats["questions_with_lower_r10"] == 0
    assert after["metrics"]["all"]["R@10"] >= before["metrics"]["all"]["R@10"]
    kayak = next(q for q in after["per_question"] if "sea kayak" in q["question"])
    assert kayak["top"][0] == ["D1:1", "D1:3"]  # the observation stands for both turns
