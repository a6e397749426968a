"""A small assignment's rows kept in memory (`store/scope_memo.py`) give the exact path's answers, text and
metadata included, and every change the exact path would see is seen by the next recall: a fact stored,
forgotten, superseded or approved by another process, a fact whose validity begins or ends while nothing is
written, a recall row, an expiry, a text or a topic rewritten by hand. A scope with a fact that has no recall row or no
chunk of its own takes the exact path; metadata kept is handed out as a copy; scopes are kept apart; and a
scope written between its recalls stops reading its print (`MAX_SKIPS`)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.ranking import RankingParams
from haystack_osa_memory.store.scope_memo import ScopeMemo
from tests.integration.test_scope_cache import FACTS, QUERIES, answer, fact, hybrid_config, new_memory

__all__ = ["hybrid_config"]  # the fixture, shared with test_scope_cache

pytestmark = pytest.mark.integration


def kept_memory(config: MemoryConfig) -> Memory:
    """A memory with the memo (the default: `scope_cache_facts` > 0, scopes within `exact_scope_max`)."""
    memory = new_memory(config, held=True)
    assert memory.kb is not None
    memory.kb.facts.exact_scope_max = 10**9  # every scope is small here: never the big-scope paths
    return memory


def exact_memory(config: MemoryConfig) -> Memory:
    """The exact path alone: no memo (`scope_cache_facts` 0), no big-scope paths."""
    memory = new_memory(config, held=False)
    assert memory.kb is not None
    assert memory.kb.facts.scope_memo is None
    return memory


def memo_of(memory: Memory) -> ScopeMemo:
    assert memory.kb is not None
    memo = memory.kb.facts.scope_memo
    assert memo is not None
    return memo


def whole_answer(memory: Memory, caller: Caller, query: str) -> list[dict[str, Any]]:
    """Every field of every fact recalled (the text and metadata a kept scope returns from memory too), scores
    to 4 places as `answer` has them."""
    facts = memory.recall(query, limit=8, caller=caller)["facts"]
    return [{**f, "score": round(f["score"], 4)} for f in facts]


def record_scope_reads(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> tuple[list[bytes], list[bool]]:
    """Wrap psycopg's ``Cursor.execute``: the statements with which ``memory`` reads a scope's rows (the exact
    path's, `MEMO_ROWS`) or its facts' text (`SCOPE_FACTS`) are appended to the list returned while the flag
    returned with it (its one item) is on."""
    assert memory.kb is not None
    repo = memory.kb.facts
    reading = (repo._scope_recall_rows, repo._scope_rows, repo._scope_facts, repo._memo_rows)
    reads: list[bytes] = []
    recording = [False]
    execute = psycopg.Cursor.execute

    def recorded(cur: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        if recording[0] and query in reading:
            reads.append(query)
        return execute(cur, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recorded)
    return reads, recording


def same_answers(kept: Memory, config: MemoryConfig, caller: Caller, queries: list[str] | tuple[str, ...]) -> None:
    exact = exact_memory(config)
    for query in queries:
        assert whole_answer(kept, caller, query) == whole_answer(exact, caller, query), query


@pytest.fixture
def stored(hybrid_config: MemoryConfig, alice: Caller) -> list[str]:
    writer = exact_memory(hybrid_config)
    return [writer.store(fact(i), caller=alice)["document_id"] for i in range(FACTS)]


def run_sql(config: MemoryConfig, statement: sql.Composed, params: dict[str, Any]) -> int:
    assert config.pg_conn_str is not None
    with psycopg.connect(config.pg_conn_str, autocommit=True) as conn:
        return conn.execute(statement, params).rowcount


def test_kept_rows_rank_as_the_exact_path(hybrid_config: MemoryConfig, alice: Caller, stored: list[str]) -> None:
    kept = kept_memory(hybrid_config)
    same_answers(kept, hybrid_config, alice, QUERIES)
    memo = memo_of(kept)
    assert (memo.reads, memo.hits, memo.changed) == (1, len(QUERIES) - 1, 0)  # read once, then from memory


def test_kept_rows_rank_as_the_exact_path_without_an_embedder(config: MemoryConfig, alice: Caller) -> None:
    kept = Memory(config, use_default_embedders=False)
    exact = Memory(config.model_copy(update={"scope_cache_facts": 0}), use_default_embedders=False)
    for i in range(FACTS):
        exact.store(fact(i), caller=alice)
    for query in QUERIES:
        assert answer(kept, alice, query) == answer(exact, alice, query), query
    assert memo_of(kept).hits == len(QUERIES) - 1


def test_a_fact_stored_forgotten_or_superseded_elsewhere_is_seen_at_once(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str]
) -> None:
    kept, other = kept_memory(hybrid_config), exact_memory(hybrid_config)
    answer(kept, alice, QUERIES[0])
    new = other.store("The zanzibar crates ship on Tuesdays.", caller=alice)["document_id"]
    assert answer(kept, alice, "zanzibar crates")[0][0] == new
    gone = answer(kept, alice, QUERIES[0])[0][0]
    other.forget(gone, "wrong port", caller=alice)
    assert gone not in [a[0] for a in answer(kept, alice, QUERIES[0])]
    old = answer(kept, alice, "billing service port")[0][0]
    successor = other.store("The billing service listens on port 9443.", supersedes=[old], caller=alice)
    ids = [a[0] for a in answer(kept, alice, "billing service port")]
    assert old not in ids
    assert successor["document_id"] in ids
    assert memo_of(kept).changed >= 1
    same_answers(kept, hybrid_config, alice, ("billing service port", *QUERIES))


def test_a_fact_approved_by_review_is_recalled_at_once(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str]
) -> None:
    kept, other = kept_memory(hybrid_config), exact_memory(hybrid_config)
    proposed = other.propose("procedure", "Rotate keys", "Rotate the signing keys every quarter", caller=alice)
    query = "rotate signing keys"
    assert proposed["document_id"] not in [a[0] for a in answer(kept, alice, query)]
    assert answer(kept, alice, query) == answer(kept, alice, query)  # kept, and answered from memory
    hits = memo_of(kept).hits
    assert hits >= 1
    assert other.lifecycle is not None
    # Only the governing row changes (its status): no recall row is written.
    other.lifecycle.review(proposed["document_id"], accept=True, actor="cli:test", note=None)
    assert answer(kept, alice, query)[0][0] == proposed["document_id"]
    same_answers(kept, hybrid_config, alice, (query, *QUERIES))


def test_a_fact_whose_validity_begins_is_recalled_without_a_write(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str]
) -> None:
    kept = kept_memory(hybrid_config)
    start = datetime.now(UTC) + timedelta(seconds=2)
    soon = kept.store("The quokka migration starts at noon.", valid_from=start, caller=alice)["document_id"]
    query = "quokka migration"
    assert soon not in [a[0] for a in answer(kept, alice, query)]
    assert soon not in [a[0] for a in answer(kept, alice, query)]
    time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + 0.2)
    memo = memo_of(kept)
    # The print, not the skips after the store changed the scope, must see it: no skips left, and the rows
    # kept were read before its validity began.
    memo._entries[(alice.org_id, alice.assignment_id)].skips = 0
    changed = memo.changed
    assert answer(kept, alice, query)[0][0] == soon
    assert memo.changed == changed + 1
    same_answers(kept, hybrid_config, alice, (query,))


def test_a_fact_whose_validity_ends_is_not_recalled_without_a_write(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str]
) -> None:
    kept = kept_memory(hybrid_config)
    end = datetime.now(UTC) + timedelta(seconds=2)
    since = datetime.now(UTC) - timedelta(hours=1)
    brief = kept.store("The quokka freeze lasts until noon.", valid_from=since, valid_to=end, caller=alice)
    query = "quokka freeze"
    answer(kept, alice, query)  # the store changed the scope: the print is skipped, then the rows read again
    memo = memo_of(kept)
    memo._entries[(alice.org_id, alice.assignment_id)].skips = 0
    hits = memo.hits
    assert answer(kept, alice, query)[0][0] == brief["document_id"]
    assert answer(kept, alice, query)[0][0] == brief["document_id"]
    assert memo.hits == hits + 2  # answered from the rows kept while it holds
    time.sleep(max(0.0, (end - datetime.now(UTC)).total_seconds()) + 0.2)
    # Nothing was written: the print is the same, but the rows kept no longer are the ones that hold.
    changed = memo.changed
    assert brief["document_id"] not in [a[0] for a in answer(kept, alice, query)]
    assert memo.changed == changed + 1
    same_answers(kept, hybrid_config, alice, (query, *QUERIES))


def test_recall_rows_and_expiry_rewritten_by_hand_are_seen(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str]
) -> None:
    kept = kept_memory(hybrid_config)
    query = "billing service port"
    top = answer(kept, alice, query)[0][0]
    answer(kept, alice, query)
    names = hybrid_config.sql_names()
    # A recall row rewritten in place (as a successor's inherited lexemes are): only its length changes here.
    rewrite = sql.SQL("UPDATE {schema}.osa_fact_terms SET dl = dl * 40 WHERE document_id = %(id)s").format(**names)
    before, changed = answer(kept, alice, query), memo_of(kept).changed
    assert run_sql(hybrid_config, rewrite, {"id": top}) == 1
    after = answer(kept, alice, query)
    assert after != before  # the fact's lexical score changed
    assert memo_of(kept).changed == changed + 1
    same_answers(kept, hybrid_config, alice, (query,))
    # An expiry set on the governing row alone: the fact is ranked below the fresh ones.
    expire = sql.SQL(
        "UPDATE {schema}.{gov} SET metadata = metadata || jsonb_build_object('expires_at', %(at)s::text) "
        "WHERE id = %(id)s"
    ).format(**names)
    second = answer(kept, alice, query)[0][0]
    assert run_sql(hybrid_config, expire, {"id": second, "at": "2000-01-01T00:00:00+00:00"}) == 1
    # Ranked below every fresh fact (out of the top 8 among 60 that match "service").
    assert second not in [a[0] for a in answer(kept, alice, query)]
    same_answers(kept, hybrid_config, alice, (query, *QUERIES))


def test_text_and_metadata_rewritten_by_hand_are_seen(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str]
) -> None:
    kept = kept_memory(hybrid_config)
    query = "billing service port"
    top = whole_answer(kept, alice, query)[0]
    assert whole_answer(kept, alice, query)[0] == top  # answered from memory, text and metadata included
    memo = memo_of(kept)
    hits, changed = memo.hits, memo.changed
    assert hits >= 1
    names = hybrid_config.sql_names()
    # The chunk's text alone, its governing and recall rows untouched: the trigger that drops the recall row of a
    # chunk changed by other tools (`ddl.CREATE_TERMS_TRIGGER`) switched off, as a bulk loader may run. Only the
    # chunks' part of the print sees it; the next recall returns the new text.
    trigger = sql.SQL("ALTER TABLE {schema}.{chunk} {switch} TRIGGER osa_fact_terms_invalidate")
    rewrite = sql.SQL("UPDATE {schema}.{chunk} SET content = content || ' (checked)' WHERE id = %(id)s")
    assert hybrid_config.pg_conn_str is not None
    with psycopg.connect(hybrid_config.pg_conn_str) as conn:  # one transaction
        conn.execute(trigger.format(switch=sql.SQL("DISABLE"), **names))
        assert conn.execute(rewrite.format(**names), {"id": top["document_id"]}).rowcount == 1
        conn.execute(trigger.format(switch=sql.SQL("ENABLE"), **names))
    texts = {f["document_id"]: f["content"] for f in whole_answer(kept, alice, query)}
    assert texts[top["document_id"]] == top["content"] + " (checked)"
    assert memo.changed == changed + 1
    # The governing row's metadata alone: the next recall returns the new topic.
    retopic = sql.SQL(
        "UPDATE {schema}.{gov} SET metadata = metadata || jsonb_build_object('topic', 'renamed') WHERE id = %(id)s"
    ).format(**names)
    assert run_sql(hybrid_config, retopic, {"id": top["document_id"]}) == 1
    topics = {f["document_id"]: f["topic"] for f in whole_answer(kept, alice, query)}
    assert topics[top["document_id"]] == "renamed"
    same_answers(kept, hybrid_config, alice, (query, *QUERIES))


def test_metadata_kept_is_handed_out_as_a_copy(hybrid_config: MemoryConfig, alice: Caller, stored: list[str]) -> None:
    kept = kept_memory(hybrid_config)
    assert kept.kb is not None
    repo = kept.kb.facts

    def candidates() -> list[Any]:
        return repo.scoped_candidates(
            org_id=alice.org_id,
            assignment_id=alice.assignment_id,
            query="billing service port",
            embedding=None,
            ranking=RankingParams(k=5),
        )

    first = candidates()
    reads, original = memo_of(kept).reads, dict(first[0].metadata)
    assert original.get("assignment_id") == alice.assignment_id
    first[0].metadata["assignment_id"] = "changed by a caller"
    first[0].metadata.setdefault("tags", []).append("x")
    again = candidates()
    assert memo_of(kept).hits >= 1  # from memory
    assert memo_of(kept).reads == reads
    assert again[0].document_id == first[0].document_id
    assert again[0].metadata == original


@pytest.mark.parametrize(
    "change",
    [
        "DELETE FROM {schema}.osa_fact_terms WHERE document_id = %(id)s",  # as a fact written by other tools
        "UPDATE {schema}.osa_fact_terms SET assignment_id = 'elsewhere' WHERE document_id = %(id)s",
        "DELETE FROM {schema}.{chunk} WHERE id = %(id)s",  # a fact whose text is gone: never returned
        "UPDATE {schema}.{chunk} SET meta = meta || jsonb_build_object('document_id', 'x') WHERE id = %(id)s",
    ],
    ids=["no recall row", "recall row outside the scope", "no chunk", "chunk of another fact"],
)
def test_a_scope_with_a_fact_without_its_recall_row_takes_the_exact_path(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str], change: str
) -> None:
    statement = sql.SQL(change).format(**hybrid_config.sql_names())
    assert run_sql(hybrid_config, statement, {"id": stored[0]}) == 1
    kept = kept_memory(hybrid_config)
    same_answers(kept, hybrid_config, alice, QUERIES)
    memo = memo_of(kept)
    assert memo.route((alice.org_id, alice.assignment_id)) == "exact"
    assert (memo.reads, memo.hits) == (1, 0)


def test_scopes_are_kept_apart(hybrid_config: MemoryConfig, alice: Caller, bob: Caller, stored: list[str]) -> None:
    other = exact_memory(hybrid_config)
    bobs = {other.store(fact(i).replace("The", "Bob's"), caller=bob)["document_id"] for i in range(FACTS)}
    kept = kept_memory(hybrid_config)
    for _ in range(2):
        for query in QUERIES:
            assert {a[0] for a in answer(kept, alice, query, limit=20)} <= set(stored)
            assert {a[0] for a in answer(kept, bob, query, limit=20)} <= bobs
    memo = memo_of(kept)
    assert memo.reads == 2  # one per scope
    assert memo.hits == 4 * len(QUERIES) - 2


def test_a_scope_written_between_its_recalls_stops_reading_its_print(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kept, other = kept_memory(hybrid_config), exact_memory(hybrid_config)
    memo = memo_of(kept)
    routes: list[str] = []
    route = memo.route

    def recorded(key: tuple[str, str]) -> Any:
        routes.append(route(key))
        return routes[-1]

    monkeypatch.setattr(memo, "route", recorded)
    for i in range(12):
        answer(kept, alice, QUERIES[i % len(QUERIES)])
        # A fact superseded, not only one stored: the facts stored since the rows were read do not make the print.
        other.store(f"Note {i}: the walrus deploy number is {1000 + i}.", supersedes=[stored[i]], caller=alice)
    # First read, then a print that finds the scope changed; then 1, 2, 4 recalls skip it, each after a print,
    # and none reads the rows again (two prints in a row never agree).
    assert routes == ["rows", "print", "exact", "print", "exact", "exact", "print", *["exact"] * 4, "print"]
    assert memo.reads == 1
    assert memo.caught == 0
    same_answers(kept, hybrid_config, alice, QUERIES)
    # Unchanged again: two prints in a row agree, the rows are read again and answer.
    key = (alice.org_id, alice.assignment_id)
    memo._entries[key].skips = 0
    answer(kept, alice, QUERIES[0])  # changed by the last store: the exact path
    memo._entries[key].skips = 0
    answer(kept, alice, QUERIES[0])  # the same print: read again
    assert memo.reads == 2
    hits = memo.hits
    same_answers(kept, hybrid_config, alice, QUERIES[:1])
    assert memo.hits == hits + 1
    assert routes[-1] == "print"


def test_facts_stored_elsewhere_between_recalls_are_caught_up_with(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kept, other = kept_memory(hybrid_config), exact_memory(hybrid_config)
    memo = memo_of(kept)
    answer(kept, alice, QUERIES[0])
    reads, recording = record_scope_reads(kept, monkeypatch)
    for i in range(6):
        other.store(f"Note {i}: the walrus deploy number is {1000 + i}.", caller=alice)
        expected = answer(other, alice, f"walrus deploy note {i}")
        recording[0] = True
        assert answer(kept, alice, f"walrus deploy note {i}") == expected
        recording[0] = False
    assert reads == []  # neither the scope nor the facts' text read again: only the facts stored since
    assert (memo.reads, memo.caught, memo.changed) == (1, 6, 6)
    assert memo.route((alice.org_id, alice.assignment_id)) == "print"
    same_answers(kept, hybrid_config, alice, ("walrus deploy number", *QUERIES))


def test_a_scope_bigger_than_the_memo_takes_the_exact_path(
    hybrid_config: MemoryConfig, alice: Caller, stored: list[str]
) -> None:
    kept = new_memory(hybrid_config, held=True, cache_facts=FACTS // 2)
    assert kept.kb is not None
    kept.kb.facts.exact_scope_max = 10**9
    same_answers(kept, hybrid_config, alice, QUERIES)
    memo = memo_of(kept)
    assert memo.route((alice.org_id, alice.assignment_id)) == "exact"
    assert (memo.reads, memo.hits) == (1, 0)
