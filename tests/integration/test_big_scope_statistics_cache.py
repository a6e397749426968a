"""What the big-scope path remembers per process, a scope's size and its lexemes' counts, is read again once
`SCOPE_STATS_TTL_S` has passed, and past `SCOPE_SIZES_MAX` scopes (`LEXEME_COUNTS_MAX` counts) the least
recently used are forgotten: read again from the database when next needed."""

from __future__ import annotations

import time

import pytest

from haystack_osa_memory import Caller, Memory
from haystack_osa_memory.store import big_scope
from haystack_osa_memory.store.facts import FactRepository, term_key

pytestmark = pytest.mark.integration


def repository(memory: Memory) -> FactRepository:
    """A repository of its own (nothing remembered yet), built with the module's bounds as they are now."""
    memory.warm_up()
    assert memory.kb is not None
    return FactRepository(memory.kb.facts.conn_str, memory.kb.facts.config)


def size(repo: FactRepository, caller: Caller, assignment: str | None = None) -> int:
    with repo.reading() as conn:
        return repo.scope_size(caller.org_id, assignment or caller.assignment_id, conn=conn).facts


def mango_count(repo: FactRepository, caller: Caller, *others: str) -> float:
    """How many facts of ``caller``'s scope hold "mango" (after counting ``others``' lexemes, in that order)."""
    scope = {"org_id": caller.org_id, "assignment_id": caller.assignment_id}
    hashes = dict(zip(*repo.query_terms(" ".join(["mango", *others])), strict=True))
    with repo.reading() as conn, conn.cursor() as cur:
        for word in others:
            repo._lexeme_counts(cur, scope, [term_key(caller.org_id, caller.assignment_id, hashes[word])])
        (count,) = repo._lexeme_counts(cur, scope, [term_key(caller.org_id, caller.assignment_id, hashes["mango"])])
    return count


def test_a_scope_size_is_read_again_after_its_time_to_live(
    memory: Memory, alice: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory.store("Crate 1 holds mango wood.", caller=alice)
    remembered = repository(memory)
    monkeypatch.setattr(big_scope, "SCOPE_STATS_TTL_S", 0.2)
    expiring = repository(memory)
    assert size(remembered, alice) == size(expiring, alice) == 1
    assert mango_count(remembered, alice) == mango_count(expiring, alice) == 1
    memory.store("Crate 2 holds mango wood too.", caller=alice)
    time.sleep(0.3)
    assert size(remembered, alice) == 1  # within 30 s: remembered
    assert mango_count(remembered, alice) == 1
    assert size(expiring, alice) == 2
    assert mango_count(expiring, alice) == 2


def test_past_the_bound_the_least_recently_used_scope_size_is_forgotten(
    memory: Memory, alice: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory.store("Crate 1 holds mango wood.", caller=alice)
    monkeypatch.setattr(big_scope, "SCOPE_SIZES_MAX", 2)
    repo = repository(memory)
    assert size(repo, alice) == 1
    assert size(repo, alice, "asg-other") == 0
    memory.store("Crate 2 holds mango wood too.", caller=alice)
    assert size(repo, alice) == 1  # remembered, and now the most recently used
    assert size(repo, alice, "asg-third") == 0  # evicts asg-other
    assert len(repo._sizes) == 2
    assert size(repo, alice) == 1
    assert size(repo, alice, "asg-fourth") == 0  # evicts asg-third
    assert size(repo, alice, "asg-fifth") == 0  # evicts alice's scope
    assert size(repo, alice) == 2


def test_past_the_bound_the_least_recently_used_lexeme_count_is_forgotten(
    memory: Memory, alice: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory.store("Crate 1 holds mango wood from zanzibar.", caller=alice)
    monkeypatch.setattr(big_scope, "LEXEME_COUNTS_MAX", 2)
    repo = repository(memory)
    repo.lexeme_estimates = False  # counted, never taken from the statistics
    assert mango_count(repo, alice) == 1
    memory.store("Crate 2 holds mango wood from zanzibar too.", caller=alice)
    assert mango_count(repo, alice, "crate") == 1  # two counts held: mango's is remembered
    assert mango_count(repo, alice, "zanzibar", "wood") == 2  # two more: mango's was forgotten, counted again
    assert len(repo._counts) == 2
