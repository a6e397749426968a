"""The big-scope path takes lexical candidates from the query's rarest lexemes only while the facts holding
them stay within `LEXICAL_POSTINGS_MAX` (the rarest always), and still ranks by every lexeme of the query."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from haystack_osa_memory import Caller, Memory
from haystack_osa_memory.store import big_scope
from haystack_osa_memory.store.facts import term_key

pytestmark = pytest.mark.integration

FACTS = 60
ZANZIBAR = (9, 41)  # the rarest query lexeme: two facts (the first also of mango wood)
MANGO = range(0, 60, 3)  # twenty facts: within RARE_LEXEME_MAX_DF, so "rare" too


def test_rarer_lexemes_bring_candidates_within_the_budget(
    memory: Memory, alice: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [
        memory.store(
            f"Crate {i} holds part P-{i}{' of mango wood' if i in MANGO else ''}"
            f"{' shipped from zanzibar' if i in ZANZIBAR else ''}.",
            caller=alice,
        )["document_id"]
        for i in range(FACTS)
    ]
    memory.warm_up()
    assert memory.kb is not None
    repo = memory.kb.facts
    repo.exact_scope_max = 0  # this scope takes the big-scope path
    repo.scope_cache = None  # (not the scope held in memory)
    repo._sizes.clear()  # the stores' suggestion searches remembered the scope when it held one fact
    lexical = repo._big_lexical
    given: list[list[int]] = []
    execute = psycopg.Cursor.execute

    def recording(cur: psycopg.Cursor[Any], query: Any, params: Any = None, **kwargs: Any) -> Any:
        if query is lexical:
            given.append(list(params["keys"]))
        return execute(cur, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recording)
    hashes = dict(zip(*repo.query_terms("zanzibar mango"), strict=True))
    zanzibar = term_key(alice.org_id, alice.assignment_id, hashes["zanzibar"])
    mango = term_key(alice.org_id, alice.assignment_id, hashes["mango"])

    def recall() -> list[str]:
        return [f["document_id"] for f in memory.recall("mango from zanzibar", limit=5, caller=alice)["facts"]]

    monkeypatch.setattr(big_scope, "LEXICAL_POSTINGS_MAX", 10**9)
    everything = recall()
    assert sorted(given[-1]) == sorted([zanzibar, mango])  # 2 + 20 holders: both bring candidates

    monkeypatch.setattr(big_scope, "LEXICAL_POSTINGS_MAX", 10)
    budgeted = recall()
    assert given[-1] == [zanzibar]  # 22 holders would pass 10: only the rarest
    # The two facts from zanzibar come first either way: fewer candidates, the same best answers.
    zanzibar_ids = {ids[i] for i in ZANZIBAR}
    assert set(everything[:2]) == set(budgeted[:2]) == zanzibar_ids

    monkeypatch.setattr(big_scope, "LEXICAL_POSTINGS_MAX", 1)
    recall()
    assert given[-1] == [zanzibar]  # the rarest always brings its facts, even past the budget


def test_a_lexical_query_of_common_words_only_still_finds_facts(
    memory: Memory, alice: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a vector side, a query whose every word is common (held by more than `RARE_LEXEME_MAX_DF`
    facts) takes its candidates from the rarest of them instead of finding nothing."""
    ids = [memory.store(f"Crate {i} holds part P-{i}.", caller=alice)["document_id"] for i in range(FACTS)]
    memory.warm_up()
    assert memory.kb is not None
    repo = memory.kb.facts
    repo.exact_scope_max = 0  # this scope takes the big-scope path
    repo.scope_cache = None  # (not the scope held in memory)
    repo._sizes.clear()
    monkeypatch.setattr(big_scope, "RARE_LEXEME_MAX_DF", 5)  # "crate" and "holds": sixty facts each
    found = [f["document_id"] for f in memory.recall("crate holds", limit=5, caller=alice)["facts"]]
    assert len(found) == 5
    assert set(found) <= set(ids)
