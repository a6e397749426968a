"""The big-scope path reads each candidate with its admitted neighbours (a forgotten or superseded fact lends
no context and is skipped, as in the exact path), and a fact read by two overlapping walks is returned once."""

from __future__ import annotations

from typing import Any

import pytest

from haystack_osa_memory import Caller, Memory

pytestmark = pytest.mark.integration

FACTS = 40
RARE = (20, 23)  # the only facts holding "zanzibar": their windows (two facts each way) overlap
FORGOTTEN = 21  # a neighbour of both: its recall row goes
SUPERSEDED = 24  # a neighbour of the second: its recall row stays, its governing row no longer admits it


def recall_ids(memory: Memory, caller: Caller) -> list[str]:
    return [f["document_id"] for f in memory.recall("zanzibar", limit=20, caller=caller)["facts"]]


def test_candidates_are_read_with_their_admitted_neighbours_once(
    memory: Memory, alice: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [
        memory.store(f"Note {i}: crate {i} holds part P-{i}{' from zanzibar' if i in RARE else ''}.", caller=alice)[
            "document_id"
        ]
        for i in range(FACTS)
    ]
    memory.forget(ids[FORGOTTEN], "moved", caller=alice)
    memory.store("Note 24: crate 24 now holds part Q-24.", supersedes=[ids[SUPERSEDED]], caller=alice)
    memory.warm_up()
    assert memory.kb is not None
    repo = memory.kb.facts
    exact = recall_ids(memory, alice)

    big_calls: list[int] = []
    big_scope_hits = repo._big_scope_hits

    def counting(*args: Any, **kwargs: Any) -> Any:
        hits = big_scope_hits(*args, **kwargs)
        big_calls.append(len(hits))
        return hits

    monkeypatch.setattr(repo, "_big_scope_hits", counting)
    repo.exact_scope_max = 0  # this scope now takes the big-scope path
    repo.scope_cache = None  # (not the scope held in memory)
    big = recall_ids(memory, alice)
    assert len(big_calls) == 1
    assert big_calls[0] > 0

    # Admitted order: ..., 19, 20, 22, 23, 25, 26, ...: each rare fact with two admitted neighbours each way.
    expected = {ids[i] for i in (18, 19, 20, 22, 23, 25, 26)}
    assert set(exact) == expected
    assert len(big) == len(set(big))  # 22 is read by both walks, returned once
    assert set(big) == expected
    assert ids[FORGOTTEN] not in big
    assert ids[SUPERSEDED] not in big
    assert big[0] in {ids[i] for i in RARE}
