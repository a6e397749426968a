"""A fact a process writes joins its scope's rows kept in memory (`ScopeMemo.written`): the rows it then keeps are
those a read of the scope would give (ids, vectors, lengths, lexemes, text, metadata and timestamps, and the print),
the store's search for the facts it may replace is answered from them without reading the scope, and any other
change to the scope (another process's write, a fact held for review, a supersession, the same text stored again)
is seen by the next print: the answers stay the exact path's, and facts stored elsewhere are caught up with."""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg
import pytest

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.facts import FactRepository
from haystack_osa_memory.store.scope_memo import Kept, ScopeMemo
from haystack_osa_memory.store.scope_query import ScopeQuery
from tests.integration.test_scope_cache import FACTS, QUERIES, answer, fact, hybrid_config
from tests.integration.test_scope_memo import exact_memory, kept_memory, memo_of, record_scope_reads, same_answers

__all__ = ["hybrid_config"]  # the fixture, shared with test_scope_cache

pytestmark = pytest.mark.integration

NEW_FACTS = [
    "The billing service listens on port 9443 since the move.",
    "The zanzibar crates ship on Tuesdays.",
    "Engineer 7 hands the gateway pager to engineer 12 on Fridays.",
]


def repo_of(memory: Memory) -> FactRepository:
    assert memory.kb is not None
    return memory.kb.facts


def kept_now(memory: Memory, caller: Caller) -> Kept:
    entry = memo_of(memory)._entries[(caller.org_id, caller.assignment_id)]
    return entry.kept


def read_fresh(memory: Memory, caller: Caller) -> Kept:
    """The scope's rows as `MEMO_ROWS` reads them now, into a memo of its own."""
    repo = repo_of(memory)
    scope = ScopeQuery.of(caller.org_id, caller.assignment_id)
    params = {**scope.params(repo.config.admitted_statuses), "language": repo.config.language}
    with repo.reading() as conn, conn.cursor(binary=True) as cur:
        return ScopeMemo(10_000, repo.config.embedding_dimension).read(cur, repo._memo_rows, params)


def assert_same_kept(joined: Kept, fresh: Kept) -> None:
    assert joined.print == fresh.print
    assert joined.details == fresh.details
    assert [type(v) for d in joined.details.values() for v in d] == [type(v) for d in fresh.details.values() for v in d]
    a, b = joined.scope, fresh.scope
    assert a is not None
    assert b is not None
    assert a.document_ids == b.document_ids
    assert a.expires == b.expires
    for name in ("unit", "has_vec", "dl", "scored"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    for name in ("often", "hashes", "rows"):
        assert np.array_equal(getattr(a.terms, name), getattr(b.terms, name)), name


def plain_and_kept(
    embedder: str, hybrid_config: MemoryConfig, config: MemoryConfig, caller: Caller
) -> tuple[Memory, Memory, ScopeMemo]:
    """A memory without rows kept (the exact path: writing as another process would, or answering as the exact
    path does) and one keeping them, hybrid or lexical (``embedder`` none), with half of `FACTS` stored in
    ``caller``'s scope by the first and its rows kept by the second; and the second's memo."""
    if embedder == "hybrid":
        plain, kept = exact_memory(hybrid_config), kept_memory(hybrid_config)
    else:
        plain = Memory(config.model_copy(update={"scope_cache_facts": 0}), use_default_embedders=False)
        kept = Memory(config, use_default_embedders=False)
        kept.warm_up()
    for i in range(FACTS // 2):
        plain.store(fact(i), caller=caller)
    answer(kept, caller, QUERIES[0])  # the rows read and kept
    return plain, kept, memo_of(kept)


def without_ids(result: dict[str, Any]) -> list[str]:
    return [s["content"] for s in result["possibly_supersedes"]]


@pytest.mark.parametrize("embedder", ["hybrid", "none"])
def test_a_fact_written_joins_the_kept_rows_as_a_read_would(
    hybrid_config: MemoryConfig, config: MemoryConfig, alice: Caller, embedder: str
) -> None:
    _, kept, memo = plain_and_kept(embedder, hybrid_config, config, alice)
    for text in NEW_FACTS:
        kept.store(text, caller=alice, topic="moves")
        assert_same_kept(kept_now(kept, alice), read_fresh(kept, alice))
    assert memo.joined == len(NEW_FACTS)
    assert memo.reads == 1  # never read again: each store's search and each recall answered from memory
    hits = memo.hits
    if embedder == "hybrid":
        same_answers(kept, hybrid_config, alice, ("zanzibar crates", "billing port", *QUERIES))
    else:
        exact = Memory(config.model_copy(update={"scope_cache_facts": 0}), use_default_embedders=False)
        for query in ("zanzibar crates", "billing port", *QUERIES):
            assert answer(kept, alice, query) == answer(exact, alice, query), query
    assert memo.hits > hits


def test_a_stores_search_reads_no_scope_rows_and_suggests_what_the_exact_path_does(
    hybrid_config: MemoryConfig, alice: Caller, bob: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept, exact = kept_memory(hybrid_config), exact_memory(hybrid_config)
    for i in range(FACTS // 2):
        kept.store(fact(i), caller=alice)
        exact.store(fact(i), caller=bob)
    answer(kept, alice, QUERIES[0])
    reads, recording = record_scope_reads(kept, monkeypatch)
    joined = memo_of(kept).joined
    for text in ("The billing service listens on port 8042.", "The search cluster runs in region us-3."):
        recording[0] = True
        suggested = without_ids(kept.store(text, caller=alice))
        recording[0] = False
        assert suggested
        assert suggested == without_ids(exact.store(text, caller=bob))
    assert reads == []
    assert memo_of(kept).joined == joined + 2


def test_a_write_elsewhere_before_the_join_is_seen_by_the_next_print_and_caught_up_with(
    hybrid_config: MemoryConfig, config: MemoryConfig, alice: Caller
) -> None:
    other, kept, memo = plain_and_kept("hybrid", hybrid_config, config, alice)
    elsewhere = other.store("The walrus deploy number is 1042.", caller=alice)["document_id"]
    assert memo.changed == 0
    kept.store("The zanzibar crates ship on Tuesdays.", caller=alice)  # joins rows that miss the walrus
    assert memo.joined == 1
    assert memo.changed == 1  # the store's own search: its print is not the one the rows joined make
    # ... so it read the facts stored since the rows were read, the walrus and its own, and keeps them in order.
    assert (memo.caught, memo.reads) == (1, 1)
    assert_same_kept(kept_now(kept, alice), read_fresh(kept, alice))
    assert elsewhere in [a[0] for a in answer(kept, alice, "walrus deploy number")]
    same_answers(kept, hybrid_config, alice, ("walrus deploy", "zanzibar crates", *QUERIES))


def test_facts_that_change_the_scope_otherwise_do_not_join(hybrid_config: MemoryConfig, alice: Caller) -> None:
    kept = kept_memory(hybrid_config)
    ids = [kept.store(fact(i), caller=alice)["document_id"] for i in range(FACTS // 2)]
    memo = memo_of(kept)
    cases = {
        "the same text again: kept already": lambda: kept.store(fact(3), caller=alice),
        "held for review": lambda: kept.propose(
            "procedure", "Rotate keys", "Rotate the signing keys every quarter", caller=alice
        ),
        "a supersession": lambda: kept.store(
            "The billing service listens on port 9443.", supersedes=[ids[0]], caller=alice
        ),
    }
    for case, write in cases.items():
        memo.clear()
        answer(kept, alice, QUERIES[0])  # the rows read again, as they are now
        joined, reads = memo.joined, memo.reads
        write()
        assert memo.joined == joined, case
        same_answers(kept, hybrid_config, alice, ("billing service port", "rotate signing keys", *QUERIES))
        assert memo.reads == reads + 1, case  # read again after the change, not answered from the rows before


def test_a_join_that_fails_leaves_the_store_done_and_the_answers_right(
    hybrid_config: MemoryConfig, alice: Caller, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kept = kept_memory(hybrid_config)
    for i in range(FACTS // 2):
        kept.store(fact(i), caller=alice)
    answer(kept, alice, QUERIES[0])
    memo = memo_of(kept)

    def broken(*args: Any) -> bool:
        raise RuntimeError("sk-live-secret-never-logged")

    monkeypatch.setattr(memo, "written", broken)
    stored = kept.store("The zanzibar crates ship on Tuesdays.", caller=alice)
    assert stored["stored"] is True
    assert "did not join its scope's rows kept in memory: RuntimeError" in caplog.text
    assert "sk-live-secret" not in caplog.text
    assert stored["document_id"] in [a[0] for a in answer(kept, alice, "zanzibar crates")]
    same_answers(kept, hybrid_config, alice, ("zanzibar crates", *QUERIES))


@pytest.mark.parametrize("embedder", ["hybrid", "none"])
def test_facts_stored_elsewhere_are_caught_up_with_as_a_read_would_keep_them(
    hybrid_config: MemoryConfig, config: MemoryConfig, alice: Caller, embedder: str
) -> None:
    other, kept, memo = plain_and_kept(embedder, hybrid_config, config, alice)
    for i, text in enumerate(NEW_FACTS):
        other.store(text, caller=alice)
        if i == 1:
            kept.store("The walrus deploy number is 1042.", caller=alice)  # joins, then catches up with both
        answer(kept, alice, "billing port")
        assert_same_kept(kept_now(kept, alice), read_fresh(kept, alice))
    assert memo.reads == 1
    assert memo.caught == len(NEW_FACTS)
    for query in ("zanzibar crates", "walrus deploy", "billing port", *QUERIES):
        assert answer(kept, alice, query) == answer(other, alice, query), query


def test_a_fact_stored_between_the_print_and_the_facts_since_is_not_caught_up_with(
    hybrid_config: MemoryConfig, config: MemoryConfig, alice: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    other, kept, memo = plain_and_kept("hybrid", hybrid_config, config, alice)
    repo = repo_of(kept)
    other.store("The walrus deploy number is 1042.", caller=alice)  # the next print misses it
    execute = psycopg.Cursor.execute
    between: list[str] = []

    def racing(cur: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        if query == repo._memo_since and not between:
            # Committed after the recall's print, before the facts stored since are read.
            between.append(other.store("The zanzibar crates ship on Tuesdays.", caller=alice)["document_id"])
        return execute(cur, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", racing)
    recalled = answer(kept, alice, "zanzibar crates walrus deploy")
    assert between
    assert (memo.changed, memo.caught) == (1, 0)  # the facts since are two, the print has one: not caught up
    assert between[0] in [a[0] for a in recalled]  # the exact path's answer, read after both
    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    same_answers(kept, hybrid_config, alice, ("zanzibar crates", "walrus deploy", *QUERIES))
