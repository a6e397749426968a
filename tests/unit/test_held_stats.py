"""What a process holds for big assignments (`scope_cache.held_stats`), as the metrics report it: scopes,
facts and bytes now, events since the last pop; a cache that is gone no longer counts."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np

from haystack_osa_memory.store import scope_cache

DIM = 3


class Cursor:
    """Answers `SCOPE_ROWS_AFTER` with fixed rows (check figures, then id, expires, seq, vector, dl, terms, scored)."""

    def __init__(self, n: int) -> None:
        vec = b"\x00\x03\x00\x00" + np.array([1, 0, 0], ">f4").tobytes()
        s = n * (n + 1) // 2
        self.rows = [(n, s, n, n, s, f"d{i}", None, i + 1, vec, 1.0, None, True) for i in range(n)]

    def execute(self, *args: Any) -> Cursor:
        return self

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


def hold(cache: scope_cache.ScopeCache, assignment: str, n: int) -> None:
    statements = scope_cache.Statements(check=None, rows_after=None)  # type: ignore[arg-type]
    now = scope_cache.Check(n, n * (n + 1) // 2, n)
    with cache.use(Cursor(n), statements, {"org_id": "acme", "assignment_id": assignment}, now) as held:  # type: ignore[arg-type]
        assert held is not None
        assert len(held) == n


def test_held_stats_counts_scopes_facts_bytes_and_events() -> None:
    gc.collect()  # caches of earlier tests that are already unreachable
    scope_cache.held_stats(pop=True)  # their events
    before = scope_cache.held_stats()
    cache = scope_cache.ScopeCache(100, DIM)
    hold(cache, "a", 3)
    hold(cache, "b", 2)
    cache.drop_facts(("acme", "a"), {"d1"})

    now = scope_cache.held_stats(pop=True)
    assert (now.scopes - before.scopes, now.facts - before.facts) == (2, 4)
    # At least the float32 vectors: room for 64 rows in "b", 2 rows in "a" (compacted by the drop).
    assert now.array_bytes - before.array_bytes >= (64 + 2) * DIM * 4
    assert (now.full_reads, now.appends, now.dropped) == (2, 0, 1)
    assert (scope_cache.held_stats().full_reads, scope_cache.held_stats().dropped) == (0, 0)  # popped

    del cache
    gc.collect()
    gone = scope_cache.held_stats()
    assert (gone.scopes, gone.facts) == (before.scopes, before.facts)


def test_a_scope_over_the_budget_is_not_counted() -> None:
    gc.collect()
    before = scope_cache.held_stats()
    cache = scope_cache.ScopeCache(2, DIM)
    statements = scope_cache.Statements(check=None, rows_after=None)  # type: ignore[arg-type]
    with cache.use(Cursor(3), statements, {"org_id": "acme", "assignment_id": "x"}, scope_cache.Check(3, 6, 3)) as held:  # type: ignore[arg-type]
        assert held is None
    assert scope_cache.held_stats().facts == before.facts
    assert cache.entries() == []


def test_rows_that_only_lend_context_are_never_ranked() -> None:
    """A held row marked unscored (a consolidated fact) is not returned but still counts in its neighbours'
    context window; an unscored row whose place a scored one took (same seq) is not held at all."""
    from haystack_osa_memory.store.ranking import RankingParams

    vec = b"\x00\x03\x00\x00" + np.array([1, 0, 0], ">f4").tobytes()
    entry = scope_cache.HeldScope(DIM)
    entry.append(
        [
            ("a", None, 1, vec, 1.0, None, True),
            ("b", None, 2, vec, 1.0, None, False),  # lends context
            ("c", None, 3, vec, 1.0, None, True),
            ("o", None, 4, vec, 1.0, None, True),  # an observation standing where "d" was
            ("d", None, 4, vec, 1.0, None, False),
        ]
    )
    assert entry.document_ids == ["a", "b", "c", "o"]
    ranked = entry.rank(np.array([1, 0, 0], np.float32), [], RankingParams(k=10))
    assert [entry.document_ids[r.row] for r in ranked] == ["a", "c", "o"]
