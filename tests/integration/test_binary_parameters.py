"""Binary parameters (`haystack_osa_memory.store.parameters`): PostgreSQL reads the same vectors and arrays
from them as from pgvector's text form and psycopg's own list dumper, and refuses what it refused before."""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, Memory
from haystack_osa_memory.store.facts import vector_literal
from haystack_osa_memory.store.parameters import TextArray, VectorParameter, text_array, vector_parameter

pytestmark = pytest.mark.integration


def _one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def test_vectors_read_as_from_the_text_form(memory: Memory) -> None:
    rng = np.random.default_rng(11)
    extremes = [np.float32(1e-38), np.float32(-3.4e38), np.nextafter(np.float32(1), np.float32(2)), 0.0, -0.0]
    float32 = np.concatenate([rng.standard_normal(379), extremes]).astype(np.float32)
    float64 = rng.standard_normal(384).tolist()  # not float32 values: each is rounded to the nearest float32
    with psycopg.connect(memory.config.pg_conn_str) as conn:
        for embedding in (float32, float32.tolist(), float64, [0.5]):
            binary = _one(conn, "SELECT %s::vector::text", vector_parameter(embedding))
            text = _one(conn, "SELECT %s::vector::text", vector_literal(embedding))
            assert binary == text
        # The same value, so the same distances, in the statements' own form.
        plain = float32[:379]  # without the extremes, whose squares overflow the norm
        distance = _one(conn, "SELECT %s::vector <=> %s::vector", vector_parameter(plain), vector_literal(plain))
        assert distance == pytest.approx(0.0, abs=1e-7)
        dimensions = _one(conn, "SELECT vector_dims(%s::vector(384))", vector_parameter(float32))
        assert dimensions == 384
        assert _one(conn, "SELECT %s::vector IS NULL", vector_parameter(None)) is True


@pytest.mark.parametrize(
    ("embedding", "why"),
    [([1.0, float("nan")], "NaN"), ([float("inf"), 1.0], "infinite"), ([], "at least 1 dimension")],
)
def test_vectors_pgvector_refuses_are_refused(memory: Memory, embedding: list[float], why: str) -> None:
    with psycopg.connect(memory.config.pg_conn_str) as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT %s::vector", (vector_parameter(embedding),))
        assert why in str(refused.value)
        conn.rollback()
        with pytest.raises(psycopg.Error):  # the text form was refused too
            conn.execute("SELECT %s::vector", (vector_literal(embedding),))


def test_a_vector_of_the_wrong_dimension_is_refused(memory: Memory) -> None:
    with psycopg.connect(memory.config.pg_conn_str) as conn, pytest.raises(psycopg.Error, match="expected 384"):
        conn.execute("SELECT %s::vector(384)", (vector_parameter([0.1, 0.2, 0.3]),))


def test_text_arrays_read_as_psycopgs_lists(memory: Memory) -> None:
    cases = [["a", "b"], [], [""], ["ünïcødé", "日本", "x" * 5000, "quote ' and \" and , { } \\ NULL"]]
    with psycopg.connect(memory.config.pg_conn_str) as conn:
        for values in cases:
            assert _one(conn, "SELECT %s::text[]", text_array(values)) == values
            assert _one(conn, "SELECT %s::text[] = %s::text[]", text_array(values), values) is True
        assert _one(conn, "SELECT 'b' = ANY(%s)", text_array(["a", "b"])) is True
        assert _one(conn, "SELECT 'NULL' = ANY(%s)", text_array(["NULL"])) is True
        assert _one(conn, "SELECT array_position(%s, NULL)", text_array(["NULL"])) is None


def test_a_text_array_with_a_nul_is_refused(memory: Memory) -> None:
    with psycopg.connect(memory.config.pg_conn_str) as conn, pytest.raises(psycopg.Error):
        conn.execute("SELECT %s::text[]", (text_array(["a\x00b"]),))


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every parameter value the process passes to `psycopg.Cursor.execute` from now on."""
    sent: list[Any] = []
    execute = psycopg.Cursor.execute

    def recording(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kwargs: Any) -> Any:
        sent.extend(params.values() if isinstance(params, dict) else (params or ()))
        return execute(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recording)
    return sent


def test_lexical_recall_sends_its_id_lists_in_binary(
    memory: Memory, alice: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory.store("The billing service deploys on Tuesdays", topic="ops", caller=alice)
    sent = _recording(monkeypatch)
    found = memory.recall("when does billing deploy", limit=5, caller=alice)["facts"]
    assert [f["content"] for f in found] == ["The billing service deploys on Tuesdays"]
    assert sent
    assert not any(isinstance(v, list) for v in sent)
    assert sum(isinstance(v, TextArray) for v in sent) >= 4  # audiences, statuses, lexemes, the hits' ids


@pytest.mark.embeddings
def test_hybrid_store_and_recall_send_vectors_in_binary(hybrid_memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stored vector is the one sent, to the float32 bit; the vector side of recall finds a paraphrase
    with no word in common."""
    me = Caller(org_id="acme", assignment_id="asg-1")
    sent = _recording(monkeypatch)
    fact = "The production cluster runs in the Frankfurt region"
    document_id = hybrid_memory.store(fact, caller=me)["document_id"]
    vectors = [v for v in sent if isinstance(v, VectorParameter)]
    assert len(vectors) >= 1
    # The fact's vector as sent: 20 bytes of array header, then (length, value) pairs of big-endian int32, float32.
    items = np.frombuffer(vectors[0].payload[20:], dtype=[("length", ">i4"), ("value", ">f4")])
    assert (items["length"] == 4).all()
    expected = items["value"].astype(np.float32)
    assert expected.shape == (384,)
    cfg = hybrid_memory.config
    chunk = sql.SQL("SELECT embedding::text FROM {}.{} WHERE meta->>'document_id' = %s").format(
        sql.Identifier(cfg.kb_schema), sql.Identifier(cfg.chunk_table)
    )
    with psycopg.connect(cfg.pg_conn_str) as conn:
        stored = _one(conn, chunk, document_id)
    assert np.array_equal(np.asarray(stored[1:-1].split(","), dtype=np.float32), expected)
    sent.clear()
    found = hybrid_memory.recall("which city hosts servers in Germany?", limit=1, caller=me)
    assert [f["content"] for f in found["facts"]] == [fact]
    assert any(isinstance(v, VectorParameter) for v in sent)
    assert not any(isinstance(v, (list, str)) and str(v).startswith("[") for v in sent)
