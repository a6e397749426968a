"""Governed facts: `FactRepository`, all SQL on governing rows and chunks, and the ACL lookups.

The scope is applied inside the SQL: the scoped statement reads the caller's governing rows joined
with their chunks (``s`` CTE, ``MATERIALIZED`` so the planner cannot turn it into a filtered HNSW
scan), and both rankings (lexical BM25 and exact vector distance, `haystack_osa_memory.store.ranking`)
run over those rows only. A huge knowledge base of closer matches therefore cannot crowd an
assignment's facts out of the top k.

The repository is made of its parts: writing (`haystack_osa_memory.store.fact_writing`), the scope of a
recall (`scope_query`), the exact path and the text of the facts returned (`candidates`), big scopes
(`big_scope`), the recall rows' lexemes and vectors (`recall_rows`), and sizes and planner statistics
(`sizing`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import DatabaseError
from haystack_osa_memory.store.big_scope import (
    BIG_SCOPE_DF,
    BIG_SCOPE_LEXICAL,
    BIG_SCOPE_NEIGHBOURS,
    BIG_SCOPE_ROWS,
    BIG_SCOPE_SETTINGS,
    BIG_SCOPE_VECTOR,
    COMMON_LEXEMES,
    COMMON_LEXEMES_TTL_S,
    EXACT_SCOPE_MAX,
    LEXEME_COUNT_CAP,
    LEXICAL_CANDIDATES,
    LEXICAL_POSTINGS_MAX,
    NEIGHBOUR_SLACK,
    RARE_LEXEME_MAX_DF,
    SCOPE_STATS,
    SCOPE_STATS_TTL_S,
    STATISTICS_TRUSTED_DF,
    VECTOR_CANDIDATES,
    BigScopes,
    ScopeSize,
    postings_prefix,
)
from haystack_osa_memory.store.candidates import (
    SCOPE_FACTS,
    SCOPE_RECALL_ROWS,
    SCOPE_ROW_COLUMNS,
    SCOPE_ROWS,
    Candidate,
    Detail,
    ScopeHit,
    exact_hits,
    kept_details,
    scope_governing_rows,
    with_text,
)
from haystack_osa_memory.store.database import read, rendered
from haystack_osa_memory.store.fact_writing import (
    DETACH_SUCCESSOR,
    INHERIT_TERMS,
    INSERT_AUDIT,
    SUPERSEDE,
    SUPERSEDE_REFUSALS,
    UPSERT_GOVERNING_ROW,
    WRITE_FACT,
    FactWriting,
    WrittenRow,
)
from haystack_osa_memory.store.parameters import text_array, vector_parameter
from haystack_osa_memory.store.ranking import RankingParams
from haystack_osa_memory.store.recall_rows import (
    LEXEME_HASH,
    LEXEME_STATS,
    QUERY_TERMS,
    TERM_KEY,
    TERM_KEYS,
    QueryTerms,
    Vector,
    lexeme_stats,
    term_key,
    term_keys_of,
    vector_literal,
    with_boost,
)
from haystack_osa_memory.store.scope_cache import Check, HeldScope, ScopeCache, governing_row_by_id
from haystack_osa_memory.store.scope_cache import Statements as CacheStatements
from haystack_osa_memory.store.scope_memo import MEMO_MAX_FACTS, PRINT_COLUMNS, Kept, Print, ScopeMemo, written_validity
from haystack_osa_memory.store.scope_memo import Statements as MemoStatements
from haystack_osa_memory.store.scope_query import (
    CONTEXT_STATUSES,
    FACT_AUDIENCE,
    FACT_SOURCE,
    VALID_AT,
    VALID_FROM,
    ScopeQuery,
    ValidAt,
)
from haystack_osa_memory.store.sizing import (
    ANALYZE_FACT_TABLES,
    COUNT_FACTS,
    RECALL_ROWS_SIZE,
    STALE_STATISTICS_CHECK_S,
    WRITES_SINCE_ANALYZE,
    BufferFit,
    buffer_fit,
    count_facts,
    statistics_stale,
)

# Its own names, and the names other modules, tests and notebooks import from here (they lived here before the
# split). A constant is read where it is defined: set it on that module (`big_scope.RARE_LEXEME_MAX_DF`).
__all__ = [
    "ANALYZE_FACT_TABLES",
    "BIG_SCOPE_DF",
    "BIG_SCOPE_LEXICAL",
    "BIG_SCOPE_NEIGHBOURS",
    "BIG_SCOPE_ROWS",
    "BIG_SCOPE_SETTINGS",
    "BIG_SCOPE_VECTOR",
    "COMMON_LEXEMES",
    "COMMON_LEXEMES_TTL_S",
    "CONTEXT_STATUSES",
    "COSINES_TO",
    "COUNT_FACTS",
    "DETACH_SUCCESSOR",
    "EXACT_SCOPE_MAX",
    "FACT_AUDIENCE",
    "FACT_SOURCE",
    "GOVERNING_ROWS",
    "HELD_TERMS_CHECK",
    "INHERIT_TERMS",
    "INSERT_AUDIT",
    "LEXEME_COUNT_CAP",
    "LEXEME_HASH",
    "LEXEME_STATS",
    "LEXICAL_CANDIDATES",
    "LEXICAL_POSTINGS_MAX",
    "NEIGHBOUR_SLACK",
    "QUERY_TERMS",
    "RARE_LEXEME_MAX_DF",
    "RECALL_ROWS_SIZE",
    "SCOPE_FACTS",
    "SCOPE_RECALL_ROWS",
    "SCOPE_ROWS",
    "SCOPE_STATS",
    "SCOPE_STATS_TTL_S",
    "STALE_STATISTICS_CHECK_S",
    "STATISTICS_TRUSTED_DF",
    "SUPERSEDE",
    "SUPERSEDE_REFUSALS",
    "TERM_KEY",
    "TERM_KEYS",
    "UPSERT_GOVERNING_ROW",
    "VALID_AT",
    "VALID_FROM",
    "VECTOR_CANDIDATES",
    "WRITES_SINCE_ANALYZE",
    "WRITE_FACT",
    "BufferFit",
    "Candidate",
    "FactRepository",
    "GoverningRow",
    "QueryTerms",
    "ScopeHit",
    "ScopeQuery",
    "ScopeSize",
    "ValidAt",
    "Vector",
    "buffer_fit",
    "count_facts",
    "lexeme_stats",
    "postings_prefix",
    "term_key",
    "term_keys_of",
    "vector_literal",
]

logger = logging.getLogger(__name__)

# The query's terms (`QUERY_TERMS`), with a held scope's check (`scope_cache.SCOPE_CHECK`) in the same round trip.
HELD_TERMS_CHECK = sql.SQL("SELECT * FROM ({query_terms}) q(lexemes, hashes), ({check}) c")


# Cosine similarity of one fact to others, from their recall rows (the vector written with each fact):
# `kb_memory_store` asks it of the facts it may replace (`Memory`'s `possibly_supersedes`).
COSINES_TO = sql.SQL(
    """SELECT b.document_id, 1 - (a.embedding <=> b.embedding)
    FROM {schema}.osa_fact_terms a
        JOIN {schema}.osa_fact_terms b ON b.org_id = a.org_id AND b.document_id = ANY(%(ids)s)
    WHERE a.document_id = %(document_id)s AND a.org_id = %(org_id)s
      AND a.embedding IS NOT NULL AND b.embedding IS NOT NULL"""
)

# Each id probed by primary key (a fenced LATERAL). Written as ``id = ANY(%s) AND org_id = %s``, PostgreSQL 18
# scanned the whole org's range of the scope index (`ddl.CREATE_SCOPE_CREATED_INDEX`, whose last column is the
# id) instead: 2.8 ms against 0.3 ms for 8 ids in an org of 12,800 facts, growing with the org (docs/traps.md).
GOVERNING_ROWS = sql.SQL(
    """SELECT g.id, g.org_id, g.audience, g.status, g.assignment_id
    FROM unnest(%s::text[]) AS i(id),
        LATERAL (SELECT d.id, d.org_id, d.audience, d.status, d.metadata->>'assignment_id' AS assignment_id
                 FROM {schema}.{gov} d WHERE d.id = i.id AND d.org_id = %s OFFSET 0) g"""
)


def _held_hits(
    held: HeldScope,
    embedding: Vector | None,
    query_terms: list[int],
    ranking: RankingParams,
    boost_terms: list[int],
    details: dict[str, Detail] | None = None,
) -> list[ScopeHit]:
    """The hits of a scope ranked from memory (a big scope held, or a small one kept), as `exact_hits` returns;
    with their ``details`` (a kept scope's text, read at the print this recall matched)."""
    ids, until = held.document_ids, held.expires
    return [
        ScopeHit(ids[i], ids[i], until[i], lr, ls, vr, vs, fused, i + 1, None if details is None else details[ids[i]])
        for i, lr, ls, vr, vs, fused in held.rank(embedding, query_terms, ranking, boost_terms)
    ]


@dataclass(frozen=True)
class GoverningRow:
    """The access-relevant columns of one governing row."""

    document_id: str
    org_id: str
    audience: str
    status: str
    assignment_id: str | None


class FactRepository(FactWriting, BigScopes):
    """All SQL on governing rows and chunks, for one configuration: writing (`FactWriting`), and a scope's
    candidates read whole (`candidates`), from its indexes past `EXACT_SCOPE_MAX` facts (`BigScopes`), or
    from the copy held in memory (`scope_cache` past `EXACT_SCOPE_MAX`, `scope_memo` within it).

    Usage:
    ```python
    repo = FactRepository(conn_str, MemoryConfig())
    repo.write([(governing_row, chunk)])
    candidates = repo.scoped_candidates(
        org_id="acme", assignment_id="a1", query="vpn", embedding=None, ranking=RankingParams(k=50)
    )
    ```
    """

    def __init__(self, conn_str: str, config: MemoryConfig) -> None:
        self.conn_str = conn_str
        self.config = config
        names = config.sql_names()
        self._init_writing(names)
        self._init_big_scopes(names)
        self._scope_rows_composed = SCOPE_ROWS.format(
            **names,
            governing_rows=scope_governing_rows(names, VALID_AT),
            lexeme_stats=lexeme_stats(sql.SQL("v.tsv"), sql.SQL("u.lexeme = ANY (%(lexemes)s::text[])")),
        )
        # The statements a recall runs, rendered once (`database.rendered`).
        self._scope_rows = rendered(self._scope_rows_composed)
        self._scope_recall_rows = rendered(
            SCOPE_RECALL_ROWS.format(
                **names, query_terms=QUERY_TERMS, governing_rows=scope_governing_rows(names, VALID_AT)
            )
        )
        self._scope_facts = rendered(
            SCOPE_FACTS.format(
                **names, valid_at=VALID_AT, governing_row=governing_row_by_id(names, sql.SQL("r.document_id"))
            )
        )
        #: Scopes with more recall rows than this take the big-scope path (candidates from indexes).
        self.exact_scope_max = EXACT_SCOPE_MAX
        #: Scopes past `exact_scope_max` and within the cache are ranked exactly from memory (`scope_cache`).
        self.scope_cache = (
            ScopeCache(config.scope_cache_facts, config.embedding_dimension) if config.scope_cache_facts else None
        )
        self._cache_statements = CacheStatements.compose(names, VALID_AT)
        self._held_terms_check = rendered(
            HELD_TERMS_CHECK.format(query_terms=QUERY_TERMS, check=self._cache_statements.check)
        )
        #: Scopes within `exact_scope_max` whose rows are kept while their print is unchanged (`scope_memo`).
        memo_facts = min(MEMO_MAX_FACTS, config.scope_cache_facts)
        self.scope_memo = ScopeMemo(memo_facts, config.embedding_dimension) if memo_facts else None
        memo = MemoStatements.compose(names, QUERY_TERMS)
        self._memo_print, self._memo_rows = rendered(memo.print), rendered(memo.rows)
        self._memo_since = rendered(memo.since)
        self._statistics_checked = -math.inf
        self._governing_rows = rendered(GOVERNING_ROWS.format(**names))
        self._cosines_to = rendered(COSINES_TO.format(**names))

    def scoped_candidates(
        self,
        *,
        org_id: str,
        assignment_id: str,
        query: str,
        embedding: Vector | None,
        ranking: RankingParams,
        audiences: Sequence[str] = (FACT_AUDIENCE,),
        statuses: Sequence[str] | None = None,
        valid_at: ValidAt = "now",
        history: bool = False,
    ) -> list[Candidate]:
        """The top ``ranking.k`` of each ranking (lexical, vector, fused) over the scope's own rows (never a
        post-filter), with their text: `scope_hits` followed by `candidates`."""
        scope = ScopeQuery.of(org_id, assignment_id, audiences, statuses, valid_at, history)
        with self.reading() as conn:
            hits = self.scope_hits(scope, query=query, embedding=embedding, ranking=ranking, conn=conn)
            return self.candidates(hits, scope, conn=conn)

    def scope_hits(
        self,
        scope: ScopeQuery,
        *,
        query: str,
        embedding: Vector | None,
        ranking: RankingParams,
        conn: psycopg.Connection[Any] | None = None,
        boost: QueryTerms | None = None,
    ) -> list[ScopeHit]:
        """The facts of ``scope`` within the top ``ranking.k`` of the lexical, vector or fused ranking, in
        storing order, without their text (the scope's rows, read in one statement or kept in memory while
        their print is unchanged (`scope_memo`), ranked by `haystack_osa_memory.store.ranking.rank_scope`).
        ``conn``: a connection from `reading()`.
        ``boost``: lexemes whose holders gain ``ranking.time_boost`` (`query_terms` of some words)."""
        if embedding is not None and len(embedding) != self.config.embedding_dimension:
            msg = (
                f"query embedding has {len(embedding)} dimensions but the chunk table stores "
                f"{self.config.embedding_dimension}"
            )
            raise DatabaseError(msg)
        params = {
            **scope.params(self.config.admitted_statuses),
            "language": self.config.language,
            "embedding": vector_parameter(embedding),
        }
        with self._reading(conn) as c, c.cursor(binary=True) as cur:
            size = self.scope_size(scope.org_id, scope.assignment_id, conn=c)
            if size.facts > self.exact_scope_max:
                self._refresh_stale_statistics(c)
            # A recall of the usual kind: held in memory when big, kept when small.
            usual = scope.held_kind(self.config.admitted_statuses)
            cache = self.scope_cache
            held_here = (
                usual and size.facts > self.exact_scope_max and cache is not None and size.facts <= cache.max_facts
            )
            memo = self.scope_memo
            key = (scope.org_id, scope.assignment_id)
            route = memo.route(key) if usual and memo is not None and size.facts <= self.exact_scope_max else "exact"
            seen = Check(0, 0, 0)
            printed: Print | None = None
            at = 0.0  # the time the facts must hold at, read with the print
            if held_here:
                # The query's lexemes and the held scope's check in one round trip.
                row = cur.execute(self._held_terms_check, {**params, "query": query}).fetchone()
                assert row is not None  # an aggregate over a one-row join: always one row
                lexemes, query_terms = list(row[0]), list(row[1])
                seen = Check(int(row[2]), int(row[3]), int(row[4]))
            elif route == "print":
                # The query's lexemes and the kept scope's print in one round trip.
                row = cur.execute(self._memo_print, {**params, "query": query}).fetchone()
                assert row is not None  # as above
                lexemes, query_terms = list(row[0]), list(row[1])
                printed, at = Print.of(*row[2 : 2 + PRINT_COLUMNS]), float(row[2 + PRINT_COLUMNS])
            elif (
                route == "exact"
                and size.facts <= self.exact_scope_max
                and not (memo is not None and memo.unusable(key))
            ):
                return self._exact_hits(cur, params, query, ranking, boost)
            else:
                lexemes, query_terms = self.query_terms(query, conn=c)
            lexemes, boost_terms = with_boost(lexemes, boost, ranking.time_boost)
            params["lexemes"] = text_array(lexemes)
            if size.facts > self.exact_scope_max:
                if held_here and cache is not None:
                    with cache.use(cur, self._cache_statements, params, seen) as held:
                        if held is not None:
                            return _held_hits(held, embedding, query_terms, ranking, boost_terms)
                return self._big_scope_hits(
                    cur, params, query_terms, size, ranking, embedding is not None, boost_terms=boost_terms
                )
            if route != "exact" and memo is not None:
                kept = memo.current(key, printed, at) if printed is not None else route
                if kept == "since" and printed is not None:  # changed: the facts stored since, if that is all
                    kept = memo.caught_up(cur, self._memo_since, params, printed, at)
                if kept == "exact":  # changed otherwise
                    return self._exact_hits(cur, params, query, ranking, boost)
                if kept == "rows":
                    kept = memo.read(cur, self._memo_rows, params)
                if isinstance(kept, Kept) and kept.scope is not None:
                    return _held_hits(kept.scope, embedding, query_terms, ranking, boost_terms, kept.details)
            rows = cur.execute(self._scope_rows, params).fetchall()
        return exact_hits(rows, query_terms, ranking, boost_terms)

    def _exact_hits(
        self,
        cur: psycopg.Cursor[Any],
        params: dict[str, Any],
        query: str,
        ranking: RankingParams,
        boost: QueryTerms | None,
    ) -> list[ScopeHit]:
        """The exact path: the scope's rows with the query's terms (`SCOPE_RECALL_ROWS`), read again with the
        chunk fallback (`SCOPE_ROWS`) when a fact lacks a usable recall row, ranked by `exact_hits`."""
        rows = cur.execute(self._scope_recall_rows, {**params, "query": query}).fetchall()
        if not rows:
            return []
        lexemes, query_terms = rows[0][SCOPE_ROW_COLUMNS:]
        lexemes, boost_terms = with_boost(lexemes, boost, ranking.time_boost)
        if any(r[1] is None for r in rows):
            # Written by other tools, or before schema 7: the whole scope again, that fact tokenised from its chunk.
            params["lexemes"] = text_array(lexemes)
            rows = cur.execute(self._scope_rows, params).fetchall()
        else:
            rows = [r[:SCOPE_ROW_COLUMNS] for r in rows]
        return exact_hits(rows, query_terms, ranking, boost_terms)

    def candidates(
        self, hits: Sequence[ScopeHit], scope: ScopeQuery, *, conn: psycopg.Connection[Any] | None = None
    ) -> list[Candidate]:
        """``hits`` with their text, metadata and timestamps, in the same order; ``scope`` is checked
        again, so a fact that left it since (retired, moved) is dropped. Hits of a kept scope carry their
        own, read with its rows and checked by this recall's print (`scope_memo`): nothing is read then.
        ``conn``: as in `scope_hits`."""
        if not hits:
            return []
        kept = kept_details(hits)
        if kept is not None:
            return with_text(hits, kept)
        params = {
            **scope.params(self.config.admitted_statuses),
            "document_ids": text_array([h.document_id for h in hits]),
            "chunk_ids": text_array([h.chunk_id for h in hits]),
        }
        with self._reading(conn) as c:
            details = {row[0]: row[1:] for row in c.execute(self._scope_facts, params).fetchall()}
        if len(details) < len(hits) and self.scope_cache is not None and scope.held_kind(self.config.admitted_statuses):
            # Left the scope by a change of its governing row alone (superseded, retired, no longer valid),
            # which the held scope's check cannot see: it is ranked without them from now on.
            self.scope_cache.drop_facts(
                (scope.org_id, scope.assignment_id), {h.document_id for h in hits} - set(details)
            )
        return with_text(hits, details)

    def _written(self, params: dict[str, Any], chunk_meta: dict[str, Any], row: WrittenRow) -> None:
        """A new fact that recall would rank (admitted, the facts' audience, its recall row's lexemes packed and
        its chunk its own, its validity read as the database reads it: `written_validity`) joins its scope's rows
        kept in memory (`ScopeMemo.written`), so that the store's search for the facts it may replace, and
        recalls after it, are answered from them while their print matches."""
        memo = self.scope_memo
        expires_at = row.metadata.get("expires_at")
        validity = written_validity(row.metadata, row.created_at)
        if (
            memo is None
            or validity is None
            or not params.get("assignment_id")
            or row.status not in self.config.admitted_statuses
            or params.get("audience") != FACT_AUDIENCE
            or row.terms is None
            or params["chunk_id"] != row.id
            or chunk_meta.get("document_id") != row.id
            or not (expires_at is None or isinstance(expires_at, str))  # as `->>` reads it
        ):
            return
        memo.written(
            (str(params["org_id"]), str(params["assignment_id"])),
            Print.of_new_fact(row.version),
            (row.id, expires_at, row.seq, row.vector, row.dl, row.terms, True),
            (str(params["content"]), row.metadata, row.created_at, row.updated_at),
            validity,
        )

    def cosines_to(self, document_id: str, others: Sequence[str], org_id: str) -> dict[str, float]:
        """The cosine similarity of a fact to each of ``others`` (`COSINES_TO`); facts without vectors are absent."""
        if not others:
            return {}
        params = {"document_id": document_id, "ids": text_array(others), "org_id": org_id}
        with self.reading() as conn:
            return {r[0]: float(r[1]) for r in conn.execute(self._cosines_to, params).fetchall()}

    def query_terms(self, query: str, *, conn: psycopg.Connection[Any] | None = None) -> QueryTerms:
        """The query's distinct lexemes and their hashes (`QUERY_TERMS`): `SCOPE_ROWS` takes the lexemes
        (``lexemes`` parameter), `rank_scope` the hashes."""
        with self._reading(conn) as c:
            row = c.execute(QUERY_TERMS, {"language": self.config.language, "query": query}).fetchone()
        return QueryTerms(list(row[0]), list(row[1])) if row else QueryTerms([], [])

    @property
    def scope_rows_statement(self) -> sql.Composed:
        """`SCOPE_ROWS` for this configuration (for EXPLAIN, or to run it on a connection of your own)."""
        return self._scope_rows_composed

    def analyze(self, conn: psycopg.Connection[Any] | None = None) -> bool:
        """Refresh the planner's statistics of the governing, chunk and recall-row tables (`ANALYZE_FACT_TABLES`);
        call it after writing many facts at once. ``conn``: a connection from `reading()` (default: one of its
        own). False (with a warning logged) when the database refused."""
        statement = ANALYZE_FACT_TABLES.format(**self.config.sql_names())
        try:
            with self._reading(conn) as c:
                c.execute(statement)
        except (DatabaseError, psycopg.Error) as e:
            logger.warning("the planner's statistics were not refreshed after a bulk load: %s", type(e).__name__)
            return False
        with self._sizes_lock:  # the scopes' sizes changed too
            self._sizes.clear()
        return True

    def _refresh_stale_statistics(self, conn: psycopg.Connection[Any]) -> None:
        """`analyze` when more recall rows were written since the last ANALYZE than the table then had
        (`statistics_stale`), looked at most every `STALE_STATISTICS_CHECK_S` seconds per process."""
        now = time.monotonic()
        with self._sizes_lock:
            if now - self._statistics_checked < STALE_STATISTICS_CHECK_S:
                return
            self._statistics_checked = now
        if statistics_stale(conn, self.config, self.exact_scope_max):
            self.analyze(conn)

    def reading(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """One pooled connection for several reads (`scope_hits` then `candidates`: one checkout)."""
        return read(self.conn_str, self.config)

    def _reading(self, conn: psycopg.Connection[Any] | None) -> AbstractContextManager[psycopg.Connection[Any]]:
        return nullcontext(conn) if conn is not None else self.reading()

    def governing_rows(self, document_ids: Sequence[str], org_id: str) -> dict[str, GoverningRow]:
        """Governing rows of ``org_id`` by id (ids with no row there are absent). The org is a condition
        of the statement, so a knowledge base distributed by org reads one shard (docs/scaling.md)."""
        if not document_ids:
            return {}
        with read(self.conn_str, self.config) as conn:
            rows = conn.execute(self._governing_rows, (text_array(document_ids), org_id)).fetchall()
        return {r[0]: GoverningRow(*r) for r in rows}
