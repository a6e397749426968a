"""A scope's candidates: the exact path, which reads every fact of a scope in one statement with the query's
terms (`SCOPE_RECALL_ROWS`; `SCOPE_ROWS` when a fact lacks its recall row) and ranks them here, the hits either
path returns (`ScopeHit`), and the text of the few facts a recall returns, read with the scope checked again
(`SCOPE_FACTS`, `Candidate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from psycopg import sql

from haystack_osa_memory.store.ranking import RankingParams, context_kept, rank_scope

# The caller's governing rows a recall reads, the scope's condition itself: `SCOPE_ROWS` reads them, and so
# does the print of a scope's kept rows (`scope_memo`), with the columns ``{columns}`` adds, or with only the
# columns it names (``{select}``: the print reads each row's id and version alone).
SCOPE_GOVERNING_ROWS = sql.SQL(
    """SELECT {select}
    FROM {schema}.{gov} g
    WHERE g.org_id = %(org_id)s
      AND g.audience = ANY(%(audiences)s)
      AND g.status = ANY(%(read_statuses)s)
      AND g.metadata->>'assignment_id' = %(assignment_id)s
      AND {valid_at}"""
)
_ROW_COLUMNS = sql.SQL(
    """g.id AS document_id, g.seq, g.created_at, g.metadata->>'expires_at' AS expires_at, g.content_hash,
           g.status = ANY(%(statuses)s) AS scored{columns}"""
)


def scope_governing_rows(
    names: dict[str, sql.Identifier],
    valid_at: sql.Composable,
    columns: sql.Composable | None = None,
    *,
    only: sql.Composable | None = None,
) -> sql.Composed:
    """`SCOPE_GOVERNING_ROWS` for these table names and validity condition: the columns a ranking reads and the
    added ``columns`` (none by default), or the columns ``only`` names instead."""
    select = only if only is not None else _ROW_COLUMNS.format(columns=columns or sql.SQL(""))
    return SCOPE_GOVERNING_ROWS.format(select=select, valid_at=valid_at, **names)


# The rows of one scope, in storing order (`seq`): the caller's governing rows and nothing else, so
# there is no top-k before the scope is applied and a huge knowledge base of closer matches cannot
# crowd an assignment's facts out. For each fact it returns what ranking needs
# (`haystack_osa_memory.store.ranking`): the cosine with the query, the length in lexemes and the
# packed lexemes (LEXEME_STATS), matched against the query's (QUERY_TERMS) in numpy. These come from
# the fact's row in osa_fact_terms, written with the fact (lexical statistics and a copy of the
# chunk's vector) and used while its content hash is the governing row's; a fact without one (written
# by other tools, or before schema 7) is read from its chunk and tokenised at query time (only its
# lexemes that are the query's are packed: that is all the ranking reads). One narrow row per fact is
# cheaper than joining the chunk table, and matching lexemes in numpy cheaper than filtering each
# tsvector in SQL (measured: benchmarks/README.md, "Why the code is shaped this way"). Text,
# metadata and timestamps are fetched afterwards for the few facts returned (SCOPE_FACTS). The recall
# row is fetched by primary key per fact (a fenced LATERAL): under row-level security the planner
# misjudged the policy-filtered table and re-scanned it for every fact. Facts of
# `CONTEXT_STATUSES` are read too (``read_statuses``), marked unscored: they only lend context.
SCOPE_ROWS = sql.SQL(
    """WITH s AS MATERIALIZED (
    {governing_rows}
)
SELECT s.document_id, coalesce(t.document_id, f.chunk_id) AS chunk_id, s.expires_at,
       coalesce(1 - (coalesce(t.embedding, f.embedding) <=> %(embedding)s::vector), 'NaN') AS cos,
       coalesce(t.dl, f.dl)::float8 AS dl, coalesce(t.terms, f.terms) AS terms, s.scored, s.seq
FROM s
    LEFT JOIN LATERAL (
        SELECT t.document_id, t.embedding, t.dl, t.terms FROM {schema}.osa_fact_terms t
        WHERE t.document_id = s.document_id AND t.org_id = %(org_id)s AND t.content_hash = s.content_hash
          AND t.language = %(language)s::text
          AND t.terms IS NOT NULL
        OFFSET 0  -- one primary-key lookup per fact (see SCOPE_ROWS' comment)
    ) t ON true
    LEFT JOIN LATERAL (
        SELECT c.id AS chunk_id, c.embedding, x.dl, x.terms
        FROM {schema}.{chunk} c,
             LATERAL (SELECT to_tsvector(%(language)s::regconfig,
                             regexp_replace(c.content, '^<!-- osa-memory:scope [^\n]* -->\n', '')) AS tsv
                      OFFSET 0) v,  -- tokenised once: a flattened subquery would repeat it per use
             LATERAL ({lexeme_stats}) x  -- packing only the query's lexemes
        WHERE t.document_id IS NULL AND c.meta->>'document_id' = s.document_id
        OFFSET 0  -- a fence: the planner would otherwise hash-join every chunk of the table
    ) f ON true
WHERE t.document_id IS NOT NULL OR f.chunk_id IS NOT NULL
ORDER BY s.seq, s.created_at, s.document_id"""
)

# The exact path's usual statement: `SCOPE_ROWS` without the chunk fallback, and the query's lexemes and their
# hashes (``{query_terms}``, `recall_rows.QUERY_TERMS`) in the same round trip, on the first row only (each row
# would otherwise carry two arrays to parse). A fact without a usable recall row comes back with no chunk id:
# the caller then runs `SCOPE_ROWS` with those lexemes. The fallback's joins were a third of `SCOPE_ROWS`'
# planning and the query's lexemes a round trip of their own, on every store (its search for the facts it may
# replace takes this path: benchmarks/README.md, "Lean serving: one statement for the exact path").
SCOPE_RECALL_ROWS = sql.SQL(
    """WITH q(lexemes, hashes) AS MATERIALIZED ({query_terms}), s AS MATERIALIZED (
    {governing_rows}
)
SELECT s.document_id, t.document_id AS chunk_id, s.expires_at,
       coalesce(1 - (t.embedding <=> %(embedding)s::vector), 'NaN') AS cos, t.dl::float8 AS dl, t.terms,
       s.scored, s.seq,
       CASE WHEN row_number() OVER w = 1 THEN q.lexemes END, CASE WHEN row_number() OVER w = 1 THEN q.hashes END
FROM q, s
    LEFT JOIN LATERAL (
        SELECT t.document_id, t.embedding, t.dl, t.terms FROM {schema}.osa_fact_terms t
        WHERE t.document_id = s.document_id AND t.org_id = %(org_id)s AND t.content_hash = s.content_hash
          AND t.language = %(language)s::text
          AND t.terms IS NOT NULL
        OFFSET 0  -- as in SCOPE_ROWS
    ) t ON true
WINDOW w AS (ORDER BY s.seq, s.created_at, s.document_id)
ORDER BY s.seq, s.created_at, s.document_id"""
)
#: Columns of a `SCOPE_RECALL_ROWS` row that are `SCOPE_ROWS`' (the query's lexemes and hashes follow).
SCOPE_ROW_COLUMNS = 8

# Text, metadata and timestamps of the facts to return, with the scope checked again (fail closed: a
# fact retired between the two statements is not returned).
# Each fact's governing row and chunk are probed by primary key (fenced, see
# `scope_cache.GOVERNING_ROW_BY_ID`): joined freely, stale statistics could make the planner read the
# scope through its index once per fact.
SCOPE_FACTS = sql.SQL(
    """SELECT g.id, c.content, g.metadata, g.created_at, g.updated_at
    FROM unnest(%(document_ids)s::text[], %(chunk_ids)s::text[]) AS r(document_id, chunk_id),
        LATERAL {governing_row} g,
        LATERAL (SELECT c.content, c.meta FROM {schema}.{chunk} c WHERE c.id = r.chunk_id OFFSET 0) c
    WHERE c.meta->>'document_id' = g.id
      AND g.audience = ANY(%(audiences)s)
      AND g.status = ANY(%(statuses)s)
      AND g.metadata->>'assignment_id' = %(assignment_id)s
      AND {valid_at}"""
)


#: What a recall returns of a fact besides its ranks (`SCOPE_FACTS`' columns after the id): content, metadata,
#: created_at, updated_at.
Detail = tuple[str, dict[str, Any], datetime, datetime]


class ScopeHit(NamedTuple):
    """One fact of a scope that made a top-k list, before its text is fetched (ranks ``None`` when
    that side missed it; ``position`` is its place in storing order, from 1). ``detail``: its text, metadata
    and timestamps when they were read with the scope's rows at this recall's print (`scope_memo`), so
    there is nothing to fetch. A named tuple, like `RankedFact`: cheap to build by the hundred."""

    document_id: str
    chunk_id: str
    expires_at: str | None
    lex_rank: int | None
    lex_score: float | None
    vec_rank: int | None
    vec_score: float | None
    fused: float
    position: int
    detail: Detail | None = None


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


def exact_hits(
    rows: Sequence[Any], query_terms: Sequence[int], ranking: RankingParams, boost_terms: Sequence[int] = ()
) -> list[ScopeHit]:
    """The facts of ``rows`` (`SCOPE_ROWS`' rows: a whole scope, in storing order) within a top-k list of
    `rank_scope`; a fact only lending context is left out where a scored one stands in its place
    (`context_kept`)."""
    if not rows:
        return []
    rows = context_kept(rows, seq_at=7, scored_at=6)
    document_ids, chunk_ids, expires, cos, dl, terms, scored, _ = zip(*rows, strict=True)
    ranked = rank_scope(
        cos, dl, terms, query_terms, ranking, scored=None if all(scored) else scored, boost_terms=boost_terms
    )
    return [
        ScopeHit(document_ids[i], chunk_ids[i], expires[i], lr, ls, vr, vs, fused, i + 1)
        for i, lr, ls, vr, vs, fused in ranked
    ]


def plain_copy(value: Any) -> Any:
    """A deep copy of a JSON value (dicts and lists copied, the rest immutable): metadata kept in memory is
    handed out as a copy, so that no caller's change reaches the next recall."""
    kind = type(value)
    if kind is dict:
        return {k: plain_copy(v) if type(v) in _CONTAINERS else v for k, v in value.items()}
    if kind is list:
        return [plain_copy(v) if type(v) in _CONTAINERS else v for v in value]
    return value


_CONTAINERS = frozenset({dict, list})


def kept_details(hits: Sequence[ScopeHit]) -> dict[str, Sequence[Any]] | None:
    """``hits``' details by id (`with_text`'s), metadata copied, when every hit carries its own; else None."""
    details: dict[str, Sequence[Any]] = {}
    for h in hits:
        if h.detail is None:
            return None
        content, metadata, created_at, updated_at = h.detail
        details[h.document_id] = (content, plain_copy(metadata), created_at, updated_at)
    return details


def with_text(hits: Sequence[ScopeHit], details: dict[str, Sequence[Any]]) -> list[Candidate]:
    """``hits`` with their text, metadata and timestamps (``details``: `SCOPE_FACTS`' columns after the id,
    by id), in the same order; a hit without details (it left the scope) is dropped."""
    found = []
    for h in hits:
        detail = details.get(h.document_id)
        if detail is not None:
            content, metadata, created_at, updated_at = detail
            found.append(
                Candidate(
                    h.document_id,
                    content,
                    metadata,
                    created_at,
                    updated_at,
                    h.lex_rank,
                    h.lex_score,
                    h.vec_rank,
                    h.vec_score,
                    h.fused,
                    h.position,
                )
            )
    return found
