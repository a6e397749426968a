"""Facts stored after a scope's rows were kept in memory join them at the next print (`ScopeMemo.current`, with the
facts `MEMO_PRINT` reads past the rows' last ``seq``): the rows then kept are those a read of the scope would give
(ids, vectors, lengths, lexemes, text, metadata and timestamps, and the print), whether this process or another
stored them; a store's search for the facts it may replace is answered from them without reading the scope; and a
change of any other kind (the same text stored again, a fact held for review, a supersession) does not add up, so
that recall takes the exact path: the answers stay the exact path's."""

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
from tests.integration.test_scope_memo import exact_memory, kept_memory, memo_of, same_answers

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
    return memo_of(memory)._entries[(caller.org_id, caller.assignment_id)].kept


def read_fresh(memory: Memory, caller: Caller) -> Kept:
    """The scope's rows as `MEMO_ROWS` reads them now, into a memo of its own."""
    repo = repo_of(memory)
    scope = ScopeQuery.of(caller.org_id, caller.assignment_id)
    params = {**scope.params(repo.config.admitted_statuses), "language": repo.config.language}
    with repo.reading() as conn, conn.cursor(binary=True) as cur:
        return ScopeMemo(10_000, repo.config.embedding_dimension).read(cur, repo._memo_rows, params)


def assert_same_kept(joined: Kept, fresh: Kept) -> None:
    assert joined.print == fresh.print
    assert joined.last_seq == fresh.last_seq
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


def without_ids(result: dict[str, Any]) -> list[str]:
    return [s["content"] for s in result["possibly_supersedes"]]


@pytest.mark.parametrize("embedder", ["hybrid", "none"])
@pytest.mark.parametrize("writer_is", ["this process", "another process"])
def test_facts_stored_after_the_rows_join_them_as_a_read_would(
    hybrid_config: MemoryConfig, config: MemoryConfig, alice: Caller, embedder: str, writer_is: str
) -> None:
    if embedder == "hybrid":
        seeder, kept = exact_memory(hybrid_config), kept_memory(hybrid_config)
    else:
        seeder = Memory(config.model_copy(update={"scope_cache_facts": 0}), use_default_embedders=False)
        kept = Memory(config, use_default_embedders=False)
        kept.warm_up()
    writer = kept if writer_is == "this process" else seeder
    for i in range(FACTS // 2):
        seeder.store(fact(i), caller=alice)
    answer(kept, alice, QUERIES[0])  # the rows read and kept
    memo = memo_of(kept)
    for n, text in enumerate(NEW_FACTS):
        writer.store(text, caller=alice, topic="moves")
        if n == 1:
            writer.store(f"{text} Twice in a row.", caller=alice)
        answer(kept, alice, "zanzibar crates")  # the print: the facts stored since join the rows kept
        assert_same_kept(kept_now(kept, alice), read_fresh(kept, alice))
    assert memo.caught_up == len(NEW_FACTS) + 1
    assert memo.reads == 1  # never read again: each store's search and each recall answered from memory
    assert memo.changed == 0
    if embedder == "hybrid":
        same_answers(kept, hybrid_config, alice, ("zanzibar crates", "billing port", *QUERIES))
    else:
        exact = Memory(config.model_copy(update={"scope_cache_facts": 0}), use_default_embedders=False)
        for query in ("zanzibar crates", "billing port", *QUERIES):
            assert answer(kept, alice, query) == answer(exact, alice, query), query


def test_a_stores_search_reads_no_scope_rows_and_suggests_what_the_exact_path_does(
    hybrid_config: MemoryConfig, alice: Caller, bob: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept, exact = kept_memory(hybrid_config), exact_memory(hybrid_config)
    for i in range(FACTS // 2):
        kept.store(fact(i), caller=alice)
        exact.store(fact(i), caller=bob)
    answer(kept, alice, QUERIES[0])
    repo = repo_of(kept)
    reads: list[bytes] = []
    recording = [False]
    execute = psycopg.Cursor.execute

    def recorded(cur: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        if recording[0] and query in (repo._scope_recall_rows, repo._scope_rows, repo._scope_facts, repo._memo_rows):
            reads.append(query)
        return execute(cur, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recorded)
    caught_up = memo_of(kept).caught_up
    for text in ("The billing service listens on port 8042.", "The search cluster runs in region us-3."):
        recording[0] = True
        suggested = without_ids(kept.store(text, caller=alice))
        recording[0] = False
        assert suggested
        assert suggested == without_ids(exact.store(text, caller=bob))
    assert reads == []
    assert memo_of(kept).caught_up == caught_up + 2


def test_changes_of_other_kinds_do_not_add_up(hybrid_config: MemoryConfig, alice: Caller) -> None:
    kept, other = kept_memory(hybrid_config), exact_memory(hybrid_config)
    ids = [other.store(fact(i), caller=alice)["document_id"] for i in range(FACTS // 2)]
    memo = memo_of(kept)
    cases = {
        "the same text again (its storing order kept)": lambda: other.store(fact(3), caller=alice),
        "held for review (a recall row outside the scope)": lambda: other.propose(
            "procedure", "Rotate keys", "Rotate the signing keys every quarter", caller=alice
        ),
        "a supersession (a governing row changed)": lambda: other.store(
            "The billing service listens on port 9443.", supersedes=[ids[0]], caller=alice
        ),
        "forgotten": lambda: other.forget(ids[1], "no longer true", caller=alice),
    }
    for case, write in cases.items():
        memo._entries.clear()
        memo._facts = 0
        answer(kept, alice, QUERIES[0])  # the rows read again, as they are now
        caught_up, changed = memo.caught_up, memo.changed
        write()
        answer(kept, alice, "billing service port")
        assert memo.caught_up == caught_up, case
        assert memo.changed == changed + 1, case
        same_answers(kept, hybrid_config, alice, ("billing service port", "rotate signing keys", *QUERIES))
