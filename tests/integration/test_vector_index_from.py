"""Only big scopes' recall rows go into the HNSW index of osa_fact_terms (schema 12): a row written while its scope
holds fewer than `fact_writing.VECTOR_INDEX_FROM` recall rows is left out, and the big-scope path still finds the
nearest vectors among all of a scope's rows, the left-out ones ranked exactly beside the index's candidates.
Rows written before the upgrade stay in the index."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from haystack.components.embedders import MockDocumentEmbedder, MockTextEmbedder
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store import fact_writing
from haystack_osa_memory.store.big_scope import BIG_SCOPE_SETTINGS
from haystack_osa_memory.store.parameters import vector_parameter
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import drop_schema, new_schema_config
from tests.integration.test_scope_cache import words_embedding  # a bag of hashed words: texts sharing words are near

pytestmark = pytest.mark.integration

FROM = 8  # VECTOR_INDEX_FROM in these tests


def hybrid(config: MemoryConfig) -> Memory:
    return Memory(
        config,
        document_embedder=MockDocumentEmbedder(embedding_fn=words_embedding),
        text_embedder=MockTextEmbedder(embedding_fn=words_embedding),
    )


def flags(config: MemoryConfig, caller: Caller) -> list[bool]:
    """The scope's recall rows' ``vector_indexed``, in storing order."""
    statement = sql.SQL(
        "SELECT vector_indexed FROM {}.osa_fact_terms WHERE org_id = %s AND assignment_id = %s ORDER BY seq"
    ).format(sql.Identifier(config.kb_schema))
    with psycopg.connect(config.pg_conn_str or "") as conn:
        return [r[0] for r in conn.execute(statement, (caller.org_id, caller.assignment_id)).fetchall()]


@pytest.fixture
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fact_writing, "VECTOR_INDEX_FROM", FROM)


@pytest.mark.usefixtures("small_threshold")
def test_rows_join_the_index_once_their_scope_is_past_the_threshold(
    config: MemoryConfig, alice: Caller, bob: Caller
) -> None:
    memory = hybrid(config)
    for i in range(FROM + 4):
        memory.store(f"Crate {i} holds part P-{i}.", caller=alice)
    for i in range(3):
        memory.store(f"Bin {i} holds bolt B-{i}.", caller=bob)
    assert flags(config, alice) == [False] * FROM + [True] * 4
    assert flags(config, bob) == [False] * 3  # counted per scope
    lexical = Memory(config, use_default_embedders=False)
    carol = Caller(org_id="acme", assignment_id="asg-gamma", specialist_id="spec-3")
    lexical.store("A fact without a vector.", caller=carol)
    assert flags(config, carol) == [True]  # no vector: no index entry either way, nothing to rank apart


def test_the_schema_has_the_partial_indexes_only(config: MemoryConfig) -> None:
    with psycopg.connect(config.pg_conn_str or "") as conn:
        rows = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = 'osa_fact_terms'",
            (config.kb_schema,),
        ).fetchall()
    indexes = dict(rows)
    assert "osa_fact_terms_embedding_idx" not in indexes
    assert "hnsw" in indexes["osa_fact_terms_vector_big_idx"]
    assert indexes["osa_fact_terms_vector_big_idx"].endswith("WHERE vector_indexed")
    assert indexes["osa_fact_terms_unindexed_idx"].endswith("WHERE (NOT vector_indexed)")


def nearest(memory: Memory, caller: Caller, query: str, k: int) -> tuple[list[int], list[float]]:
    """The big-scope path's nearest vectors (`BIG_SCOPE_VECTOR`, its session settings first): their seqs, and the
    distances of those rows computed exactly."""
    assert memory.kb is not None
    repo = memory.kb.facts
    config = memory.config
    params: dict[str, Any] = {
        "org_id": caller.org_id,
        "assignment_id": caller.assignment_id,
        "embedding": vector_parameter(words_embedding(query)),
        "vector_k": k,
    }
    distance = sql.SQL(
        "SELECT t.embedding <=> %(embedding)s::vector FROM {}.osa_fact_terms t WHERE t.seq = ANY(%(seqs)s) "
        "AND t.org_id = %(org_id)s ORDER BY 1"
    ).format(sql.Identifier(config.kb_schema))
    with psycopg.connect(config.pg_conn_str or "") as conn:
        conn.execute(BIG_SCOPE_SETTINGS, ("60",))
        seqs = [r[0] for r in conn.execute(repo._big_vector, params).fetchall()]
        distances = [float(r[0]) for r in conn.execute(distance, {**params, "seqs": seqs}).fetchall()]
    return seqs, distances


def exact_nearest(memory: Memory, caller: Caller, query: str, k: int) -> list[float]:
    """The distances of the scope's ``k`` nearest vectors, read without any index."""
    config = memory.config
    statement = sql.SQL(
        "SELECT t.embedding <=> %s::vector FROM {}.osa_fact_terms t WHERE t.org_id = %s AND t.assignment_id = %s "
        "AND t.embedding IS NOT NULL ORDER BY 1 LIMIT %s"
    ).format(sql.Identifier(config.kb_schema))
    with psycopg.connect(config.pg_conn_str or "") as conn:
        conn.execute("SET enable_indexscan = off")
        conn.execute("SET enable_bitmapscan = off")
        vector = vector_parameter(words_embedding(query))
        return [float(r[0]) for r in conn.execute(statement, (vector, caller.org_id, caller.assignment_id, k))]


@pytest.mark.usefixtures("small_threshold")
def test_the_big_scope_path_finds_the_nearest_among_both_kinds_of_rows(
    config: MemoryConfig, alice: Caller, bob: Caller
) -> None:
    memory = hybrid(config)
    services = ["billing", "search", "ledger", "payments", "identity"]
    for i in range(30):
        memory.store(f"The {services[i % 5]} job {i} runs in region r{i % 7}.", caller=alice)
    for i in range(10):
        memory.store(f"The billing job {i} runs in region r{i % 7}.", caller=bob)  # near alice's, never hers
    assert flags(config, alice).count(False) == FROM
    everything, _ = nearest(memory, alice, "billing job region", 100)
    assert len(everything) == 30  # the rows left out of the index are there too
    for query in ("billing job region r3", "which region does ledger run in", "identity job 12"):
        seqs, distances = nearest(memory, alice, query, 5)
        assert len(seqs) == 5
        assert distances == pytest.approx(exact_nearest(memory, alice, query, 5), abs=1e-6), query
    # And through recall itself: the big-scope path answers what the exact path answers.
    big, exact = hybrid(config.model_copy(update={"scope_cache_facts": 0})), hybrid(config)
    big.warm_up()
    exact.warm_up()
    assert big.kb is not None
    assert exact.kb is not None
    big.kb.facts.exact_scope_max, exact.kb.facts.exact_scope_max = 0, 10**9
    for query in ("billing job region r3", "which region does ledger run in"):
        got = [f["document_id"] for f in big.recall(query, limit=5, caller=alice)["facts"]]
        assert got == [f["document_id"] for f in exact.recall(query, limit=5, caller=alice)["facts"]], query


def test_rows_written_before_the_upgrade_stay_in_the_index(pg_conn_str: str) -> None:
    config = new_schema_config(pg_conn_str)
    try:
        ensure_schema(pg_conn_str, config, target_version=11)
        table = sql.SQL("{}.osa_fact_terms").format(sql.Identifier(config.kb_schema))
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (document_id, language, content_md5, dl, org_id, assignment_id, seq, embedding) "
                    "VALUES ('d1', 'english', 'x', 3, 'acme', 'a1', 1, %s::vector)"
                ).format(table),
                (vector_parameter(words_embedding("an old fact")),),
            )
        report = ensure_schema(pg_conn_str, config)
        assert report.applied == [12]
        with psycopg.connect(pg_conn_str) as conn:
            row = conn.execute(sql.SQL("SELECT vector_indexed FROM {} WHERE document_id = 'd1'").format(table))
            assert row.fetchone() == (True,)
    finally:
        drop_schema(pg_conn_str, config.kb_schema)
