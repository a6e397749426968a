"""Scoped recall at scale: 20,000 closer distractors cannot crowd an assignment's facts out.

The knowledge base built here (once per module, in its own schema) holds:

- 15,000 customer chunks (7,500 customer documents of two orgs, two chunks each; some customer
  documents even carry the target's ``assignment_id`` in their metadata),
- 5,000 facts of other assignments (same org and another org; 500 of the other org's facts use
  the SAME assignment id as the target),
- 200 facts of the target scope whose status is not admitted (``archived``),
- and 30 target facts stored through the real :meth:`Memory.store` API.

Almost all of the 20,200 other chunks are built around the 30 test queries: their text contains
every word of a query several times (so BM25 / ``ts_rank_cd`` over the whole table ranks them
above the target, which has each word once), and their embedding is the query vector plus SMALL
noise (cosine ~0.9), while the target's embedding is the query vector plus LARGER noise (cosine
~0.6). Text is generated from word lists and templates; vectors are deterministic synthetic 384-d
unit vectors, bulk-loaded with ``COPY ... (FORMAT BINARY)``.

A "top k over the whole table, then keep the assignment's rows" design finds (almost) none of
the targets here; the scoped SQL finds all of them, never returns anything outside the scope, and
gives the same answer on the 30th run of a prepared statement as on the first (generic-plan trap).

The last tests are smoke tests of the benchmark ``benchmarks/scale.py`` at a tiny N (its own process and
schema on the same database): its recall through a real ``osa-memory serve`` over MCP must find every
target, report ordered latency percentiles, and leave no server process behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from haystack import Document, component
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.types.json import Jsonb

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.markers import add_marker, content_hash
from haystack_osa_memory.store.database import get_pool
from haystack_osa_memory.store.facts import (
    CONTEXT_STATUSES,
    FACT_AUDIENCE,
    FACT_SOURCE,
    FactRepository,
    vector_literal,
)
from haystack_osa_memory.store.ranking import RankingParams, rank_scope
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import REPO, drop_schema, new_schema_config

pytestmark = [pytest.mark.integration, pytest.mark.scale, pytest.mark.slow]

DIM = 384
K = 5
SEED = 20261114
TARGET = Caller(org_id="acme", assignment_id="asg-target", specialist_id="spec-target")
OTHER_ORG = "globex"

# Distractor counts (chunks). Their sum is the number of OTHER chunks (>= 20,000).
CUSTOMER_DOCS = 7_500  # two chunks each
CHUNKS_PER_CUSTOMER_DOC = 2
SAME_ORG_OTHER_FACTS = 3_000
OTHER_ORG_FACTS = 2_000  # 500 of them with the target's assignment id
OTHER_ORG_SAME_ASSIGNMENT_ID = 500
SAME_SCOPE_ARCHIVED = 200
CLUSTER_SHARE = 0.92  # share of distractors built around one of the test queries

DISTRACTOR_NOISE = 0.025  # |noise| ~ 0.49 -> cosine to the query ~0.90
TARGET_NOISE = 0.07  # |noise| ~ 1.37 -> cosine to the query ~0.59

# The three query words of target i are SYSTEMS[i], ASPECTS[i % 10] and COMMONS[i % 6]; filler
# vocabulary below shares no stem with them.
SYSTEMS = [
    "ledger", "gateway", "scheduler", "warehouse", "payroll", "mailer", "catalog", "checkout",
    "inventory", "kiosk", "telemetry", "firewall", "router", "printer", "scanner", "dashboard",
    "wiki", "helpdesk", "intranet", "timesheet", "badge", "elevator", "thermostat", "projector",
    "laptop", "tablet", "switchboard", "voicemail", "turnstile", "locker",
]  # fmt: skip
ASPECTS = [
    "credentials", "rotation", "outage", "maintenance", "migration",
    "renewal", "upgrade", "audit", "escalation", "failover",
]  # fmt: skip
COMMONS = ["procedure", "checklist", "contact", "policy", "window", "handbook"]
TEAMS = ["platform", "finance", "facilities", "security", "support", "legal", "data", "mobile", "sales", "research"]
PLACES = ["Berlin", "Lisbon", "Osaka", "Toronto", "Nairobi", "Lyon", "Austin", "Porto", "Seoul", "Dublin"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
MONTHS = ["January", "March", "April", "June", "August", "October", "November"]
NOUNS = [
    "budget", "roadmap", "invoices", "onboarding", "hiring", "travel", "expenses", "feedback",
    "training", "licences", "contracts", "quotas", "forecasts", "refunds", "shipping", "pricing",
]  # fmt: skip
EVENTS = ["review", "incident", "offsite", "release", "retrospective", "workshop"]
FIRST = ["Ana", "Bruno", "Chiara", "Dmitri", "Esra", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kemal", "Lena"]
LAST = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Silva", "Novak", "Haddad", "Brennan", "Kowalski", "Reyes"]

TARGET_TEMPLATES = [
    "{System} {aspect} {common}: {person} from the {team} team signs off, normally on {day} after {hour}; "
    "keep ticket {code} open until then.",
    "Note for later: the {system} {aspect} {common} moved to {place} in {month}, and {person} ({team}) is the one "
    "to ask; reference {code}.",
    "When the {system} {aspect} {common} is due, message {person} on {day} morning; the {team} runbook {code} "
    "lives in {place}.",
]
CLUSTER_SENTENCES = [
    "The {system} {aspect} {common} for {place} is reviewed by {team} every {day}.",
    "{Team} updated the {system} {common} and the {aspect} notes after the {month} {event}.",
    "Customers asking about {system} {aspect} should read the {common} page; {system} {aspect} {common} "
    "questions go to {team}.",
    "Our {system} {aspect} {common} guide covers {noun}, {noun2} and the {system} {aspect} itself.",
    "If the {system} {aspect} fails, follow the {common} in the {place} binder and call {team}.",
    "{System} {aspect}: see {common} section {section} before the {month} {event}.",
]
FILLER_SENTENCES = [
    "{Team} met in {place} on {day} to discuss {noun} and {noun2}.",
    "The {month} {event} covered {noun}, {noun2} and a short demo from {team}.",
    "Questions about {noun} go to the {team} desk in {place}.",
    "{Person} summarised the {event}: {noun} is on track, {noun2} slipped to {month}.",
    "Remember to file {noun} before {day}; {team} closes the books at {hour}.",
]


@dataclass(frozen=True)
class Target:
    """One target fact: its text, the crowded query, the query vector and the fact's own vector."""

    index: int
    text: str
    crowded_query: str
    query_vector: np.ndarray
    vector: np.ndarray
    document_id: str = ""


@dataclass(frozen=True)
class ScaledKb:
    """The module's knowledge base."""

    config: MemoryConfig
    conn_str: str
    memory: Memory
    repo: FactRepository
    targets: list[Target]
    other_chunks: int

    @property
    def target_ids(self) -> set[str]:
        return {t.document_id for t in self.targets}


def _unit(v: np.ndarray) -> np.ndarray:
    """``v`` (or each row of it) scaled to length 1, as float32."""
    out: np.ndarray = (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)
    return out


def _fill(template: str, rnd: random.Random, **fixed: str) -> str:
    values = {
        "team": rnd.choice(TEAMS),
        "place": rnd.choice(PLACES),
        "day": rnd.choice(DAYS),
        "month": rnd.choice(MONTHS),
        "noun": rnd.choice(NOUNS),
        "noun2": rnd.choice(NOUNS),
        "event": rnd.choice(EVENTS),
        "hour": f"{rnd.randint(7, 18)}:{rnd.choice(['00', '15', '30', '45'])}",
        "person": f"{rnd.choice(FIRST)} {rnd.choice(LAST)}",
        "section": str(rnd.randint(1, 40)),
        **fixed,
    }
    values |= {key.capitalize(): value[:1].upper() + value[1:] for key, value in list(values.items())}
    return template.format(**values)


def _query_words(i: int) -> dict[str, str]:
    return {"system": SYSTEMS[i], "aspect": ASPECTS[i % len(ASPECTS)], "common": COMMONS[i % len(COMMONS)]}


def _distractor_text(cluster: int | None, rnd: random.Random, sentences: int) -> str:
    """Text of one distractor: with a cluster, every query word of that cluster appears 2+ times."""
    if cluster is None:
        parts = [_fill(rnd.choice(FILLER_SENTENCES), rnd) for _ in range(sentences)]
    else:
        words = _query_words(cluster)
        cluster_count = max(2, sentences - rnd.randint(0, 2))
        parts = [_fill(rnd.choice(CLUSTER_SENTENCES), rnd, **words) for _ in range(cluster_count)]
        parts += [_fill(rnd.choice(FILLER_SENTENCES), rnd) for _ in range(sentences - cluster_count)]
        rnd.shuffle(parts)
    return " ".join(parts)


def _make_targets(rng: np.random.Generator, rnd: random.Random) -> list[Target]:
    query_vectors = _unit(rng.standard_normal((len(SYSTEMS), DIM)))
    people = rnd.sample([f"{f} {last}" for f in FIRST for last in LAST], len(SYSTEMS))
    targets = []
    for i, q in enumerate(query_vectors):
        words = _query_words(i)
        code = f"{''.join(rnd.choices('ABCDEFGHJKLMNPQRSTUVWXYZ', k=2))}-{rnd.randint(1000, 9999)}"
        text = _fill(TARGET_TEMPLATES[i % len(TARGET_TEMPLATES)], rnd, person=people[i], code=code, **words)
        vector = _unit(q + TARGET_NOISE * rng.standard_normal(DIM))
        crowded = f"{words['system']} {words['aspect']} {words['common']}"
        targets.append(Target(index=i, text=text, crowded_query=crowded, query_vector=q, vector=vector))
    return targets


def _doc_id(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def _bulk_load(conn_str: str, config: MemoryConfig, targets: list[Target], rng: np.random.Generator) -> int:
    """COPY the distractors (governing rows + chunks); returns the number of chunks written."""
    rnd = random.Random(SEED + 1)
    query_vectors = np.stack([t.query_vector for t in targets])
    governing: list[tuple[Any, ...]] = []
    chunks: list[tuple[str, str, dict[str, Any], int | None]] = []  # id, content, meta, cluster

    def cluster() -> int | None:
        return rnd.randrange(len(targets)) if rnd.random() < CLUSTER_SHARE else None

    for n in range(CUSTOMER_DOCS):
        org = TARGET.org_id if n % 5 else OTHER_ORG
        doc_id = _doc_id(org, "kb", f"customer-{n}")
        metadata = {"assignment_id": TARGET.assignment_id} if n % 25 == 0 else {}
        c = cluster()
        texts = [_distractor_text(c, rnd, rnd.randint(4, 8)) for _ in range(CHUNKS_PER_CUSTOMER_DOC)]
        governing.append(
            (doc_id, org, None, "kb", "upload", "customer", "approved", content_hash("".join(texts)),
             f"Customer guide {n}", json.dumps(metadata))
        )  # fmt: skip
        for part, text in enumerate(texts):
            meta = {"document_id": doc_id, "org_id": org, "source": "upload", "audience": "customer", "part": part}
            chunks.append((f"{doc_id}-{part}", text, meta, c))

    fact_specs = (
        [(TARGET.org_id, f"asg-{n % 30:04d}", "approved") for n in range(SAME_ORG_OTHER_FACTS)]
        + [(OTHER_ORG, TARGET.assignment_id, "approved")] * OTHER_ORG_SAME_ASSIGNMENT_ID
        + [(OTHER_ORG, f"asg-{n % 20:04d}", "approved") for n in range(OTHER_ORG_FACTS - OTHER_ORG_SAME_ASSIGNMENT_ID)]
        + [(TARGET.org_id, TARGET.assignment_id, "archived")] * SAME_SCOPE_ARCHIVED
    )
    for n, (org, assignment, status) in enumerate(fact_specs):
        c = cluster()
        content = add_marker(_distractor_text(c, rnd, rnd.randint(2, 4)), assignment)
        digest = content_hash(content)
        doc_id = _doc_id(org, config.dataset, digest, str(n))
        governing.append(
            (doc_id, org, f"spec-{n % 7}", config.dataset, FACT_SOURCE, FACT_AUDIENCE, status, digest, None,
             json.dumps({"assignment_id": assignment, "osa_memory": True}))
        )  # fmt: skip
        meta = {"document_id": doc_id, "org_id": org, "source": FACT_SOURCE, "audience": FACT_AUDIENCE}
        chunks.append((doc_id, content, meta, c))

    clusters = np.array([-1 if c is None else c for *_, c in chunks])
    vectors = rng.standard_normal((len(chunks), DIM)).astype(np.float32)
    in_cluster = clusters >= 0
    vectors[in_cluster] = query_vectors[clusters[in_cluster]] + DISTRACTOR_NOISE * vectors[in_cluster]
    vectors = _unit(vectors)

    names = config.sql_names()
    copy_gov = sql.SQL(
        "COPY {schema}.{gov} (id, org_id, specialist_id, dataset, source, audience, status, content_hash, title, "
        "metadata) FROM STDIN"
    ).format(**names)
    copy_chunks = sql.SQL("COPY {schema}.{chunk} (id, embedding, content, meta) FROM STDIN (FORMAT BINARY)").format(
        **names
    )
    with psycopg.connect(conn_str) as conn:
        register_vector(conn)
        with conn.cursor() as cur:
            with cur.copy(copy_gov) as copy:
                for row in governing:
                    copy.write_row(row)
            with cur.copy(copy_chunks) as copy:
                copy.set_types(["text", "vector", "text", "jsonb"])
                for (chunk_id, content, meta, _), vector in zip(chunks, vectors, strict=True):
                    copy.write_row((chunk_id, vector, content, Jsonb(meta)))
        conn.execute(sql.SQL("ANALYZE {schema}.{gov}").format(**names))
        conn.execute(sql.SQL("ANALYZE {schema}.{chunk}").format(**names))
    return len(chunks)


@component
class LookupTextEmbedder:
    """Test double: the synthetic query vector of a known query text."""

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = vectors

    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, list[float]]:
        return {"embedding": self.vectors[text]}


@component
class LookupDocumentEmbedder:
    """Test double (store side, unused here): the synthetic vector of a known fact text."""

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = vectors

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, list[Document]]:
        return {"documents": [replace(d, embedding=self.vectors[d.content or ""]) for d in documents]}


@pytest.fixture(scope="module")
def kb(pg_conn_str: str) -> Iterator[ScaledKb]:
    """The scaled knowledge base, built once for this module in its own schema (like ``config``)."""
    config = new_schema_config(pg_conn_str)
    assert "archived" not in config.admitted_statuses
    ensure_schema(pg_conn_str, config)
    rng = np.random.default_rng(SEED)
    targets = _make_targets(rng, random.Random(SEED))
    other_chunks = _bulk_load(pg_conn_str, config, targets, rng)

    memory = Memory(config, use_default_embedders=False)
    stored = []
    for t in targets:
        answer = memory.store(t.text, topic=f"{SYSTEMS[t.index]} {ASPECTS[t.index % len(ASPECTS)]}", caller=TARGET)
        stored.append(replace(t, document_id=answer["document_id"]))
    update = sql.SQL("UPDATE {}.{} SET embedding = %s::vector WHERE meta->>'document_id' = %s").format(
        sql.Identifier(config.kb_schema), sql.Identifier(config.chunk_table)
    )
    with psycopg.connect(pg_conn_str) as conn:
        for t in stored:
            assert conn.execute(update, (vector_literal(t.vector.tolist()), t.document_id)).rowcount == 1
    try:
        yield ScaledKb(config, pg_conn_str, memory, FactRepository(pg_conn_str, config), stored, other_chunks)
    finally:
        drop_schema(pg_conn_str, config.kb_schema)


def _assert_in_scope(kb: ScaledKb, document_ids: list[str]) -> None:
    """Every id is one of the target facts, and its governing row is the target scope's."""
    assert set(document_ids) <= kb.target_ids, "a document outside the 30 target facts was returned"
    rows = kb.repo.governing_rows(document_ids, TARGET.org_id)
    assert set(rows) == set(document_ids)
    for row in rows.values():
        assert (row.org_id, row.assignment_id, row.audience) == (TARGET.org_id, TARGET.assignment_id, FACT_AUDIENCE)
        assert row.status in kb.config.admitted_statuses


def test_knowledge_base_is_crowded(kb: ScaledKb) -> None:
    """Sanity: >= 20,000 other chunks, and every crowded query is matched by hundreds of them."""
    assert kb.other_chunks >= 20_000
    names = (sql.Identifier(kb.config.kb_schema), sql.Identifier(kb.config.chunk_table))
    count = sql.SQL(
        "SELECT count(*) FROM {}.{} WHERE to_tsvector('english', content) @@ plainto_tsquery('english', %s)"
    )
    closer = sql.SQL("SELECT count(*) FROM {}.{} WHERE embedding <=> %s::vector < %s")
    with psycopg.connect(kb.conn_str) as conn:
        total = conn.execute(sql.SQL("SELECT count(*) FROM {}.{}").format(*names)).fetchone()
        assert total is not None
        assert total[0] == kb.other_chunks + len(kb.targets)
        for t in kb.targets[:5]:
            lexical = conn.execute(count.format(*names), (t.crowded_query,)).fetchone()
            own_distance = float(1 - t.vector @ t.query_vector)
            vector = conn.execute(closer.format(*names), (vector_literal(t.query_vector.tolist()), own_distance))
            nearer = vector.fetchone()
            assert lexical is not None
            assert nearer is not None
            assert lexical[0] > 300, f"{t.crowded_query!r} matches only {lexical[0]} chunks"
            assert nearer[0] > 300, f"only {nearer[0]} chunks are closer to query {t.index} than its target"


def test_recall_finds_every_target_by_its_own_text(kb: ScaledKb) -> None:
    for t in kb.targets:
        facts = kb.memory.recall(t.text, limit=K, caller=TARGET)["facts"]
        ids = [f["document_id"] for f in facts]
        assert ids[0] == t.document_id, f"target {t.index} not first for its own text: {ids}"
        assert facts[0]["content"] == t.text
        _assert_in_scope(kb, ids)


def test_recall_finds_every_target_by_a_crowded_query(kb: ScaledKb) -> None:
    for t in kb.targets:
        facts = kb.memory.recall(t.crowded_query, limit=K, caller=TARGET)["facts"]
        ids = [f["document_id"] for f in facts]
        assert t.document_id in ids, f"target {t.index} missing for {t.crowded_query!r}: {ids}"
        assert all("osa-memory:scope" not in f["content"] for f in facts)
        _assert_in_scope(kb, ids)


def test_vector_side_finds_every_target(kb: ScaledKb) -> None:
    for t in kb.targets:
        candidates = kb.repo.scoped_candidates(
            org_id=TARGET.org_id,
            assignment_id=TARGET.assignment_id,
            query=t.crowded_query,
            embedding=t.query_vector.tolist(),
            ranking=RankingParams(k=K),
        )
        by_vector = sorted((c for c in candidates if c.vec_rank is not None), key=lambda c: c.vec_rank or 0)
        assert len(by_vector) >= K  # the vector top k (plus rows other rankings brought in, with their vector rank)
        assert [c.vec_rank for c in by_vector[:K]] == list(range(1, K + 1))
        assert by_vector[0].document_id == t.document_id, f"target {t.index} is not the nearest in scope"
        _assert_in_scope(kb, [c.document_id for c in candidates])


def test_hybrid_recall_pipeline_finds_every_target(kb: ScaledKb) -> None:
    queries = {t.crowded_query: t.query_vector.tolist() for t in kb.targets}
    facts_by_text = {t.text: t.vector.tolist() for t in kb.targets}
    hybrid = Memory(
        kb.config, document_embedder=LookupDocumentEmbedder(facts_by_text), text_embedder=LookupTextEmbedder(queries)
    )
    for t in kb.targets:
        answer = hybrid.recall(t.crowded_query, limit=K, caller=TARGET)
        assert "degraded" not in answer
        ids = [f["document_id"] for f in answer["facts"]]
        assert ids[0] == t.document_id, f"target {t.index} not first in hybrid recall: {ids}"
        _assert_in_scope(kb, ids)


def test_repeated_query_on_one_pooled_connection_does_not_degrade(kb: ScaledKb) -> None:
    """30 runs of one prepared statement, forced onto a GENERIC plan, on one pooled connection.

    Our pool disables psycopg's automatic preparation; this test turns it back on (psycopg's default
    would prepare after 5 runs, PostgreSQL goes generic after 5 more) and forces the generic plan
    from the first run, so the query shape itself is shown to be safe, not just the pool setting.
    """
    t = kb.targets[7]
    query = kb.repo.scope_rows_statement
    params = {
        "org_id": TARGET.org_id,
        "assignment_id": TARGET.assignment_id,
        "audiences": [FACT_AUDIENCE],
        "statuses": list(kb.config.admitted_statuses),
        "read_statuses": [*kb.config.admitted_statuses, *CONTEXT_STATUSES],
        "language": "english",
        "query": t.crowded_query,
        "embedding": vector_literal(t.query_vector.tolist()),
        "lexemes": kb.repo.query_terms(t.crowded_query).lexemes,
        "valid_at": "now",
        "history": False,
    }
    with get_pool(kb.conn_str, kb.config).connection() as conn:
        try:
            conn.prepare_threshold = 0
            conn.execute("SET plan_cache_mode = force_generic_plan")
            runs = [[tuple(r) for r in conn.execute(query, params, prepare=True).fetchall()] for _ in range(30)]
            plans = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE generic_plans > 0"
            ).fetchall()
        finally:
            conn.close()  # the pool discards it: no prepared statement or setting leaks to other users
    assert plans, "the statement was not run with a generic plan"
    assert sum(p[0] for p in plans) >= 29
    assert all(run == runs[0] for run in runs), "results changed between runs of the same prepared statement"
    ids = [row[0] for row in runs[0]]
    assert len(ids) == len(set(ids)) == len(kb.targets)  # the scope's rows, each once
    _assert_in_scope(kb, ids)
    _, _, _, cos, dl, terms, _, _ = zip(*runs[0], strict=True)
    hits = rank_scope(cos, dl, terms, kb.repo.query_terms(t.crowded_query).hashes, RankingParams(k=K))
    assert t.document_id in [ids[h.row] for h in sorted(hits, key=lambda h: -h.fused)[:K]]

    # The public path (pooled, no prepared statements), 30 times: the same answer every time.
    answers = [
        [f["document_id"] for f in kb.memory.recall(t.crowded_query, limit=K, caller=TARGET)["facts"]]
        for _ in range(30)
    ]
    assert all(a == answers[0] for a in answers)
    assert t.document_id in answers[0]


def test_naive_top_k_then_filter_misses_targets(kb: ScaledKb) -> None:
    """The flaw we avoid: rank the WHOLE chunk table, take top k, then keep the assignment's rows."""
    names = kb.config.sql_names()
    naive_lexical = sql.SQL(
        """SELECT c.meta->>'document_id' FROM {schema}.{chunk} c
        WHERE to_tsvector('english', c.content) @@ plainto_tsquery('english', %(q)s)
        ORDER BY ts_rank_cd(to_tsvector('english', c.content), plainto_tsquery('english', %(q)s)) DESC
        LIMIT %(k)s"""
    ).format(**names)
    naive_vector = sql.SQL(
        "SELECT c.meta->>'document_id' FROM {schema}.{chunk} c ORDER BY c.embedding <=> %(v)s::vector LIMIT %(k)s"
    ).format(**names)
    post_filter = sql.SQL(
        """SELECT id FROM {schema}.{gov} WHERE id = ANY(%(ids)s) AND org_id = %(org)s
        AND audience = %(audience)s AND status = 'approved' AND metadata->>'assignment_id' = %(asg)s"""
    ).format(**names)

    naive = {"lexical": 0, "vector": 0}
    ours = {"lexical": 0, "vector": 0}
    with psycopg.connect(kb.conn_str) as conn:
        for t in kb.targets:
            for side, statement, params in (
                ("lexical", naive_lexical, {"q": t.crowded_query, "k": K}),
                ("vector", naive_vector, {"v": vector_literal(t.query_vector.tolist()), "k": K}),
            ):
                top = [r[0] for r in conn.execute(statement, params).fetchall()]
                scope = {"ids": top, "org": TARGET.org_id, "audience": FACT_AUDIENCE, "asg": TARGET.assignment_id}
                kept = {r[0] for r in conn.execute(post_filter, scope).fetchall()}
                naive[side] += t.document_id in kept
            candidates = kb.repo.scoped_candidates(
                org_id=TARGET.org_id,
                assignment_id=TARGET.assignment_id,
                query=t.crowded_query,
                embedding=t.query_vector.tolist(),
                ranking=RankingParams(k=K),
            )
            ours["lexical"] += any(c.document_id == t.document_id and c.lex_rank is not None for c in candidates)
            ours["vector"] += any(c.document_id == t.document_id and c.vec_rank is not None for c in candidates)
    assert ours == {"lexical": len(kb.targets), "vector": len(kb.targets)}
    print(f"found by top {K} then filter: {naive}; by the scoped query: {ours} (of {len(kb.targets)})")
    assert naive["lexical"] < ours["lexical"], naive
    assert naive["vector"] < ours["vector"], naive


BENCHMARK = REPO / "benchmarks" / "scale.py"
BENCH_QUERIES = 6
BENCH_ARGS = [
    "--chunks", "400", "--assignments", "8", "--facts-per-assignment", "3",
    "--queries", str(BENCH_QUERIES), "--topics", "60", "--k", "5", "--skip-hnsw",
]  # fmt: skip


def _run_benchmark(pg_conn_str: str, out: Path, *extra: str) -> tuple[dict[str, Any], str]:
    """(JSON report, stdout) of ``benchmarks/scale.py`` at a tiny N, in its own process."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), *BENCH_ARGS, "--json", str(out), *extra],
        env={**os.environ, "PG_CONN_STR": pg_conn_str},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"scale.py failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return report, done.stdout


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def test_benchmark_recalls_through_mcp(pg_conn_str: str, tmp_path: Path) -> None:
    report, stdout = _run_benchmark(pg_conn_str, tmp_path / "scale.json")
    rows = {(r["design"], r["side"]): r for r in report["results"]}
    through_mcp = rows[("(c) ours, MCP kb_memory_recall (lexical)", "lexical")]
    in_process = rows[("(c) ours, Memory.recall (lexical)", "lexical")]
    for row in (through_mcp, in_process):
        assert row["completeness"] == {"own": 100.0, "para": 100.0}, row
        assert row["queries"] == 2 * BENCH_QUERIES
        assert 1 <= row["returned"] <= 5
        latency = row["latency_ms"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"], latency

    mcp = report["mcp"]
    assert mcp["tool"] == "kb_memory_recall"
    assert "OSA_MEMORY_EMBEDDER=none" in mcp["server"]
    assert mcp["tokens"] == mcp["sessions"] == BENCH_QUERIES  # one target per assignment, one session per token
    assert mcp["calls_timed"] == 2 * BENCH_QUERIES
    assert mcp["call_ms"] == through_mcp["latency_ms"]
    opened = mcp["session_open_ms"]
    assert 0 < opened["p50"] <= opened["p95"] <= opened["p99"], opened
    assert not _process_exists(mcp["server_pid"]), "the benchmark left its MCP server running"
    assert "Recall latency through MCP p50" in stdout


def test_benchmark_without_mcp(pg_conn_str: str, tmp_path: Path) -> None:
    report, _ = _run_benchmark(pg_conn_str, tmp_path / "scale.json", "--no-mcp")
    assert report["mcp"] == {}
    assert not [r for r in report["results"] if "MCP" in r["design"] or r["design"].endswith("(lexical)")]
    assert any(r["design"] == "(c) ours, Memory.recall (hybrid)" for r in report["results"])
