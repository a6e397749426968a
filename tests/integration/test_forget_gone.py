"""Forgotten means gone: after `forget`, no text of the fact and nothing computed from its words stays in
any table (recall rows and their lexemes, vectors, successors, history, the retired row itself); only the
tombstone (content hash and former status) does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.embedders import build_embedders
from haystack_osa_memory.store.ranking import TERM_BITS
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import drop_schema, new_schema_config

pytestmark = pytest.mark.integration

SECRET = "Project quokkasecret codename mongooseword is live"
WORDS = ("quokkasecret", "mongooseword")
SUCCESSOR = "The project launch is paused until the audit ends"


def tables(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_type = 'BASE TABLE'",
        (schema,),
    ).fetchall()
    return [r[0] for r in rows]


def rows_with_words(pg_conn_str: str, config: MemoryConfig) -> list[tuple[str, str]]:
    """(table, row as text) of every row of every table of the knowledge base naming a forgotten word."""
    found = []
    with psycopg.connect(pg_conn_str) as conn:
        for table in tables(conn, config.kb_schema):
            query = sql.SQL("SELECT t::text FROM {}.{} t WHERE t::text ILIKE ANY(%s)").format(
                sql.Identifier(config.kb_schema), sql.Identifier(table)
            )
            for (text,) in conn.execute(query, ([f"%{w}%" for w in WORDS],)).fetchall():
                found.append((table, text))
    return found


def lexeme_hashes(pg_conn_str: str, config: MemoryConfig) -> set[int]:
    """The forgotten words' lexeme hashes as recall rows pack them (`facts.LEXEME_HASH`)."""
    with psycopg.connect(pg_conn_str) as conn:
        rows = conn.execute(
            "SELECT ('x' || left(md5(convert_to(l, 'UTF8')), 12))::bit(48)::int8 "
            "FROM unnest(tsvector_to_array(to_tsvector(%s::regconfig, %s))) l",
            (config.language, " ".join(WORDS)),
        ).fetchall()
    return {int(r[0]) for r in rows}


def packed_hashes(pg_conn_str: str, config: MemoryConfig) -> dict[str, set[int]]:
    """document id -> the lexeme hashes its recall row holds."""
    query = sql.SQL("SELECT document_id, terms FROM {}.osa_fact_terms").format(sql.Identifier(config.kb_schema))
    with psycopg.connect(pg_conn_str) as conn:
        rows = conn.execute(query).fetchall()
    out = {}
    for doc, terms in rows:
        raw = bytes(terms or b"")
        out[doc] = {int.from_bytes(raw[i : i + 8], "big", signed=True) >> TERM_BITS for i in range(0, len(raw), 8)}
    return out


def governing_row(pg_conn_str: str, config: MemoryConfig, doc: str) -> dict[str, Any]:
    query = sql.SQL("SELECT status, title, content_hash, metadata FROM {}.{} WHERE id = %s").format(
        sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table)
    )
    with psycopg.connect(pg_conn_str) as conn:
        row = conn.execute(query, (doc,)).fetchone()
    assert row is not None
    return dict(zip(("status", "title", "content_hash", "metadata"), row, strict=True))


def assert_gone(memory: Memory, me: Caller, pg_conn_str: str, config: MemoryConfig, forgotten: str) -> None:
    assert rows_with_words(pg_conn_str, config) == []
    hashes = lexeme_hashes(pg_conn_str, config)
    assert len(hashes) == len(WORDS)
    assert {doc: held & hashes for doc, held in packed_hashes(pg_conn_str, config).items() if held & hashes} == {}
    assert memory.recall("quokkasecret mongooseword", caller=me)["facts"] == [] or all(
        not set(WORDS) & set(f["content"].lower().split()) for f in memory.recall(" ".join(WORDS), caller=me)["facts"]
    )
    retired = governing_row(pg_conn_str, config, forgotten)
    assert retired["status"] == "retired"
    assert retired["title"] is None
    assert retired["content_hash"]
    assert set(retired["metadata"]) == {"assignment_id", "retired"}
    assert set(retired["metadata"]["retired"]) <= {"reason", "by", "at", "previous_status"}


class TestLexical:
    def test_a_successor_keeps_no_word_of_a_forgotten_predecessor(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        p = memory.store(SECRET, topic="quokkasecret launch", caller=alice)["document_id"]
        s = memory.store(SUCCESSOR, supersedes=[p], caller=alice)["document_id"]
        assert [f["document_id"] for f in memory.recall("quokkasecret mongooseword", caller=alice)["facts"]] == [s]
        memory.forget(p, "leaked codename", caller=alice)
        assert memory.recall("quokkasecret mongooseword", caller=alice)["facts"] == []
        assert "supersedes" not in memory.read(s, caller=alice)
        assert [v["document_id"] for v in memory.history(s, caller=alice)] == [s]
        assert_gone(memory, alice, pg_conn_str, config, p)
        # the successor is still found by its own words
        assert [f["document_id"] for f in memory.recall("project launch paused", caller=alice)["facts"]] == [s]

    def test_forgetting_the_middle_of_a_chain_keeps_only_the_others_words(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        first = memory.store("The launch codename is otterfirst", valid_from="2026-01-01", caller=alice)
        middle = memory.store(SECRET, valid_from="2026-02-01", supersedes=[first["document_id"]], caller=alice)
        last = memory.store(SUCCESSOR, valid_from="2026-03-01", supersedes=[middle["document_id"]], caller=alice)
        memory.forget(middle["document_id"], "leaked codename", caller=alice)
        assert memory.read(last["document_id"], caller=alice)["supersedes"] == [first["document_id"]]
        assert_gone(memory, alice, pg_conn_str, config, middle["document_id"])
        # the successor inherits the words of the predecessor that is still there
        found = memory.recall("otterfirst", caller=alice)["facts"]
        assert [f["document_id"] for f in found] == [last["document_id"]]

    def test_a_proposal_forgotten_keeps_no_title_paths_or_personas(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        doc = memory.propose(
            "fact", "quokkasecret plan", SECRET, paths=["docs/mongooseword.md"], personas=["quokkasecret"], caller=alice
        )["document_id"]
        memory.forget(doc, "withdrawn", caller=alice)
        assert_gone(memory, alice, pg_conn_str, config, doc)
        assert governing_row(pg_conn_str, config, doc)["metadata"]["retired"]["previous_status"] == "proposed"

    def test_an_observation_made_from_a_forgotten_fact_goes_with_it(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        repeat = memory.store("The project codename is live since today", caller=alice)["document_id"]
        doc = memory.store("The project codename quokkasecret mongooseword is live since today", caller=alice)
        report = memory.reflect(caller=alice)
        assert report["facts_consolidated"] == 2
        (observation,) = report["observations_created"]
        assert [f["document_id"] for f in memory.recall("quokkasecret", caller=alice)["facts"]] == [observation]
        memory.forget(doc["document_id"], "leaked codename", caller=alice)
        assert_gone(memory, alice, pg_conn_str, config, doc["document_id"])
        assert governing_row(pg_conn_str, config, observation)["status"] == "retired"
        # the other evidence is recalled again (the next reflect may group it anew)
        assert memory.read(repeat, caller=alice)["status"] == "approved"
        assert [f["document_id"] for f in memory.recall("project codename live", caller=alice)["facts"]] == [repeat]


@pytest.fixture
def hybrid_config(pg_conn_str: str) -> Iterator[MemoryConfig]:
    cfg = new_schema_config(pg_conn_str, embedder="minilm")
    ensure_schema(pg_conn_str, cfg)
    yield cfg
    drop_schema(pg_conn_str, cfg.kb_schema)


@pytest.mark.embeddings
def test_the_vector_path_keeps_nothing_of_a_forgotten_fact(pg_conn_str: str, hybrid_config: MemoryConfig) -> None:
    document_embedder, text_embedder = build_embedders(MemoryConfig(embedder="minilm"))
    memory = Memory(hybrid_config, document_embedder=document_embedder, text_embedder=text_embedder)
    me = Caller(org_id="acme", assignment_id="asg-1")
    p = memory.store(SECRET, caller=me)["document_id"]
    s = memory.store(SUCCESSOR, supersedes=[p], caller=me)["document_id"]
    names = {"schema": sql.Identifier(hybrid_config.kb_schema)}
    with psycopg.connect(pg_conn_str) as conn:
        row = conn.execute(
            sql.SQL("SELECT embedding::text FROM {schema}.osa_fact_terms WHERE document_id = %s").format(**names), (p,)
        ).fetchone()
    assert row is not None
    assert row[0]
    vector = row[0]
    memory.forget(p, "leaked codename", caller=me)
    assert_gone(memory, me, pg_conn_str, hybrid_config, p)
    with psycopg.connect(pg_conn_str) as conn:
        for table in tables(conn, hybrid_config.kb_schema):
            columns = conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                "AND udt_name = 'vector'",
                (hybrid_config.kb_schema, table),
            ).fetchall()
            for (column,) in columns:
                query = sql.SQL("SELECT count(*) FROM {schema}.{t} WHERE {c}::text = %s").format(
                    t=sql.Identifier(table), c=sql.Identifier(column), **names
                )
                hit = conn.execute(query, (vector,)).fetchone()
                assert hit is not None
                assert hit[0] == 0, (table, column)
    facts = memory.recall("quokkasecret mongooseword", caller=me)["facts"]
    assert all("quokkasecret" not in f["content"] for f in facts)
    assert [f["document_id"] for f in facts] in ([], [s])
