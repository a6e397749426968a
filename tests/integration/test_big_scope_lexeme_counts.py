"""The big-scope path reads a common lexeme's count from PostgreSQL's statistics instead of counting it,
and ranks as when it counts; without statistics it counts."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store import facts as facts_module
from haystack_osa_memory.store.facts import LEXEME_COUNT_CAP, RARE_LEXEME_MAX_DF, STATISTICS_TRUSTED_DF, term_key
from haystack_osa_memory.transfer import ImportItem

pytestmark = pytest.mark.integration

FACTS = STATISTICS_TRUSTED_DF + 100  # "deploy" is in every fact: taken from the statistics uncounted
WEEKLY = RARE_LEXEME_MAX_DF + 100  # "weekly" in this many: common, counted just past the rare bound first


def analyze(pg_conn_str: str, config: MemoryConfig) -> None:
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(sql.SQL("ANALYZE {}.osa_fact_terms").format(sql.Identifier(config.kb_schema)))


def recall_ids(memory: Memory, caller: Caller, query: str) -> list[str]:
    return [f["document_id"] for f in memory.recall(query, limit=5, caller=caller)["facts"]]


def test_common_lexemes_come_from_the_statistics(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    items = [
        ImportItem(f"We deploy service svc{i:04d} {'weekly ' if i < WEEKLY else ''}on port {8000 + i}.", f"line {i}")
        for i in range(FACTS)
    ]
    memory.import_items(items, caller=alice)
    memory.warm_up()
    assert memory.kb is not None
    repo = memory.kb.facts
    repo.exact_scope_max = 100  # this scope takes the big-scope path
    repo.scope_cache = None  # (not the scope held in memory)
    caps: list[tuple[int, int]] = []
    fresh = facts_module.FactRepository(repo.conn_str, repo.config)  # no counts remembered yet
    big_df = fresh._big_df

    class Recording(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            if query is big_df:
                caps.append((params["cap"], len(params["keys"])))
            return super().execute(query, params, **kwargs)

    query = "Where do we deploy service svc0042?"
    counted = recall_ids(memory, alice, query)  # no statistics yet: "deploy" is counted to the cap
    assert counted[0] == recall_ids(memory, alice, "svc0042")[0]
    analyze(pg_conn_str, config)
    terms = repo.query_terms("deploy weekly")
    assert len(terms.hashes) == 2
    keys = [term_key(alice.org_id, alice.assignment_id, h) for h in terms.hashes]
    scope = {"org_id": alice.org_id, "assignment_id": alice.assignment_id}
    with repo.reading() as conn, Recording(conn) as cur:
        estimated = fresh._lexeme_counts(cur, scope, keys)
        fresh.lexeme_estimates = False
        exact = fresh._lexeme_counts(cur, scope, keys)
    assert sorted(exact) == [WEEKLY, FACTS]
    for est, true in zip(estimated, exact, strict=True):
        assert abs(est - true) <= 0.05 * true  # the statistics' share times the table's rows
    # With statistics: "deploy" is not counted, "weekly" only just past the rare bound (one key); without
    # them, both go to the cap.
    assert caps == [(RARE_LEXEME_MAX_DF + 1, 1), (LEXEME_COUNT_CAP, 2)]
    fresh_memory = Memory(config, use_default_embedders=False)
    fresh_memory.warm_up()
    assert fresh_memory.kb is not None
    fresh_memory.kb.facts.exact_scope_max = 100
    fresh_memory.kb.facts.scope_cache = None
    assert recall_ids(fresh_memory, alice, query) == counted
