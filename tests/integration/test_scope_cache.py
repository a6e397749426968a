"""A big assignment held in memory (`store/scope_cache.py`) ranks as the exact path ranks it, and stays
current when another process writes: a fact stored elsewhere is recalled at once (appended), a forgotten
one makes the scope read again, and a fact that left the scope by a change of its governing row alone
(superseded) is never returned and is dropped from memory. Scopes are held apart, and a scope bigger
than the cache takes the index path."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
from haystack.components.embedders import MockDocumentEmbedder, MockTextEmbedder

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.scope_cache import ScopeCache

pytestmark = pytest.mark.integration

FACTS = 60
DIM = 384  # the test schema's
BIG = 10  # exact_scope_max here: every scope of more facts takes the big-scope paths
SERVICES = ["billing", "search", "checkout", "ledger", "payments", "identity", "reports", "gateway"]
QUERIES = [
    "which port does billing listen on?",
    "search cluster region",
    "who owns the ledger repository",
    "payments timeout minutes",
    "gateway on call engineer",
    "identity",
    "reports job 7",
    "nothing matches zzzz",
]


def words_embedding(text: str) -> list[float]:
    """A bag of hashed words: texts sharing words are near (so the vector side ranks by meaning here)."""
    v = np.zeros(DIM)
    for word in text.lower().replace("?", " ").replace(".", " ").split():
        v[int(hashlib.sha256(word.encode()).hexdigest(), 16) % DIM] += 1.0
    return [float(x) for x in v]


def fact(i: int) -> str:
    service = SERVICES[i % len(SERVICES)]
    kinds = [
        f"The {service} service listens on port {8000 + i}.",
        f"The {service} cluster runs in region eu-{i}.",
        f"{service.title()} repository owner is engineer {i}.",
        f"The {service} job {i} times out after {i} minutes.",
        f"Engineer {i} is on call for {service}.",
    ]
    return kinds[i % len(kinds)]


def new_memory(config: MemoryConfig, *, held: bool, cache_facts: int = 1000) -> Memory:
    cfg = config.model_copy(update={"scope_cache_facts": cache_facts if held else 0})
    memory = Memory(
        cfg,
        document_embedder=MockDocumentEmbedder(embedding_fn=words_embedding),
        text_embedder=MockTextEmbedder(embedding_fn=words_embedding),
    )
    memory.warm_up()
    assert memory.kb is not None
    memory.kb.facts.exact_scope_max = BIG if held else 10**9  # without the cache: the exact path itself
    return memory


def answer(memory: Memory, caller: Caller, query: str, limit: int = 8) -> list[tuple[Any, ...]]:
    facts = memory.recall(query, limit=limit, caller=caller)["facts"]
    # Scores to 4 places: cosines are computed in float32 here and by pgvector in SQL (last-digit differences).
    return [(f["document_id"], round(f["score"], 4)) for f in facts]


def cache_of(memory: Memory) -> ScopeCache:
    assert memory.kb is not None
    cache = memory.kb.facts.scope_cache
    assert cache is not None
    return cache


@pytest.fixture
def hybrid_config(config: MemoryConfig) -> MemoryConfig:
    assert config.embedding_dimension == DIM
    return config


@pytest.fixture
def stored(hybrid_config: MemoryConfig, alice: Caller) -> list[str]:
    writer = new_memory(hybrid_config, held=False)
    return [writer.store(fact(i), caller=alice)["document_id"] for i in range(FACTS)]


def test_a_held_scope_ranks_as_the_exact_path(hybrid_config: MemoryConfig, alice: Caller, stored: list[str]) -> None:
    held, exact = new_memory(hybrid_config, held=True), new_memory(hybrid_config, held=False)
    for query in QUERIES:
        assert answer(held, alice, query) == answer(exact, alice, query), query
    cache = cache_of(held)
    assert (cache.full_reads, cache.appends) == (1, 0)  # read once, then served from memory


def test_a_held_scope_ranks_as_the_exact_path_without_an_embedder(config: MemoryConfig, alice: Caller) -> None:
    held = Memory(config, use_default_embedders=False)
    exact = Memory(config.model_copy(update={"scope_cache_facts": 0}), use_default_embedders=False)
    for i in range(FACTS):
        exact.store(fact(i), caller=alice)
    held.warm_up()
    exact.warm_up()
    assert held.kb is not None
    assert exact.kb is not None
    held.kb.facts.exact_scope_max, exact.kb.facts.exact_scope_max = BIG, 10**9
    for query in QUERIES:
        assert answer(held, alice, query) == answer(exact, alice, query), query
    assert cache_of(held).full_reads == 1


def test_a_fact_stored_by_another_process_is_recalled_at_once(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str]
) -> None:
    held, other = new_memory(hybrid_config, held=True), new_memory(hybrid_config, held=False)
    before = answer(held, alice, "zanzibar crates")
    new = other.store("The zanzibar crates ship on Tuesdays.", caller=alice)["document_id"]
    after = answer(held, alice, "zanzibar crates")
    assert new not in [a[0] for a in before]
    assert after[0][0] == new
    cache = cache_of(held)
    assert (cache.full_reads, cache.appends) == (1, 1)  # appended, not read again
    exact = new_memory(hybrid_config, held=False)
    for query in QUERIES:
        assert answer(held, alice, query) == answer(exact, alice, query), query


def test_a_forgotten_fact_makes_the_scope_read_again(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str]
) -> None:
    held, other = new_memory(hybrid_config, held=True), new_memory(hybrid_config, held=False)
    first = answer(held, alice, QUERIES[0])
    gone = first[0][0]
    other.forget(gone, "wrong port", caller=alice)
    assert gone not in [a[0] for a in answer(held, alice, QUERIES[0])]
    assert cache_of(held).full_reads == 2
    assert answer(held, alice, QUERIES[0]) == answer(new_memory(hybrid_config, held=False), alice, QUERIES[0])


def test_a_superseded_fact_is_never_returned_and_is_dropped(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str]
) -> None:
    held, other = new_memory(hybrid_config, held=True), new_memory(hybrid_config, held=False)
    query = "billing service port"
    old = answer(held, alice, query)[0][0]
    new = other.store("The billing service listens on port 9443.", supersedes=[old], caller=alice)["document_id"]
    ids = [a[0] for a in answer(held, alice, query)]
    assert old not in ids
    assert new in ids
    cache = cache_of(held)
    assert cache.dropped == 1
    assert cache.appends == 1
    assert cache.full_reads == 1
    exact = new_memory(hybrid_config, held=False)
    for q in (query, *QUERIES):
        assert answer(held, alice, q) == answer(exact, alice, q), q


def test_scopes_are_held_apart(hybrid_config: MemoryConfig, alice: Caller, bob: Caller, stored: list[str]) -> None:
    other = new_memory(hybrid_config, held=False)
    bobs = {other.store(fact(i).replace("The", "Bob's"), caller=bob)["document_id"] for i in range(FACTS)}
    held = new_memory(hybrid_config, held=True)
    for query in QUERIES:
        mine = {a[0] for a in answer(held, alice, query, limit=20)}
        theirs = {a[0] for a in answer(held, bob, query, limit=20)}
        assert mine <= set(stored)
        assert theirs <= bobs
    assert cache_of(held).full_reads == 2  # one per scope, both held


def test_a_scope_bigger_than_the_cache_takes_the_index_path(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    held = new_memory(hybrid_config, held=True, cache_facts=FACTS // 2)
    assert held.kb is not None
    repo = held.kb.facts
    calls: list[int] = []
    big_scope_hits = repo._big_scope_hits

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return big_scope_hits(*args, **kwargs)

    monkeypatch.setattr(repo, "_big_scope_hits", counting)
    assert answer(held, alice, QUERIES[0])
    assert calls == [1]
    assert cache_of(held).full_reads == 0
