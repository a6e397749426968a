"""Governed facts: atomic writes of governing row + chunk, scoped candidate search, ACL lookups.

The scope is applied inside the SQL: the candidate set is the caller's governing rows joined with
their chunks (``scope`` CTE, ``MATERIALIZED`` so the planner cannot turn it into a filtered HNSW
scan), and both rankings (lexical BM25 and exact vector distance) run over that set only. A huge
knowledge base of closer matches therefore cannot crowd an assignment's facts out of the top k.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.database import transaction
from haystack_osa_memory.errors import DatabaseError

FACT_SOURCE = "agent_fact"
FACT_AUDIENCE = "ai_internal"

# Upsert by deterministic id. A retired (forgotten) fact stored again starts afresh; otherwise the
# status a review or feedback gave it is kept. The WHERE refuses to touch a row of another scope.
UPSERT_GOVERNING_ROW = sql.SQL(
    """INSERT INTO {schema}.{gov}
    (id, org_id, specialist_id, dataset, source, audience, status, content_hash, title, metadata)
    VALUES (%(id)s, %(org_id)s, %(specialist_id)s, %(dataset)s, %(source)s, %(audience)s, %(status)s,
            %(content_hash)s, %(title)s, %(metadata)s)
    ON CONFLICT (id) DO UPDATE SET
        specialist_id = EXCLUDED.specialist_id,
        title = coalesce(EXCLUDED.title, {schema}.{gov}.title),
        status = CASE WHEN {schema}.{gov}.status = 'retired' THEN EXCLUDED.status ELSE {schema}.{gov}.status END,
        metadata = CASE WHEN {schema}.{gov}.status = 'retired' THEN EXCLUDED.metadata
                        ELSE {schema}.{gov}.metadata || EXCLUDED.metadata END,
        created_at = CASE WHEN {schema}.{gov}.status = 'retired' THEN now() ELSE {schema}.{gov}.created_at END,
        updated_at = now()
    WHERE {schema}.{gov}.org_id = EXCLUDED.org_id
      AND {schema}.{gov}.source = EXCLUDED.source
      AND {schema}.{gov}.content_hash = EXCLUDED.content_hash
      AND {schema}.{gov}.metadata->>'assignment_id' = EXCLUDED.metadata->>'assignment_id'
    RETURNING id, status"""
)
# Lexical statistics of a fact, computed once at write time (same expression the recall query
# falls back to), so recall does not re-tokenise every fact of the scope on every query. They are
# used only while the chunk's content still has the same md5 (a chunk changed by other tools is
# re-tokenised at query time).
UPSERT_TERMS = sql.SQL(
    """INSERT INTO {schema}.osa_fact_terms (document_id, language, content_md5, tsv, dl)
    SELECT %(id)s, %(language)s, md5(%(content)s), x.tsv,
           (SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0) FROM unnest(x.tsv) u)
    FROM (SELECT to_tsvector(%(language)s::regconfig,
                 regexp_replace(%(content)s, '^<!-- osa-memory:scope [^\n]* -->\n', '')) AS tsv) x
    ON CONFLICT (document_id) DO UPDATE SET
        language = EXCLUDED.language, content_md5 = EXCLUDED.content_md5, tsv = EXCLUDED.tsv, dl = EXCLUDED.dl"""
)
INSERT_AUDIT = sql.SQL(
    """INSERT INTO {mem}.audit (actor, action, org_id, assignment_id, document_id, details)
    VALUES (%(actor)s, %(action)s, %(org_id)s, %(assignment_id)s, %(document_id)s, %(details)s)"""
)
UPSERT_CHUNK = sql.SQL(
    """INSERT INTO {schema}.{chunk} (id, embedding, content, meta)
    VALUES (%(id)s, %(embedding)s::vector, %(content)s, %(meta)s)
    ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, content = EXCLUDED.content, meta = EXCLUDED.meta"""
)

# Candidates of one scope, both rankings over the scope's rows only. BM25 (k1, b) over the
# scope's documents, with the marker line removed before tokenising.
SCOPED_CANDIDATES = sql.SQL(
    """WITH scope AS MATERIALIZED (
    SELECT g.id AS document_id, c.content, c.embedding, g.metadata, g.created_at, g.updated_at
    FROM {schema}.{gov} g JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
    WHERE g.org_id = %(org_id)s
      AND g.audience = ANY(%(audiences)s)
      AND g.status = ANY(%(statuses)s)
      AND g.metadata->>'assignment_id' = %(assignment_id)s
),
docs AS (
    -- precomputed at write time (fact_terms), recomputed for rows written before it existed
    SELECT s.document_id,
           coalesce(t.tsv, to_tsvector(%(language)s::regconfig,
                    regexp_replace(s.content, '^<!-- osa-memory:scope [^\n]* -->\n', ''))) AS tsv,
           t.dl
    FROM scope s LEFT JOIN {schema}.osa_fact_terms t
        ON t.document_id = s.document_id AND t.language = %(language)s AND t.content_md5 = md5(s.content)
),
lens AS (
    SELECT document_id, tsv,
           coalesce(dl, (SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0) FROM unnest(tsv) u)
           )::float8 AS dl
    FROM docs
),
stats AS (SELECT count(*)::float8 AS n, greatest(avg(dl), 1)::float8 AS avgdl FROM lens),
q AS (SELECT DISTINCT lexeme FROM unnest(to_tsvector(%(language)s::regconfig, %(query)s))),
tf AS (
    SELECT l.document_id, u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS tf, l.dl
    FROM lens l, unnest(l.tsv) u
    WHERE u.lexeme IN (SELECT lexeme FROM q)
),
df AS (SELECT lexeme, count(*)::float8 AS df FROM tf GROUP BY lexeme),
lex AS (
    SELECT tf.document_id,
           sum(ln(1 + (s.n - df.df + 0.5) / (df.df + 0.5))
               * tf.tf * (%(k1)s + 1) / (tf.tf + %(k1)s * (1 - %(b)s + %(b)s * tf.dl / s.avgdl))) AS score
    FROM tf JOIN df USING (lexeme) CROSS JOIN stats s
    GROUP BY tf.document_id
),
lex_top AS (
    SELECT document_id, score, row_number() OVER (ORDER BY score DESC, document_id) AS rk
    FROM lex ORDER BY score DESC, document_id LIMIT %(k)s
),
vec_top AS (
    SELECT document_id, 1 - (embedding <=> p.qv) AS score,
           row_number() OVER (ORDER BY embedding <=> p.qv, document_id) AS rk
    FROM scope, (SELECT %(embedding)s::vector AS qv) p
    WHERE p.qv IS NOT NULL AND embedding IS NOT NULL
    ORDER BY embedding <=> p.qv, document_id LIMIT %(k)s
)
SELECT s.document_id, s.content, s.metadata, s.created_at, s.updated_at,
       l.rk AS lex_rank, l.score AS lex_score, v.rk AS vec_rank, v.score AS vec_score
FROM scope s
LEFT JOIN lex_top l USING (document_id)
LEFT JOIN vec_top v USING (document_id)
WHERE l.rk IS NOT NULL OR v.rk IS NOT NULL"""
)

GOVERNING_ROWS = sql.SQL(
    """SELECT id, org_id, audience, status, metadata->>'assignment_id' AS assignment_id
    FROM {schema}.{gov} WHERE id = ANY(%s)"""
)


@dataclass(frozen=True)
class GoverningRow:
    """The access-relevant columns of one governing row."""

    document_id: str
    org_id: str
    audience: str
    status: str
    assignment_id: str | None


@dataclass(frozen=True)
class Candidate:
    """One fact found in a scope, with its rank on each side (``None`` when that side missed it)."""

    document_id: str
    content: str
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    lex_rank: int | None
    lex_score: float | None
    vec_rank: int | None
    vec_score: float | None


def vector_literal(embedding: Sequence[float] | None) -> str | None:
    """pgvector's text form of an embedding (``None`` stays ``None``)."""
    if embedding is None:
        return None
    return "[" + ",".join(repr(float(x)) for x in embedding) + "]"


class FactRepository:
    """All SQL on governing rows and chunks, for one configuration.

    Usage:
    ```python
    repo = FactRepository(conn_str, MemoryConfig())
    repo.write([(governing_row, chunk)])
    candidates = repo.scoped_candidates(org_id="acme", assignment_id="a1", query="vpn", embedding=None, k=50)
    ```
    """

    def __init__(self, conn_str: str, config: MemoryConfig) -> None:
        self.conn_str = conn_str
        self.config = config
        names = {
            "schema": sql.Identifier(config.kb_schema),
            "gov": sql.Identifier(config.governing_table),
            "chunk": sql.Identifier(config.chunk_table),
            "mem": sql.Identifier(config.memory_schema),
        }
        self._upsert_row = UPSERT_GOVERNING_ROW.format(**names)
        self._upsert_chunk = UPSERT_CHUNK.format(**names)
        self._candidates = SCOPED_CANDIDATES.format(**names)
        self._governing_rows = GOVERNING_ROWS.format(**names)
        self._insert_audit = INSERT_AUDIT.format(mem=sql.Identifier(config.memory_schema))
        self._upsert_terms = UPSERT_TERMS.format(schema=sql.Identifier(config.kb_schema))

    def write(
        self,
        items: Sequence[tuple[dict[str, Any], dict[str, Any]]],
        *,
        audit: dict[str, Any] | None = None,
    ) -> list[str]:
        """Upsert governing rows and their chunks in ONE transaction: all become visible, or none.

        With ``audit`` (``actor``, ``action``), one audit row per fact is appended in the same
        transaction (the audit table lives in ``config.memory_schema``).

        Raises:
            DatabaseError: the database failed, or an id is taken by a document of another scope.
        """
        written: list[str] = []
        with transaction(self.conn_str, self.config) as conn:
            for row, chunk in items:
                params = {**row, "metadata": json.dumps(row["metadata"])}
                result = conn.execute(self._upsert_row, params).fetchone()
                if result is None:
                    msg = f"document id {row['id']} belongs to another document; refusing to overwrite it"
                    raise DatabaseError(msg)
                if audit is not None:
                    conn.execute(
                        self._insert_audit,
                        {
                            "actor": audit["actor"],
                            "action": audit["action"],
                            "org_id": row["org_id"],
                            "assignment_id": row["metadata"].get("assignment_id"),
                            "document_id": row["id"],
                            "details": json.dumps({"status": result[1], "kind": row["metadata"].get("kind")}),
                        },
                    )
                conn.execute(
                    self._upsert_chunk,
                    {
                        "id": chunk["id"],
                        "embedding": vector_literal(chunk.get("embedding")),
                        "content": chunk["content"],
                        "meta": json.dumps(chunk["meta"]),
                    },
                )
                conn.execute(
                    self._upsert_terms,
                    {"id": chunk["id"], "language": self.config.language, "content": chunk["content"]},
                )
                written.append(row["id"])
        return written

    def scoped_candidates(
        self,
        *,
        org_id: str,
        assignment_id: str,
        query: str,
        embedding: Sequence[float] | None,
        k: int,
        audiences: Sequence[str] = (FACT_AUDIENCE,),
        statuses: Sequence[str] | None = None,
        k1: float = 1.2,
        b: float = 0.75,
    ) -> list[Candidate]:
        """The top ``k`` of each ranking over the scope's own rows (never a post-filter)."""
        if embedding is not None and len(embedding) != self.config.embedding_dimension:
            msg = (
                f"query embedding has {len(embedding)} dimensions but the chunk table stores "
                f"{self.config.embedding_dimension}"
            )
            raise DatabaseError(msg)
        params = {
            "org_id": org_id,
            "assignment_id": assignment_id,
            "audiences": list(audiences),
            "statuses": list(statuses or self.config.admitted_statuses),
            "language": self.config.language,
            "query": query,
            "embedding": vector_literal(embedding),
            "k": k,
            "k1": k1,
            "b": b,
        }
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._candidates, params).fetchall()
        return [Candidate(*row) for row in rows]

    def governing_rows(self, document_ids: Sequence[str]) -> dict[str, GoverningRow]:
        """Governing rows by id (ids with no row are absent)."""
        if not document_ids:
            return {}
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._governing_rows, (list(document_ids),)).fetchall()
        return {r[0]: GoverningRow(*r) for r in rows}


def is_connection_problem(error: BaseException) -> bool:
    """True when ``error`` (or its cause) means the database could not be reached."""
    cause = error.__cause__ or error
    return isinstance(cause, psycopg.OperationalError)


COUNT_FACTS = sql.SQL(
    """SELECT count(*) FILTER (WHERE g.source = %(source)s) AS facts,
              count(DISTINCT g.metadata->>'assignment_id') FILTER (WHERE g.source = %(source)s) AS assignments,
              count(*) AS governing_rows,
              (SELECT count(*) FROM {schema}.{chunk}) AS chunks
    FROM {schema}.{gov} g"""
)


def count_facts(conn_str: str, config: MemoryConfig) -> dict[str, int]:
    """Facts, assignments with facts, governing rows and chunks in the knowledge base."""
    query = COUNT_FACTS.format(
        schema=sql.Identifier(config.kb_schema),
        gov=sql.Identifier(config.governing_table),
        chunk=sql.Identifier(config.chunk_table),
    )
    with transaction(conn_str, config) as conn:
        row = conn.execute(query, {"source": FACT_SOURCE}).fetchone()
    assert row is not None
    return dict(zip(("facts", "assignments", "governing_rows", "chunks"), map(int, row), strict=True))
