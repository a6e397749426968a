"""Smoke test of benchmarks/call_parts.py: every part, small, in this process against the session's PostgreSQL
(``PG_CONN_STR``). It checks that each way ran as it says (stores answered with or without suggestions), that
the read statements were explained and no write was (an ``EXPLAIN ANALYZE`` of a write would store twice);
the figures themselves come from the full run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run(tmp_path: Path, *argv: str) -> dict[str, object]:
    script = load_benchmark(REPO / "benchmarks" / "call_parts.py", "call_parts_under_test")
    out = tmp_path / "parts.json"
    assert script.main([*argv, "--assignments", "2", "--facts", "5", "--warmup", "1", "--json", str(out)]) == 0
    result: dict[str, object] = json.loads(out.read_text(encoding="utf-8"))["result"]
    return result


def test_search_part_measures_stores_with_and_without_the_search(pg_conn_str: str, tmp_path: Path) -> None:
    result = run(tmp_path, "--part", "search", "--block", "3", "--rounds", "2")
    # 1 warm-up store and 2 blocks of 3 each way: every store with the search answered with suggestions.
    assert result["answers_with_suggestions"] == {"with_search": 7, "without_search": 0}
    server = result["server"]
    assert isinstance(server, dict)
    assert server["without_ms"] > 0
    assert server["with_ms"] > 0


def test_plans_part_explains_reads_and_never_a_write(pg_conn_str: str, tmp_path: Path) -> None:
    result = run(tmp_path, "--part", "plans", "--calls", "3")
    statements = result["statements"]
    assert isinstance(statements, list)
    by_text = {s["statement"]: s for s in statements}

    def runs(prefix: str) -> int:
        return sum(int(s["runs"]) for text, s in by_text.items() if text.startswith(prefix))

    # 3 recalls and the 3 stores' searches for the facts they replace each end with one scope read: the whole
    # scope (`SCOPE_RECALL_ROWS`, with the query's terms), or the rows kept in memory with their print
    # (`scope_memo.MEMO_ROWS`), or neither when the print read with the query's terms (`MEMO_PRINT`) says the rows
    # kept are current (a store's own fact joins them). `SCOPE_ROWS` (the chunk fallback) never runs: every fact
    # here has its recall row.
    exact, printed, kept = runs("WITH q(lexemes, hashes)"), runs("SELECT q.*, p.*"), runs("WITH m AS MATERIALIZED")
    assert runs("WITH s AS MATERIALIZED") == 0
    assert kept >= 1  # the first recall of a scope keeps its rows
    assert exact + kept <= 6 <= exact + kept + printed
    assert exact == 0  # each store's fact joined the rows kept: its search read the print alone
    assert all(s["planning_ms"] > 0 and s["execution_ms"] >= 0 for s in statements)
    assert not any("INSERT" in text.upper() for text in by_text)
    not_explained = result["not_explained"]
    assert isinstance(not_explained, dict)
    assert sum(not_explained.values()) >= 3  # the 3 stores' writes (at least)
    # Each store wrote once (one audit row each): the warm-up store and the 3 measured ones.
    assert result["store_audit_rows"] == result["stores"] == 4


@pytest.mark.parametrize("phase", ["store", "recall", "read"])
def test_exact_part_measures_the_exact_path_both_ways(pg_conn_str: str, tmp_path: Path, phase: str) -> None:
    from haystack_osa_memory.store.facts import FactRepository

    in_one = FactRepository.__dict__["_exact_hits"]
    result = run(tmp_path, "--part", "exact", "--phase", phase, "--block", "3", "--rounds", "2")
    assert result["part"] == "exact"
    assert result["phase"] == phase
    for part in ("server", "total"):
        figures = result[part]
        assert isinstance(figures, dict)
        assert figures["apart_ms"] > 0
        assert figures["one_ms"] > 0
    assert FactRepository.__dict__["_exact_hits"] is in_one  # the package's way is what is left


def test_exact_reads_refuse_a_query_vector() -> None:
    script = load_benchmark(REPO / "benchmarks" / "call_parts.py", "call_parts_under_test")
    with pytest.raises(SystemExit):
        script.main(["--part", "exact", "--phase", "read", "--embedder", "minilm"])


def test_join_part_measures_stores_with_and_without_the_join(pg_conn_str: str, tmp_path: Path) -> None:
    result = run(tmp_path, "--part", "join", "--block", "6", "--rounds", "2")
    assert result["part"] == "join"
    # 2 blocks a way, each from scopes read again: the first store of each of the 2 scopes reads them, the rest join.
    assert result["joins"] == {"apart": 0, "joined": 2 * (6 - 2)}
    for part in ("server", "total"):
        figures = result[part]
        assert isinstance(figures, dict)
        assert figures["apart_ms"] > 0
        assert figures["joined_ms"] > 0


def test_since_part_measures_stores_of_two_memories_caught_up_and_not(pg_conn_str: str, tmp_path: Path) -> None:
    result = run(tmp_path, "--part", "since", "--block", "8", "--rounds", "2")
    assert result["part"] == "since"
    caught, routes = result["caught"], result["routes"]
    assert caught["exact"] == 0
    assert caught["caught_up"] > 0  # each memory's print misses the other's facts, and catches up with them
    assert sum(routes["exact"].values()) == sum(routes["caught_up"].values()) > 0  # every search, recorded each way
    assert routes["caught_up"].get("exact", 0) == 0  # never skipping the print
    for part in ("server", "total"):
        figures = result[part]
        assert isinstance(figures, dict)
        assert figures["exact_ms"] > 0
        assert figures["caught_up_ms"] > 0
