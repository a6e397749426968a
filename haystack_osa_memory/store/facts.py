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

import numpy as np
import numpy.typing as npt
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
INSERT_AUDIT = sql.SQL(
    """INSERT INTO {mem}.audit (actor, action, org_id, assignment_id, document_id, details)
    VALUES (%(actor)s, %(action)s, %(org_id)s, %(assignment_id)s, %(document_id)s, %(details)s)"""
)
# One fact in one statement (one round trip; a batch goes through pipeline mode): governing row,
# chunk, lexical statistics and, when asked, an audit row. Everything after the governing-row upsert
# selects FROM it, so when that upsert refuses (the id belongs to another scope) nothing is written.
# The lexical statistics (same expression the recall query falls back to) spare recall re-tokenising
# every fact of the scope on every query; they are used only while the chunk's content still has the
# same md5 (a chunk changed by other tools is re-tokenised at query time).
WRITE_FACT = sql.SQL(
    """WITH g AS ({upsert_row}),
a AS (
    INSERT INTO {mem}.audit (actor, action, org_id, assignment_id, document_id, details)
    SELECT %(actor)s, %(action)s, %(org_id)s, %(assignment_id)s, g.id,
           jsonb_build_object('status', g.status, 'kind', %(kind)s::text)
    FROM g WHERE %(audit)s::boolean
),
c AS (
    INSERT INTO {schema}.{chunk} (id, embedding, content, meta)
    SELECT %(chunk_id)s, %(embedding)s::vector, %(content)s, %(meta)s FROM g
    ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, content = EXCLUDED.content, meta = EXCLUDED.meta
),
t AS (
    INSERT INTO {schema}.osa_fact_terms (document_id, language, content_md5, tsv, dl)
    SELECT %(chunk_id)s, %(language)s, md5(%(content)s), x.tsv,
           (SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0) FROM unnest(x.tsv) u)
    FROM g, (SELECT to_tsvector(%(language)s::regconfig,
                    regexp_replace(%(content)s, '^<!-- osa-memory:scope [^\n]* -->\n', '')) AS tsv) x
    ON CONFLICT (document_id) DO UPDATE SET
        language = EXCLUDED.language, content_md5 = EXCLUDED.content_md5, tsv = EXCLUDED.tsv, dl = EXCLUDED.dl
)
SELECT id, status FROM g"""
)

# Candidates of one scope. The scope (governing rows joined with their chunks) is materialised first;
# everything after ranks that set only. Facts are placed in storing order (`seq`) and each fact is
# scored with a context window: its BM25 also counts `lex_ctx` x the term frequencies and lengths of
# the `window` facts stored before and after it, its cosine `vec_ctx` x theirs. The two sides are
# fused by a convex combination of max-normalised scores (`lex_share`). Lexical statistics come from
# osa_fact_terms (computed at write time) while the chunk is unchanged, else are recomputed.
#
# Cost: the scope carries no text and no vector. The cosine is computed while the scope is read
# (each vector is read once), only facts holding a query term are unnested (`tsv @@ any term`), and
# text, metadata and timestamps are fetched for the few ranked rows at the end.
SCOPED_CANDIDATES = sql.SQL(
    """WITH p AS MATERIALIZED (
    SELECT %(embedding)s::vector AS qv,
           tsvector_to_array(to_tsvector(%(language)s::regconfig, %(query)s)) AS lexemes,
           nullif(replace(plainto_tsquery(%(language)s::regconfig, %(query)s)::text, ' & ', ' | '), '')::tsquery AS anyq
),
base AS MATERIALIZED (
    SELECT s.document_id, s.chunk_id, s.cos,
           row_number() OVER (ORDER BY s.seq, s.created_at, s.document_id)::int AS pos,
           coalesce(t.tsv, (SELECT to_tsvector(%(language)s::regconfig,
                                   regexp_replace(c.content, '^<!-- osa-memory:scope [^\n]* -->\n', ''))
                            FROM {schema}.{chunk} c WHERE c.id = s.chunk_id)) AS tsv,
           t.dl
    FROM (
        SELECT g.id AS document_id, g.seq, g.created_at, c.id AS chunk_id, md5(c.content) AS content_md5,
               CASE WHEN p.qv IS NOT NULL AND c.embedding IS NOT NULL THEN 1 - (c.embedding <=> p.qv) END AS cos
        FROM {schema}.{gov} g JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id CROSS JOIN p
        WHERE g.org_id = %(org_id)s
          AND g.audience = ANY(%(audiences)s)
          AND g.status = ANY(%(statuses)s)
          AND g.metadata->>'assignment_id' = %(assignment_id)s
        OFFSET 0
    ) s LEFT JOIN {schema}.osa_fact_terms t
        ON t.document_id = s.document_id AND t.language = %(language)s::text AND t.content_md5 = s.content_md5
),
docs AS MATERIALIZED (
    SELECT pos, document_id, chunk_id, tsv, dl0 + %(lex_ctx)s * (sum(dl0) OVER fr - dl0) AS cdl,
           CASE WHEN cos IS NOT NULL THEN cos + %(vec_ctx)s * (sum(cos) OVER fr - cos) END AS vec_score
    FROM (
        SELECT b.*, coalesce(b.dl, (SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0)
                                    FROM unnest(b.tsv) u))::float8 AS dl0
        FROM base b
    ) x
    WINDOW fr AS (ORDER BY pos RANGE BETWEEN %(window)s::int PRECEDING AND %(window)s::int FOLLOWING)
),
stats AS MATERIALIZED (SELECT count(*)::float8 AS n, greatest(avg(cdl), 1)::float8 AS avgdl FROM docs),
matched AS MATERIALIZED (
    SELECT d.pos, u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS tf
    FROM docs d CROSS JOIN p, unnest(d.tsv) u
    WHERE d.tsv @@ p.anyq AND u.lexeme = ANY (p.lexemes)
),
tf AS MATERIALIZED (
    SELECT m.pos + o.off AS pos, m.lexeme,
           sum(CASE WHEN o.off = 0 THEN 1.0 ELSE %(lex_ctx)s END * m.tf)::float8 AS tf
    FROM matched m CROSS JOIN generate_series(-%(window)s::int, %(window)s::int) AS o(off)
    WHERE m.pos + o.off BETWEEN 1 AND (SELECT n FROM stats) AND (o.off = 0 OR %(lex_ctx)s > 0)
    GROUP BY 1, 2
),
lex AS MATERIALIZED (
    SELECT tf.pos,
           sum(ln(1 + (s.n - df.df + 0.5) / (df.df + 0.5))
               * tf.tf * (%(k1)s + 1) / (tf.tf + %(k1)s * (1 - %(b)s + %(b)s * d.cdl / s.avgdl))) AS score
    FROM tf JOIN (SELECT lexeme, count(*)::float8 AS df FROM tf GROUP BY lexeme) df USING (lexeme)
        JOIN docs d USING (pos) CROSS JOIN stats s
    GROUP BY tf.pos
),
fused AS (
    SELECT d.pos, d.document_id, d.chunk_id, l.score AS lex_score, d.vec_score,
           %(lex_share)s * coalesce(l.score / nullif(max(l.score) OVER (), 0), 0)
           + (1 - %(lex_share)s) * coalesce(d.vec_score / nullif(greatest(max(d.vec_score) OVER (), 0), 0), 0) AS fused
    FROM docs d LEFT JOIN lex l USING (pos)
    WHERE l.score IS NOT NULL OR d.vec_score IS NOT NULL
),
ranked AS MATERIALIZED (
    SELECT *
    FROM (
        SELECT *,
               CASE WHEN lex_score IS NOT NULL
                    THEN row_number() OVER (ORDER BY lex_score DESC NULLS LAST, pos) END AS lex_rank,
               CASE WHEN vec_score IS NOT NULL
                    THEN row_number() OVER (ORDER BY vec_score DESC NULLS LAST, pos) END AS vec_rank,
               row_number() OVER (ORDER BY fused DESC, pos) AS fused_rank
        FROM fused
    ) x
    WHERE lex_rank <= %(k)s OR vec_rank <= %(k)s OR fused_rank <= %(k)s
)
SELECT r.document_id, c.content, g.metadata, g.created_at, g.updated_at,
       r.lex_rank, r.lex_score, r.vec_rank, r.vec_score, r.fused, r.pos
FROM ranked r
    JOIN {schema}.{gov} g ON g.id = r.document_id
    JOIN {schema}.{chunk} c ON c.id = r.chunk_id"""
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
    fused: float = 0.0
    position: int = 0


Vector = Sequence[float] | npt.NDArray[np.float32]


def vector_literal(embedding: Vector | None) -> str | None:
    """pgvector's text form of an embedding (``None`` stays ``None``)."""
    if embedding is None:
        return None
    values = embedding.tolist() if isinstance(embedding, np.ndarray) else embedding
    return "[" + ",".join(repr(float(x)) for x in values) + "]"


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
        names = config.sql_names()
        self._upsert_row = UPSERT_GOVERNING_ROW.format(**names)
        self._candidates = SCOPED_CANDIDATES.format(**names)
        self._governing_rows = GOVERNING_ROWS.format(**names)
        self._write_fact = WRITE_FACT.format(upsert_row=self._upsert_row, **names)

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
        params = [
            {
                **row,
                "metadata": json.dumps(row["metadata"]),
                "audit": audit is not None,
                "actor": audit["actor"] if audit else None,
                "action": audit["action"] if audit else None,
                "assignment_id": row["metadata"].get("assignment_id"),
                "kind": row["metadata"].get("kind"),
                "chunk_id": chunk["id"],
                "embedding": vector_literal(chunk.get("embedding")),
                "content": chunk["content"],
                "meta": json.dumps(chunk["meta"]),
                "language": self.config.language,
            }
            for row, chunk in items
        ]
        written: list[str] = []
        with transaction(self.conn_str, self.config) as conn, conn.cursor() as cur:
            if len(params) == 1:
                cur.execute(self._write_fact, params[0])
            else:
                cur.executemany(self._write_fact, params, returning=True)
            for n, p in enumerate(params):
                if n:
                    cur.nextset()
                if cur.fetchone() is None:
                    msg = f"document id {p['id']} belongs to another document; refusing to overwrite it"
                    raise DatabaseError(msg)
                written.append(p["id"])
        return written

    def scoped_candidates(
        self,
        *,
        org_id: str,
        assignment_id: str,
        query: str,
        embedding: Vector | None,
        k: int,
        audiences: Sequence[str] = (FACT_AUDIENCE,),
        statuses: Sequence[str] | None = None,
        k1: float = 0.9,
        b: float = 0.3,
        window: int = 2,
        lex_ctx: float = 0.4,
        vec_ctx: float = 0.2,
        lex_share: float = 0.5,
    ) -> list[Candidate]:
        """The top ``k`` of each ranking (lexical, vector, fused) over the scope's own rows (never a post-filter)."""
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
            "window": window,
            "lex_ctx": lex_ctx if window > 0 else 0.0,
            "vec_ctx": vec_ctx if window > 0 else 0.0,
            "lex_share": lex_share,
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


COUNT_FACTS = sql.SQL(
    """SELECT count(*) FILTER (WHERE g.source = %(source)s) AS facts,
              count(DISTINCT g.metadata->>'assignment_id') FILTER (WHERE g.source = %(source)s) AS assignments,
              count(*) AS governing_rows,
              (SELECT count(*) FROM {schema}.{chunk}) AS chunks
    FROM {schema}.{gov} g"""
)


def count_facts(conn_str: str, config: MemoryConfig) -> dict[str, int]:
    """Facts, assignments with facts, governing rows and chunks in the knowledge base."""
    query = COUNT_FACTS.format(**config.sql_names())
    with transaction(conn_str, config) as conn:
        row = conn.execute(query, {"source": FACT_SOURCE}).fetchone()
    assert row is not None
    return dict(zip(("facts", "assignments", "governing_rows", "chunks"), map(int, row), strict=True))
