"""Recall right after a burst of writes: 10,000 facts arrive in one assignment before PostgreSQL's statistics
have seen them (autovacuum is held off on the test's tables, and the test runs no ANALYZE of its own).

Left to statistics that take the new scope for one row, the planner probed each fact's governing row
through the scope index, reading the whole scope once per fact: the first recall ran into the statement
timeout. Recall's statements probe governing rows by primary key whatever the statistics say, and an
import refreshes the statistics of what it loaded. The plans are read with EXPLAIN; no timing is asserted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from haystack import Document
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.facts import CONTEXT_STATUSES, FACT_AUDIENCE
from haystack_osa_memory.transfer import ImportItem

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FACTS = 10_000
SERVICES = ("billing", "search", "ingest", "vpn", "queue", "broker", "cache", "proxy")


def fact(n: int) -> str:
    return f"The {SERVICES[n % 8]} service of rack r{n % 97} uses port {10_000 + n} for lane l{n % 89}"


def prepare(pg_conn_str: str, config: MemoryConfig, memory: Memory, caller: Caller) -> None:
    """Statistics that know the org but not the new assignment (as after `init` and some use), and no
    autovacuum on the test's tables (it could otherwise analyze them at any moment of the test)."""
    other = Caller(org_id=caller.org_id, assignment_id="asg-earlier", specialist_id="s")
    for n in range(40):
        memory.store(f"Earlier fact {n} about the pager rota", caller=other)
    names = config.sql_names()
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        for table in (names["gov"], names["chunk"], sql.Identifier("osa_fact_terms")):
            conn.execute(sql.SQL("ALTER TABLE {}.{} SET (autovacuum_enabled = false)").format(names["schema"], table))
        conn.execute(sql.SQL("ANALYZE {schema}.{gov}, {schema}.{chunk}, {schema}.osa_fact_terms").format(**names))


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explain(pg_conn_str: str, statement: sql.Composable | bytes, params: dict[str, Any]) -> list[dict[str, Any]]:
    with psycopg.connect(pg_conn_str) as conn:
        query = (
            b"EXPLAIN (FORMAT JSON) " + statement
            if isinstance(statement, bytes)
            else sql.SQL("EXPLAIN (FORMAT JSON) ") + statement
        )
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return list(plan_nodes(row[0][0]["Plan"]))


def accesses(nodes: list[dict[str, Any]], table: str) -> list[tuple[str, str | None]]:
    """How each scan of ``table`` reads it: (node type, index name)."""
    return [(n["Node Type"], n.get("Index Name")) for n in nodes if n.get("Relation Name") == table]


def scope_params(config: MemoryConfig, caller: Caller) -> dict[str, Any]:
    return {
        "org_id": caller.org_id,
        "assignment_id": caller.assignment_id,
        "audiences": [FACT_AUDIENCE],
        "statuses": list(config.admitted_statuses),
        "read_statuses": [*config.admitted_statuses, *CONTEXT_STATUSES],
        "valid_at": "now",
        "history": False,
        "language": config.language,
        "embedding": None,
    }


def assert_probes_by_primary_key(pg_conn_str: str, config: MemoryConfig, memory: Memory, caller: Caller) -> None:
    """Every recall statement that reads a list of the scope's facts probes their governing rows (and chunks)
    by primary key: one index descent per fact, never a read of the scope per fact."""
    assert memory.kb is not None
    repo = memory.kb.facts
    gov_pkey = f"{config.governing_table}_pkey"
    params = scope_params(config, caller)
    # The held scope's full read (scopes of 5,001 to 50,000 facts).
    nodes = explain(pg_conn_str, repo._cache_statements.rows_after, {**params, "after": 0})
    assert set(accesses(nodes, config.governing_table)) == {("Index Scan", gov_pkey)}, nodes
    # The big-scope path's rows (candidates and their neighbours).
    with psycopg.connect(pg_conn_str) as conn:
        picked = conn.execute(
            sql.SQL(
                "SELECT seq, document_id FROM {}.osa_fact_terms WHERE org_id = %s AND assignment_id = %s "
                "ORDER BY seq LIMIT 200"
            ).format(sql.Identifier(config.kb_schema)),
            (caller.org_id, caller.assignment_id),
        ).fetchall()
    seqs, ids = [r[0] for r in picked], [r[1] for r in picked]
    nodes = explain(pg_conn_str, repo._big_rows, {**params, "seqs": seqs, "walk_before": 6, "walk_after": 5})
    assert set(accesses(nodes, config.governing_table)) == {("Index Scan", gov_pkey)}, nodes
    # The text of the facts returned.
    nodes = explain(pg_conn_str, repo._scope_facts, {**params, "document_ids": ids[:20], "chunk_ids": ids[:20]})
    assert set(accesses(nodes, config.governing_table)) == {("Index Scan", gov_pkey)}, nodes
    assert set(accesses(nodes, config.chunk_table)) == {("Index Scan", f"{config.chunk_table}_pkey")}, nodes


def store_without_import(memory: Memory, caller: Caller) -> None:
    """`FACTS` facts through the store pipeline (what agents' stores run), 500 per write."""
    assert memory.store_pipeline is not None
    mark = {"org_id": caller.org_id, "assignment_id": caller.assignment_id, "specialist_id": caller.specialist_id}
    for start in range(0, FACTS, 500):
        docs = [Document(content=fact(n), meta={"kind": "fact"}) for n in range(start, start + 500)]
        memory.store_pipeline.run(
            {
                "redact": {"documents": docs},
                "mark": {**mark, "status": None, "stored_by": caller.run_id},
                "write": {"actor": caller.run_id, "action": "store"},
            }
        )


def test_first_recall_right_after_importing_10000_facts(
    pg_conn_str: str, config: MemoryConfig, memory: Memory, alice: Caller
) -> None:
    prepare(pg_conn_str, config, memory, alice)
    items = [ImportItem(fact=fact(n), origin=str(n)) for n in range(FACTS)]
    report = memory.import_items(items, caller=alice, batch_size=500)
    assert (report.stored, report.analyzed) == (FACTS, True)
    assert_probes_by_primary_key(pg_conn_str, config, memory, alice)
    recalled = memory.recall("which port does the vpn service use for lane l7", caller=alice)["facts"]
    assert len(recalled) == 8
    assert all("vpn" in f["content"] for f in recalled[:3])


def test_recall_survives_statistics_that_have_not_seen_the_new_facts(
    pg_conn_str: str, config: MemoryConfig, memory: Memory, alice: Caller
) -> None:
    """Many stores (the store pipeline, no import): nothing refreshes the statistics."""
    prepare(pg_conn_str, config, memory, alice)
    store_without_import(memory, alice)
    with psycopg.connect(pg_conn_str) as conn:
        seen = conn.execute(
            "SELECT last_analyze, last_autoanalyze FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
            (config.kb_schema, config.governing_table),
        ).fetchone()
        assert seen is not None
        assert seen[1] is None  # autovacuum has not analyzed it: the statistics predate the 10,000 facts
    assert_probes_by_primary_key(pg_conn_str, config, memory, alice)
    held = memory.recall("which port does the vpn service use for lane l7", caller=alice)["facts"]
    assert len(held) == 8
    # The big-scope path (no held scope) and the exact path (a scope taken as small) answer too.
    repo = memory.kb.facts if memory.kb is not None else None
    assert repo is not None
    cache, repo.scope_cache = repo.scope_cache, None
    try:
        big = memory.recall("which port does the vpn service use for lane l7", caller=alice)["facts"]
        repo.exact_scope_max = FACTS + 1
        exact = memory.recall("which port does the vpn service use for lane l7", caller=alice)["facts"]
    finally:
        repo.scope_cache = cache
        repo.exact_scope_max = 5000
    assert len(big) == len(exact) == 8


def test_a_new_org_filled_by_stores_refreshes_the_statistics_on_its_first_big_recall(
    pg_conn_str: str, config: MemoryConfig, memory: Memory, alice: Caller
) -> None:
    """Statistics that have never seen the org take it for one row; probing by primary key needs the org too
    (a table distributed by org reaches one shard by it), and an org "of one row" makes the scope index look
    as good. The first recall of a big scope finds the recall rows written since the last ANALYZE
    outnumbering the table then, and refreshes the statistics before it reads the scope."""
    prepare(pg_conn_str, config, memory, alice)
    newco = Caller(org_id="newco", assignment_id="asg-new", specialist_id="s")
    store_without_import(memory, newco)
    recalled = memory.recall("which port does the vpn service use for lane l7", caller=newco)["facts"]
    assert len(recalled) == 8
    with psycopg.connect(pg_conn_str) as conn:
        seen = conn.execute(
            "SELECT last_analyze FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'osa_fact_terms'",
            (config.kb_schema,),
        ).fetchone()
    assert seen is not None
    assert seen[0] is not None
    assert_probes_by_primary_key(pg_conn_str, config, memory, newco)
