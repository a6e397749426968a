"""Customer search on one pipeline per `Memory`: its queries run on the pooled connections (no connection
per call), `top_k` is given per call, concurrent callers each get their own org's documents, and a fact
is still never returned."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from haystack import Document
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from tests.conftest import team_document_store

pytestmark = pytest.mark.integration

ORGS = ("acme", "globex", "initech")


def _customer_documents(pg_conn_str: str, config: MemoryConfig) -> list[Document]:
    """Three approved customer documents for acme (with embeddings), one for each other org, one draft; plus
    their governing rows. Returns what was written."""
    dim = config.embedding_dimension
    docs = [
        Document(
            id=f"acme-{i}#0",
            content=f"Refund policy part {i}: customers may ask for a refund within {30 * (i + 1)} days",
            meta={"document_id": f"acme-{i}"},
            embedding=[((i + 1) * (j + 1) % 7) / 7 + 0.1 for j in range(dim)],
        )
        for i in range(3)
    ]
    docs += [
        Document(id=f"{org}-0#0", content=f"Refund policy of {org}", meta={"document_id": f"{org}-0"})
        for org in ORGS[1:]
    ]
    docs.append(Document(id="draft-0#0", content="Refund policy draft", meta={"document_id": "draft-0"}))
    store = team_document_store(pg_conn_str, config)
    try:
        store.write_documents(docs)
    finally:
        store.close()
    gov = sql.SQL(
        "INSERT INTO {}.{} (id, org_id, dataset, source, audience, status) "
        "VALUES (%s, %s, 'docs', 'upload', 'customer', %s)"
    ).format(sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table))
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        for i in range(3):
            conn.execute(gov, (f"acme-{i}", "acme", "approved"))
        for org in ORGS[1:]:
            conn.execute(gov, (f"{org}-0", org, "approved"))
        conn.execute(gov, ("draft-0", "acme", "draft"))
    return docs


@pytest.fixture
def searched(memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig) -> tuple[Memory, str]:
    """Memory with a fact and the customer documents; returns it and the fact's id."""
    fact = memory.store("Refund policy secret: internal agents may refund up to 500 EUR", caller=alice)
    _customer_documents(pg_conn_str, config)
    return memory, str(fact["document_id"])


def test_customer_searches_open_no_connection_of_their_own(
    searched: tuple[Memory, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    memory, fact_id = searched
    memory.customer_search("refund policy", org_id="acme")  # warm: the pool holds a connection now
    opened: list[str] = []
    connect = psycopg.Connection.connect

    def counting(cls: type[psycopg.Connection[Any]], *args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        opened.append(cls.__name__)
        return connect.__func__(cls, *args, **kwargs)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(counting))
    for _ in range(20):
        found = memory.customer_search("refund policy", org_id="acme")
        assert {d.meta["document_id"] for d in found} == {"acme-0", "acme-1", "acme-2"}
        assert fact_id not in {d.meta["document_id"] for d in found}
    # A fresh document store per call opened (and set up) one connection each time: 20.
    assert len(opened) <= 1, f"{len(opened)} connections opened by 20 customer searches"


def test_one_pipeline_serves_every_call_with_its_own_top_k(searched: tuple[Memory, str]) -> None:
    memory, fact_id = searched
    assert memory.customer_search_pipeline is None
    # Only acme's three documents hold every word of this query: top_k alone decides how many come back.
    assert len(memory.customer_search("customers refund days", org_id="acme", top_k=1)) == 1
    pipeline = memory.customer_search_pipeline
    assert pipeline is not None
    assert len(memory.customer_search("customers refund days", org_id="acme", top_k=2)) == 2
    assert len(memory.customer_search("customers refund days", org_id="acme", top_k=3)) == 3
    assert len(memory.customer_search("customers refund days", org_id="acme")) == 3
    # Keyword candidates: acme's, other orgs', the draft and the fact; the filter keeps acme's approved ones.
    found = memory.customer_search("refund policy", org_id="acme", top_k=7)
    assert sorted(d.meta["document_id"] for d in found) == ["acme-0", "acme-1", "acme-2"]
    assert fact_id not in {d.meta["document_id"] for d in found}
    assert all(not (d.content or "").startswith("<!--") for d in found)
    assert memory.customer_search_pipeline is pipeline


def test_documents_read_as_the_plain_store_reads_them(
    searched: tuple[Memory, str], pg_conn_str: str, config: MemoryConfig
) -> None:
    memory, _ = searched
    plain = team_document_store(pg_conn_str, config)
    try:
        expected = {
            d.id: d
            for d in plain.filter_documents(
                {"field": "meta.document_id", "operator": "in", "value": ["acme-0", "acme-1", "acme-2"]}
            )
        }
    finally:
        plain.close()
    found = memory.customer_search("refund policy", org_id="acme")
    assert {d.id for d in found} == set(expected)
    for doc in found:
        assert doc.content == expected[doc.id].content
        assert doc.meta == expected[doc.id].meta
        assert doc.embedding is not None
        assert doc.embedding == expected[doc.id].embedding
        assert doc.score is not None
        assert doc.score > 0


def test_concurrent_customer_searches_each_get_their_own_org(searched: tuple[Memory, str]) -> None:
    memory, fact_id = searched
    wanted = {"acme": {"acme-0", "acme-1", "acme-2"}, "globex": {"globex-0"}, "initech": {"initech-0"}}
    start = threading.Barrier(6)
    seen: list[tuple[str, set[str]]] = []
    errors: list[BaseException] = []

    def search(org: str) -> None:
        try:
            start.wait()
            for _ in range(10):
                seen.append((org, {d.meta["document_id"] for d in memory.customer_search("refund policy", org_id=org)}))
        except BaseException as e:  # reported below: a thread's failure must fail the test
            errors.append(e)

    threads = [threading.Thread(target=search, args=(org,)) for org in ORGS * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(seen) == 60
    assert all(ids == wanted[org] for org, ids in seen)
    assert all(fact_id not in ids for _, ids in seen)
