"""Recall in a big scope: past `EXACT_SCOPE_MAX` facts, candidates come from indexes that carry the scope
and are ranked exactly with their neighbours (`BigScopes`, mixed into
`haystack_osa_memory.store.facts.FactRepository`), BM25 weighed by the whole scope's statistics.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from cachetools import TTLCache
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.store.candidates import ScopeHit
from haystack_osa_memory.store.database import rendered
from haystack_osa_memory.store.ranking import RankingParams, ScopeStats, rank_scope
from haystack_osa_memory.store.recall_rows import term_key
from haystack_osa_memory.store.scope_cache import governing_row_by_id
from haystack_osa_memory.store.scope_query import VALID_AT

# Reading every fact of a scope costs time in proportion to its size (benchmarks/README.md, "Big
# assignments"). Past `EXACT_SCOPE_MAX` facts, recall takes its candidates from indexes of osa_fact_terms that
# carry the scope (schema 10) and ranks them exactly, each with its neighbours in storing order:
#   1. SCOPE_STATS: the scope's size and mean length (cached for `SCOPE_STATS_TTL_S` per process);
#   2. BIG_SCOPE_DF: how many facts hold each query lexeme (GIN on scope-salted keys; cached like 1.);
#   3. BIG_SCOPE_LEXICAL and BIG_SCOPE_VECTOR, the candidates: the facts holding any of the query's rarer
#      lexemes (df within the cap) and the nearest vectors (HNSW with pgvector's iterative scan, the scope
#      in its WHERE);
#   4. BIG_SCOPE_ROWS: those candidates and their neighbours, with what ranking reads.
# The scope is a condition of every statement (never a post-filter); a fact without a recall row
# (written by other tools) is not a candidate there.
EXACT_SCOPE_MAX = 5000
SCOPE_STATS_TTL_S = 30.0
#: Scopes whose size, and (scope, lexeme) pairs whose count, one process remembers: a long-lived server sees
#: many scopes, and past these the least recently used are forgotten (read again when next needed).
SCOPE_SIZES_MAX = 10_000
LEXEME_COUNTS_MAX = 100_000
#: A lexeme held by more facts than this is "common": it still counts in ranking the candidates, but
#: does not bring candidates of its own (its idf is low, and its facts would be thousands).
RARE_LEXEME_MAX_DF = 400
#: The rare lexemes bring candidates rarest first, until the facts holding them pass this many (the rarest
#: always does): `BIG_SCOPE_LEXICAL` reads every holder of the lexemes it is given to rank them, and in a
#: scope of a few thousand facts a query's "rare" lexemes (held by up to `RARE_LEXEME_MAX_DF` facts each)
#: can have thousands of holders (measured in benchmarks/README.md, "Where the threshold sits").
LEXICAL_POSTINGS_MAX = 500
#: Rows read each way from a candidate beyond the 2w neighbours it needs: facts flagged, retired or changed
#: among them are skipped; past this many such facts near a candidate, the farthest neighbour is missed
#: (it only lends context to the candidate's outermost scored neighbour). One, not two: fewer rows read,
#: the same top 8 where no fact near a candidate had changed (benchmarks/README.md, "One row of slack").
NEIGHBOUR_SLACK = 1
#: Nearest vectors taken as candidates (and the HNSW search width), and facts taken for their lexemes.
VECTOR_CANDIDATES = 60
LEXICAL_CANDIDATES = 100
SCOPE_STATS = sql.SQL(
    """SELECT count(*), coalesce(avg(t.dl), 0)::float8 FROM {schema}.osa_fact_terms t
    WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s"""
)
# Counted up to `LEXEME_COUNT_CAP`: past it a lexeme's weight hardly changes, and counting a posting list
# of tens of thousands of facts costs milliseconds.
BIG_SCOPE_DF = sql.SQL(
    """SELECT (SELECT count(*) FROM (SELECT 1 FROM {schema}.osa_fact_terms t
             WHERE t.term_keys @> ARRAY[k.key] AND t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s
             LIMIT %(cap)s) x)
    FROM unnest(%(keys)s::int8[]) WITH ORDINALITY AS k(key, i) ORDER BY k.i"""
)
LEXEME_COUNT_CAP = 5000
# How many rows of osa_fact_terms hold each of the table's most common lexeme keys, estimated from
# PostgreSQL's own statistics (the share of rows holding it, times the table's rows; kept by ANALYZE and
# autovacuum). Keys are salted with their scope, so a key's rows are one scope's facts. A lexeme of a big
# scope held by more than `RARE_LEXEME_MAX_DF` facts is read here instead of counted: counting walks its
# posting list and fetches up to `LEXEME_COUNT_CAP` rows, tens of milliseconds. pg_stats hides the
# statistics of a table whose row-level security applies to the reader: then such lexemes are counted.
COMMON_LEXEMES = sql.SQL(
    """SELECT s.most_common_elems::text::int8[], s.most_common_elem_freqs, c.reltuples
    FROM pg_catalog.pg_stats s
        JOIN pg_catalog.pg_namespace n ON n.nspname = s.schemaname
        JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = s.tablename
    WHERE s.schemaname = %(schema)s AND s.tablename = 'osa_fact_terms' AND s.attname = 'term_keys'"""
)
COMMON_LEXEMES_TTL_S = 300.0
#: A lexeme the statistics say this many facts hold is taken from them without counting: far enough past
#: `RARE_LEXEME_MAX_DF` that an estimate's error cannot make a rare lexeme common.
STATISTICS_TRUSTED_DF = 2 * RARE_LEXEME_MAX_DF
# The facts holding the query's rarer lexemes, best first by the idf they hold (BM25 without term
# frequency and length), at most `LEXICAL_CANDIDATES`: ranking reads each candidate with its neighbours.
BIG_SCOPE_LEXICAL = sql.SQL(
    """SELECT t.seq FROM {schema}.osa_fact_terms t
    WHERE t.term_keys && %(keys)s::int8[] AND t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s
    ORDER BY (SELECT sum(w.idf) FROM unnest(%(keys)s::int8[], %(idfs)s::float8[]) AS w(key, idf)
              WHERE w.key = ANY(t.term_keys)) DESC, t.seq DESC
    LIMIT %(lexical_k)s"""
)
# The nearest vectors: from the HNSW index, which holds the rows written once their scope was past
# `fact_writing.VECTOR_INDEX_FROM` facts (and every row written before schema 12), and, ranked exactly, the
# scope's rows left out of it (at most that many, found through their own small index): the nearest of both.
BIG_SCOPE_VECTOR = sql.SQL(
    """SELECT v.seq FROM (
    (SELECT t.seq, t.embedding::vector({dimension}) <=> %(embedding)s::vector({dimension}) AS distance
     FROM {schema}.osa_fact_terms t
     WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s AND t.vector_indexed
     ORDER BY t.embedding::vector({dimension}) <=> %(embedding)s::vector({dimension})
     LIMIT %(vector_k)s)
    UNION ALL
    (SELECT t.seq, t.embedding::vector({dimension}) <=> %(embedding)s::vector({dimension}) AS distance
     FROM {schema}.osa_fact_terms t
     WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s AND NOT t.vector_indexed
       AND t.embedding IS NOT NULL
     ORDER BY 2
     LIMIT %(vector_k)s)
) v
ORDER BY v.distance
LIMIT %(vector_k)s"""
)
# Session settings for the vector side: without the iterative scan, an HNSW scan filtered by scope would
# return fewer rows than asked when the scope is a small part of the table.
BIG_SCOPE_SETTINGS = sql.SQL(
    "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', false), set_config('hnsw.ef_search', %s, false)"
)
# A candidate and its neighbours are read by walking the scope index from it, one index range per candidate
# and side that returns whole rows (the candidate itself is the first row of the backward walk). Reading
# each row again by (scope, seq) after an index-only walk cost an extra index descent per row. Joining the
# governing table inside the walk made the planner hash-join the whole scope once per candidate; it is
# probed per row instead, by primary key.
BIG_SCOPE_NEIGHBOURS = sql.SQL(
    """SELECT t.seq, t.document_id, t.content_hash, t.embedding, t.dl, t.terms FROM {schema}.osa_fact_terms t
            WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s AND t.seq {direction} c.seq
              AND t.language = %(language)s::text AND t.terms IS NOT NULL
            ORDER BY t.seq {order} LIMIT {limit}"""
)
# The rows of the walks that are admitted (fenced laterals: left to itself the planner hash-joined both
# whole tables of the scope, a cost growing with the scope instead of with the candidates). Overlapping
# walks read a row twice: it is returned once. Rows of `CONTEXT_STATUSES` come
# back marked unscored, as in SCOPE_ROWS.
BIG_SCOPE_ROWS = sql.SQL(
    """WITH c AS MATERIALIZED (SELECT DISTINCT s AS seq FROM unnest(%(seqs)s::int8[]) AS s),
w AS (
    SELECT b.* FROM c, LATERAL ({before}) b
    UNION ALL
    SELECT a.* FROM c, LATERAL ({after}) a
)
SELECT DISTINCT ON (w.seq) g.id, w.document_id, g.expires_at,
       coalesce(1 - (w.embedding <=> %(embedding)s::vector), 'NaN'), w.dl::float8, w.terms, w.seq, g.scored
FROM w,
    LATERAL (SELECT g.id, g.metadata->>'expires_at' AS expires_at, g.status = ANY(%(statuses)s) AS scored
             FROM {governing_row} g
             WHERE g.content_hash = w.content_hash AND g.audience = ANY(%(audiences)s)
               AND g.status = ANY(%(read_statuses)s) AND g.metadata->>'assignment_id' = %(assignment_id)s
               AND {valid_at}) g  -- by primary key (scope_cache.GOVERNING_ROW_BY_ID)
ORDER BY w.seq, g.scored DESC  -- an observation before the evidence whose place it takes (ranking.context_kept)"""
)


@dataclass(frozen=True)
class ScopeSize:
    """A scope's recall rows: how many, their mean length in lexemes, and when this was read."""

    facts: int
    mean_dl: float
    read_at: float


def postings_prefix(counts: Sequence[float], budget: float) -> int:
    """How many of ``counts`` (facts holding each lexeme, rarest first) bring candidates: the longest prefix
    whose sum stays within ``budget``, and at least the first (0 when there is none)."""
    total = 0.0
    for n, count in enumerate(counts):
        total += count
        if n and total > budget:
            return n
    return len(counts)


class BigScopes:
    """The big-scope path of `FactRepository.scope_hits`, with the scope sizes and lexeme counts it
    remembers per process (mixed into `FactRepository`)."""

    config: MemoryConfig

    def _init_big_scopes(self, names: dict[str, sql.Identifier]) -> None:
        """Compose the big-scope statements for these schema and table names (`MemoryConfig.sql_names`)."""
        self._scope_stats = rendered(SCOPE_STATS.format(**names))
        self._big_df = rendered(BIG_SCOPE_DF.format(**names))
        self._big_lexical = rendered(BIG_SCOPE_LEXICAL.format(**names))
        self._big_vector = rendered(
            BIG_SCOPE_VECTOR.format(dimension=sql.Literal(self.config.embedding_dimension), **names)
        )
        self._big_rows = rendered(
            BIG_SCOPE_ROWS.format(
                before=BIG_SCOPE_NEIGHBOURS.format(
                    direction=sql.SQL("<="), order=sql.SQL("DESC"), limit=sql.Placeholder("walk_before"), **names
                ),
                after=BIG_SCOPE_NEIGHBOURS.format(
                    direction=sql.SQL(">"), order=sql.SQL("ASC"), limit=sql.Placeholder("walk_after"), **names
                ),
                valid_at=VALID_AT,
                governing_row=governing_row_by_id(names, sql.SQL("w.document_id")),
                **names,
            )
        )
        # Both expire `SCOPE_STATS_TTL_S` after they were read; cachetools' caches are not thread-safe: every
        # use holds `_sizes_lock`.
        self._sizes: TTLCache[tuple[str, str], ScopeSize] = TTLCache(SCOPE_SIZES_MAX, SCOPE_STATS_TTL_S)
        self._counts: TTLCache[tuple[str, str, int, bool], float] = TTLCache(LEXEME_COUNTS_MAX, SCOPE_STATS_TTL_S)
        #: Read the common lexemes' counts from PostgreSQL's statistics (`COMMON_LEXEMES`) instead of counting.
        self.lexeme_estimates = True
        self._common: tuple[dict[int, float], float] = ({}, -math.inf)
        self._sizes_lock = threading.Lock()

    def scope_size(self, org_id: str, assignment_id: str, *, conn: psycopg.Connection[Any]) -> ScopeSize:
        """The scope's recall rows (count, mean length): read at most every `SCOPE_STATS_TTL_S` seconds
        per process (one index-only scan; the figures only choose the path and weigh BM25 there)."""
        key = (org_id, assignment_id)
        with self._sizes_lock:
            known = self._sizes.get(key)
        if known is not None:
            return known
        now = time.monotonic()
        row = conn.execute(self._scope_stats, {"org_id": org_id, "assignment_id": assignment_id}).fetchone()
        size = ScopeSize(int(row[0]), float(row[1]), now) if row else ScopeSize(0, 0.0, now)
        with self._sizes_lock:
            self._sizes[key] = size
        return size

    def _lexeme_counts(self, cur: psycopg.Cursor[Any], scope: dict[str, str], keys: list[int]) -> list[float]:
        """How many of the scope's facts hold each key, remembered for `SCOPE_STATS_TTL_S` seconds (queries
        repeat lexemes): from PostgreSQL's statistics (`COMMON_LEXEMES`) when they say at least
        `STATISTICS_TRUSTED_DF`; otherwise counted (BIG_SCOPE_DF) up to just past `RARE_LEXEME_MAX_DF`, and past
        it from the statistics, or, where they do not have it, counted up to `LEXEME_COUNT_CAP`."""
        now = time.monotonic()
        estimates = self.lexeme_estimates
        org, assignment = scope["org_id"], scope["assignment_id"]
        with self._sizes_lock:
            known = {k: self._counts.get((org, assignment, k, estimates)) for k in keys}
        counts = {k: v for k, v in known.items() if v is not None}
        missing = [k for k in keys if k not in counts]
        if missing:
            rows = self._common_lexemes(cur, now) if estimates else {}
            # Far past the rare bound by the statistics: not counted at all (even a count that stops early
            # reads the lexeme's whole posting list into a bitmap first).
            fresh = {k: rows[k] for k in missing if rows.get(k, 0.0) >= STATISTICS_TRUSTED_DF}
            to_count = [k for k in missing if k not in fresh]
            if to_count:
                cap = RARE_LEXEME_MAX_DF + 1 if estimates else LEXEME_COUNT_CAP
                cur.execute(self._big_df, {**scope, "keys": to_count, "cap": cap})
                found = {k: float(r[0]) for k, r in zip(to_count, cur.fetchall(), strict=True)}
                common = [k for k, c in found.items() if estimates and c > RARE_LEXEME_MAX_DF]
                found.update({k: max(rows[k], found[k]) for k in common if k in rows})
                counted = [k for k in common if k not in rows]
                if counted:
                    cur.execute(self._big_df, {**scope, "keys": counted, "cap": LEXEME_COUNT_CAP})
                    found.update({k: float(r[0]) for k, r in zip(counted, cur.fetchall(), strict=True)})
                fresh.update(found)
            counts.update(fresh)
            with self._sizes_lock:
                for k, c in fresh.items():
                    self._counts[(org, assignment, k, estimates)] = c
        return [counts[k] for k in keys]

    def _common_lexemes(self, cur: psycopg.Cursor[Any], now: float) -> dict[int, float]:
        """`COMMON_LEXEMES`: the estimated rows holding each of the table's most common keys, re-read every
        `COMMON_LEXEMES_TTL_S` seconds (empty where PostgreSQL has no statistics, or hides them)."""
        rows, read_at = self._common
        if now - read_at <= COMMON_LEXEMES_TTL_S:
            return rows
        row = cur.execute(COMMON_LEXEMES, {"schema": self.config.kb_schema}).fetchone()
        rows = {}
        if row is not None and row[0] is not None and row[1] is not None:
            total = max(float(row[2] or 0.0), 0.0)
            rows = {int(k): float(f) * total for k, f in zip(row[0], row[1], strict=False)}
        self._common = (rows, now)
        return rows

    def _big_scope_hits(
        self,
        cur: psycopg.Cursor[Any],
        params: dict[str, Any],
        query_terms: Sequence[int],
        size: ScopeSize,
        ranking: RankingParams,
        hybrid: bool,
        boost_terms: Sequence[int] = (),
    ) -> list[ScopeHit]:
        """The big-scope path (see BIG_SCOPE_ROWS): candidates from the scope's indexes, ranked exactly
        with their neighbours, BM25 weighed by the whole scope's statistics."""
        hashes = list(dict.fromkeys(query_terms))
        keys = [term_key(params["org_id"], params["assignment_id"], h) for h in hashes]
        scope = {"org_id": params["org_id"], "assignment_id": params["assignment_id"]}
        # An estimate from the statistics may exceed the scope's size (read at another time): never more facts
        # than the scope has, or BM25's idf would turn negative.
        df = [min(d, float(size.facts)) for d in self._lexeme_counts(cur, scope, keys)]
        held = sorted(((k, d) for k, d in zip(keys, df, strict=True) if d > 0), key=lambda kd: kd[1])
        rare = [(k, d) for k, d in held if d <= RARE_LEXEME_MAX_DF]
        if not rare and not hybrid:
            # Only common words and no vector side: the rarest of them bring candidates (bounded like the
            # rare ones), or the recall would find nothing in a scope where every fact may match.
            rare = held
        rare = rare[: postings_prefix([d for _, d in rare], LEXICAL_POSTINGS_MAX)]
        seqs: set[int] = set()
        if rare:
            lexical = {
                **scope,
                "keys": [k for k, _ in rare],
                "idfs": [math.log(1 + (size.facts - d + 0.5) / (d + 0.5)) for _, d in rare],
                "lexical_k": LEXICAL_CANDIDATES,
            }
            seqs.update(r[0] for r in cur.execute(self._big_lexical, lexical).fetchall())
        if hybrid:
            cur.execute(BIG_SCOPE_SETTINGS, (str(max(VECTOR_CANDIDATES, 40)),))
            vector = {**scope, "embedding": params["embedding"], "vector_k": VECTOR_CANDIDATES}
            seqs.update(r[0] for r in cur.execute(self._big_vector, vector).fetchall())
        if not seqs:
            return []
        reach = 2 * ranking.window
        rows = cur.execute(
            self._big_rows,
            {
                **params,
                "seqs": sorted(seqs),
                "walk_before": reach + NEIGHBOUR_SLACK + 1,
                "walk_after": reach + NEIGHBOUR_SLACK,
            },
        ).fetchall()
        if not rows:
            return []
        document_ids, chunk_ids, expires, cos, dl, terms, row_seqs, admitted = zip(*rows, strict=True)
        candidate = [q in seqs for q in row_seqs]
        # A candidate's neighbours may rank too (the context window lends them its terms and vector, as
        # in the exact path): with 2w neighbours read each way, every fact within w of a candidate has
        # its whole window here.
        at = np.flatnonzero(np.asarray(candidate, dtype=bool))
        scored = np.zeros(len(rows), dtype=bool)
        for offset in range(-ranking.window, ranking.window + 1):
            scored[np.clip(at + offset, 0, len(rows) - 1)] = True
        scored &= np.asarray(admitted, dtype=bool)  # facts only lending context (`CONTEXT_STATUSES`) never rank
        stats = ScopeStats(size.facts, size.mean_dl, df)
        ranked = rank_scope(
            cos, dl, terms, hashes, ranking, stats=stats, scored=scored.tolist(), boost_terms=boost_terms
        )
        return [
            ScopeHit(document_ids[i], chunk_ids[i], expires[i], lr, ls, vr, vs, fused, i + 1)
            for i, lr, ls, vr, vs, fused in ranked
        ]
