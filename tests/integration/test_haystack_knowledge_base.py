"""Memory inside a knowledge base that Haystack made, not us: the team's `PgvectorDocumentStore` (768-d,
HNSW, written by `DocumentWriter`) and a governing table of customer rows. `init` and memory run while
the team's indexing pipeline keeps writing; the team's writes never fail or wait on us, their
retrievers keep working, and customer search through our filter returns no fact."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from haystack import Document, Pipeline
from haystack.components.writers import DocumentWriter
from haystack.document_stores.types import DuplicatePolicy
from haystack.utils import Secret
from haystack_integrations.components.retrievers.pgvector import (
    PgvectorEmbeddingRetriever,
    PgvectorKeywordRetriever,
)
from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.database import close_pools
from haystack_osa_memory.store.schema import CREATE_GOVERNING_TABLE, ensure_schema
from tests.conftest import drop_schema

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DIM = 768
TEAM_TABLE = "team_documents"
ME = Caller(org_id="acme", assignment_id="asg-kb")


def _vector(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(DIM).astype(np.float32)
    return (v / np.linalg.norm(v)).tolist()


def _customer_docs(start: int, n: int, rng: np.random.Generator) -> list[Document]:
    return [
        Document(
            id=f"cust-{i}",
            content=f"Customer article {i}: how invoices, refunds and the billing portal work (part {i % 7})",
            embedding=_vector(rng),
            meta={"document_id": f"cust-{i}"},
        )
        for i in range(start, start + n)
    ]


class TeamKnowledgeBase:
    """The team's side, built with Haystack's own components."""

    def __init__(self, conn_str: str) -> None:
        self.conn_str = conn_str
        self.schema = "team_" + uuid.uuid4().hex[:10]
        with psycopg.connect(conn_str, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
        self.store = self.document_store(conn_str, create_extension=True)
        self.indexing = Pipeline()
        self.indexing.add_component("writer", DocumentWriter(self.store, policy=DuplicatePolicy.OVERWRITE))
        self.config = MemoryConfig(
            pg_conn_str=conn_str,
            kb_schema=self.schema,
            memory_schema=self.schema + "_mem",
            chunk_table=TEAM_TABLE,
            embedding_dimension=DIM,
            embedder="none",
        )
        names = self.config.sql_names()
        with psycopg.connect(conn_str, autocommit=True) as conn:  # the team's governing table, customer rows
            conn.execute(CREATE_GOVERNING_TABLE.format(schema=names["schema"], table=names["gov"]))

    def document_store(self, conn_str: str, *, create_extension: bool = False) -> PgvectorDocumentStore:
        """The team's `PgvectorDocumentStore` on their table, connecting with ``conn_str``."""
        return PgvectorDocumentStore(
            connection_string=Secret.from_token(conn_str),
            schema_name=self.schema,
            table_name=TEAM_TABLE,
            embedding_dimension=DIM,
            search_strategy="hnsw",
            hnsw_index_name=f"{self.schema}_hnsw",
            keyword_index_name=f"{self.schema}_keyword",
            create_extension=create_extension,
        )

    def index(self, docs: list[Document]) -> None:
        self.indexing.run({"writer": {"documents": docs}})
        rows = [(d.id, "acme", "kb", "upload", "customer") for d in docs]
        with psycopg.connect(self.conn_str, autocommit=True) as conn, conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {schema}.{gov} (id, org_id, dataset, source, audience) VALUES (%s, %s, %s, %s, %s) "
                    "ON CONFLICT (id) DO NOTHING"
                ).format(**self.config.sql_names()),
                rows,
            )

    def drop(self) -> None:
        self.store.close() if hasattr(self.store, "close") else None
        drop_schema(self.conn_str, self.schema)
        drop_schema(self.conn_str, self.schema + "_mem")


@pytest.fixture
def team(pg_conn_str: str) -> Iterator[TeamKnowledgeBase]:
    kb = TeamKnowledgeBase(pg_conn_str)
    kb.index(_customer_docs(0, 300, np.random.default_rng(0)))
    try:
        yield kb
    finally:
        close_pools()
        kb.drop()


class Indexer(threading.Thread):
    """The team's indexing pipeline, writing batches of customer documents until stopped; it records
    how long each batch took and any error."""

    def __init__(self, kb: TeamKnowledgeBase) -> None:
        super().__init__(daemon=True)
        self.kb = kb
        self.stop = threading.Event()
        self.seconds: list[float] = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        rng = np.random.default_rng(1)
        start = 1000
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                self.kb.index(_customer_docs(start, 10, rng))
            except Exception as e:  # recorded and asserted on by the test
                self.errors.append(e)
            self.seconds.append(time.perf_counter() - t0)
            start += 10


def test_memory_lives_beside_a_haystack_made_knowledge_base(team: TeamKnowledgeBase) -> None:
    indexer = Indexer(team)
    indexer.start()
    try:
        time.sleep(0.5)
        report = ensure_schema(team.conn_str, team.config)  # while the team keeps writing
        assert f"{team.schema}.{TEAM_TABLE}" in report.existing
        memory = Memory(team.config, use_default_embedders=False)
        ids = [
            memory.store(f"Invoice export job {i} runs from bucket billing-{i}", topic="billing", caller=ME)[
                "document_id"
            ]
            for i in range(20)
        ]
        for i in range(20):
            hits = memory.recall(f"invoice export job {i} bucket", limit=3, caller=ME)["facts"]
            assert hits[0]["document_id"] == ids[i]
        time.sleep(0.5)
    finally:
        indexer.stop.set()
        indexer.join(30)
    assert indexer.errors == []
    assert len(indexer.seconds) >= 5
    # Row locks only: no batch of the team's waited on us (a batch takes tens of milliseconds alone).
    assert max(indexer.seconds) < 2.0, max(indexer.seconds)

    # The team's own retrievers still work on their table (customer documents come back) ...
    keyword = PgvectorKeywordRetriever(document_store=team.store, top_k=5)
    assert keyword.run(query="billing portal refunds")["documents"]
    embedding = PgvectorEmbeddingRetriever(document_store=team.store, top_k=5)
    assert len(embedding.run(query_embedding=_vector(np.random.default_rng(5)))["documents"]) == 5
    # ... and customer search through our governing-row filter returns no fact.
    customer = memory.customer_search("invoice billing", org_id="acme", top_k=50)
    assert customer, "customer documents are found"
    assert all(not d.id or d.id.startswith("cust-") for d in customer)
    assert not any("osa-memory:scope" in (d.content or "") for d in customer)


def _team_hits(kb: TeamKnowledgeBase, conn_str: str, query: str, vector: list[float]) -> dict[str, Any]:
    store = kb.document_store(conn_str)
    keyword = PgvectorKeywordRetriever(document_store=store, top_k=10).run(query=query)["documents"]
    vector_hits = PgvectorEmbeddingRetriever(document_store=store, top_k=10).run(query_embedding=vector)["documents"]
    return {"keyword": keyword, "embedding": vector_hits}


def test_team_retrievers_return_no_fact_with_row_level_security(team: TeamKnowledgeBase, pg_conn_str: str) -> None:
    """The team's unchanged retrievers, on the same table, through a role of their own: before RLS they
    return our fact (marker and all) as their top hit; with RLS, no fact at all."""
    role = "reader_" + team.schema
    names = {**team.config.sql_names(), "role": sql.Identifier(role)}
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {role} LOGIN").format(**names))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {schema} TO {role}").format(**names))
        conn.execute(sql.SQL("GRANT SELECT ON {schema}.{chunk}, {schema}.{gov} TO {role}").format(**names))
    reader = psycopg.conninfo.make_conninfo(pg_conn_str, user=role)
    try:
        ensure_schema(team.conn_str, team.config)
        memory = Memory(team.config, use_default_embedders=False)
        fact_id = memory.store("The escrow reconciliation secret sauce is in vault path kv/escrow", caller=ME)[
            "document_id"
        ]
        target = _vector(np.random.default_rng(9))
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:  # give the fact the query's vector
            conn.execute(
                sql.SQL("UPDATE {schema}.{chunk} SET embedding = %s::vector WHERE meta->>'document_id' = %s").format(
                    **names
                ),
                (str(target), fact_id),
            )
        before = _team_hits(team, reader, "escrow reconciliation vault", target)
        assert "osa-memory:scope" in before["keyword"][0].content
        assert "osa-memory:scope" in before["embedding"][0].content

        assert ensure_schema(team.conn_str, team.config, row_level_security=True).row_level_security
        after = _team_hits(team, reader, "escrow reconciliation vault", target)
        assert after["keyword"] == []
        assert after["embedding"]
        assert all("osa-memory:scope" not in (d.content or "") for d in after["embedding"])
        assert _team_hits(team, reader, "billing portal refunds", target)["keyword"]
        # Our own recall still finds it (the embedded test database connects as a superuser, which
        # bypasses RLS; the role tests in test_guest_database.py run memory under a runtime role).
        assert memory.recall("escrow reconciliation", caller=ME)["facts"][0]["document_id"] == fact_id
    finally:
        close_pools()
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {role} CASCADE; DROP ROLE {role}").format(**names))
