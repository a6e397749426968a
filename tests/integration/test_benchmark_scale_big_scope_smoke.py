"""Smoke test of the big-scope run of ``benchmarks/scale.py`` (``--big-scope``) at a tiny size.

The benchmark runs in its own process against the session's PostgreSQL (``PG_CONN_STR``), with the real
bundled MiniLM embedders: two assignments of 600 facts each are written through the product's writer
(``Memory.import_items``) and the first is recalled by 20 sampled facts' own texts and paraphrases. With
``--exact-scope-max 200`` the product takes the big-scope path at 600 facts, and the benchmark compares it
with the exact path on the same queries. The run must give every fact its recall row, embed each distinct
text once, find a fact by its own text on both paths, and report latency, hit rates, agreement and targets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.embeddings, pytest.mark.slow]

BENCHMARK = REPO / "benchmarks" / "scale.py"
SIZE = 600
QUERIES = 20
EXACT_SCOPE_MAX = 200
K = 8
ARGS = [
    "--big-scope", "--chunks", "200", "--assignments", "2", "--scope-sizes", str(SIZE),
    "--queries", str(QUERIES), "--exact-scope-max", str(EXACT_SCOPE_MAX),
]  # fmt: skip


@pytest.fixture(scope="module")
def run(pg_conn_str: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """(JSON report, stdout) of one small big-scope run."""
    out = tmp_path_factory.mktemp("big_scope") / "big_scope.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), *ARGS, "--json", str(out)],
        cwd=REPO,
        env={**os.environ, "PG_CONN_STR": pg_conn_str, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"scale.py failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return report, done.stdout


def test_facts_are_written_through_the_product_writer(run: tuple[dict[str, Any], str]) -> None:
    report, _ = run
    assert report["params"]["big_scope"] is True
    (size,) = report["big_scope"]["sizes"]
    assert size["facts"] == SIZE
    # Every fact has its recall row, usable by the big-scope path; the other assignment holds as many.
    assert size["recall_rows"] == {"scope": SIZE, "scope_indexed": SIZE, "table": 2 * SIZE}
    assert size["scope_size_seen_by_recall"] == SIZE
    write = size["write"]
    assert write["facts_written"] == 2 * SIZE
    assert write["facts_embedded"] == SIZE  # the other assignment's copies are not embedded again
    assert write["facts_per_s"] > 0
    assert write["embedded_per_s"] > 0


def test_both_paths_find_facts_by_their_own_text(run: tuple[dict[str, Any], str]) -> None:
    report, _ = run
    (size,) = report["big_scope"]["sizes"]
    assert size["product_path"] == "held"  # past exact_scope_max, within the cache: held in memory
    assert size["exact_scope_max"] == EXACT_SCOPE_MAX
    assert size["queries"] == 2 * QUERIES
    assert size["sampled_facts"] == QUERIES
    held, big, exact = size["paths"]["held"], size["paths"]["big"], size["paths"]["exact"]
    assert (held["exact_scope_max"], held["forced"], held["held"]) == (EXACT_SCOPE_MAX, False, True)
    assert (big["exact_scope_max"], big["forced"], big["held"]) == (EXACT_SCOPE_MAX, True, False)
    assert exact["forced"] is True
    assert exact["exact_scope_max"] > SIZE
    # Held in memory, the scope is ranked exactly: the same top k as the exact path for every query.
    assert size["held_agreement"] == {"identical_top_k_share": 1.0, "identical_order_share": 1.0}
    for name, path in (("held", held), ("big", big), ("exact", exact)):
        assert path["own_hit"] >= 0.9, (name, path)
        assert 0.0 <= path["para_hit"] <= 1.0, (name, path)
        assert path["degraded"] == 0, (name, path)
        assert path["mean_returned"] == K, (name, path)
        latency = path["latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"], (name, latency)
    query = size["query_embedding_ms"]
    assert 0 < query["p50"] <= query["p95"]
    assert size["speedup"]["p50"] > 0


def test_agreement_and_targets_are_reported(run: tuple[dict[str, Any], str]) -> None:
    report, stdout = run
    (size,) = report["big_scope"]["sizes"]
    agreement = size["agreement"]
    for key in ("identical_top_k_share", "identical_order_share", "mean_overlap", "min_overlap"):
        assert 0.0 <= agreement[key] <= 1.0, (key, agreement)
    assert agreement["identical_order_share"] <= agreement["identical_top_k_share"]
    assert agreement["min_overlap"] <= agreement["mean_overlap"]
    # Both paths find the queried fact by its own text nearly always, so their top 8 share at least that one.
    assert agreement["mean_overlap"] >= 1 / K
    assert set(agreement["by_kind"]) == {"own", "para"}

    targets = {t["target"]: t for t in report["big_scope"]["targets"]}
    assert len(targets) == 3
    own = next(t for name, t in targets.items() if name.startswith("own text"))
    assert own["met"] is True, own
    assert [t["met"] for name, t in targets.items() if not name.startswith("own text")] == [None, None]

    printed = " ".join(stdout.split())  # rich wraps long lines at word boundaries
    for label in ("Big-scope path vs exact path", "speed-up exact/big", f"same top-{K} set as exact", "target: own"):
        assert label in printed, f"{label!r} missing from the printed report:\n{stdout[-3000:]}"
