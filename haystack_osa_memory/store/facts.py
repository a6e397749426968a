"""Governed facts: atomic writes of governing row + chunk, scoped candidate search, ACL lookups.

The scope is applied inside the SQL: the scoped statement reads the caller's governing rows joined
with their chunks (``s`` CTE, ``MATERIALIZED`` so the planner cannot turn it into a filtered HNSW
scan), and both rankings (lexical BM25 and exact vector distance, `haystack_osa_memory.store.ranking`)
run over those rows only. A huge knowledge base of closer matches therefore cannot crowd an
assignment's facts out of the top k.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import compress
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import DatabaseError, SupersessionError
from haystack_osa_memory.store.database import fact_scope, read, transaction
from haystack_osa_memory.store.ranking import (
    TERM_BITS,
    TERM_CODE,
    RankingParams,
    ScopeStats,
    context_kept,
    rank_scope,
)
from haystack_osa_memory.store.scope_cache import Check, ScopeCache, governing_row_by_id
from haystack_osa_memory.store.scope_cache import Statements as CacheStatements
from haystack_osa_memory.tools import (
    APPROVED,
    CONSOLIDATED,
    HELD_STATUSES,
    REVIEWABLE_STATUSES,
    SUPERSEDABLE_STATUSES,
    SUPERSEDED,
)

logger = logging.getLogger(__name__)

FACT_SOURCE = "agent_fact"
FACT_AUDIENCE = "ai_internal"
#: Facts a recall reads though it never returns them: they lend their terms and vector to their neighbours'
#: context windows (`ranking.rank_scope`'s ``scored``). A fact reflect consolidated into an observation still
#: sits between the turns it was stored with; without it they would lose the context it gave them.
CONTEXT_STATUSES: tuple[str, ...] = (CONSOLIDATED,)

# Upsert by deterministic id. Only a person's review moves a fact out of a held status
# (`tools.HELD_STATUSES`: proposed, flagged, rejected) into recall, so storing the same text keeps the
# status a review or feedback gave it, and so does its valid_from unless the store names one. A retired
# (forgotten) fact stored again starts afresh, except that one forgotten while held comes back `proposed`
# (its tombstone keeps the former status). A superseded one stored again holds again (from the new
# valid_from, its successor link dropped), in the status it was superseded from when that was held; that
# write alone returns the former successor (``held_again_after``, dropped again by the next store of the
# same text), which `FactRepository.write` then detaches. The WHERE refuses to touch a row of another scope.
UPSERT_GOVERNING_ROW = sql.SQL(
    """INSERT INTO {schema}.{gov}
    (id, org_id, specialist_id, dataset, source, audience, status, content_hash, title, metadata)
    VALUES (%(id)s, %(org_id)s, %(specialist_id)s, %(dataset)s, %(source)s, %(audience)s, %(status)s,
            %(content_hash)s, %(title)s, %(metadata)s)
    ON CONFLICT (id) DO UPDATE SET
        specialist_id = EXCLUDED.specialist_id,
        title = coalesce(EXCLUDED.title, {schema}.{gov}.title),
        status = CASE
            WHEN {schema}.{gov}.status = 'retired'
                 AND {schema}.{gov}.metadata->'retired'->>'previous_status' = ANY(%(held)s::text[])
                 AND NOT EXCLUDED.status = ANY(%(held)s::text[]) THEN 'proposed'
            WHEN {schema}.{gov}.status = 'retired' THEN EXCLUDED.status
            WHEN {schema}.{gov}.status = 'superseded'
                 AND {schema}.{gov}.metadata->>'superseded_from' = ANY(%(held)s::text[])
            THEN {schema}.{gov}.metadata->>'superseded_from'
            WHEN {schema}.{gov}.status = 'superseded' THEN EXCLUDED.status
            ELSE {schema}.{gov}.status END,
        metadata = CASE WHEN {schema}.{gov}.status = 'retired' THEN EXCLUDED.metadata
                        WHEN {schema}.{gov}.status = 'superseded'
                        THEN ({schema}.{gov}.metadata - 'valid_from' - 'valid_to' - 'superseded_by' - 'superseded_from')
                             || EXCLUDED.metadata
                             || jsonb_build_object('held_again_after', {schema}.{gov}.metadata->'superseded_by')
                        ELSE ({schema}.{gov}.metadata - 'held_again_after')
                             || (EXCLUDED.metadata
                                 - CASE WHEN %(valid_from_given)s::boolean THEN '' ELSE 'valid_from' END)
                   END,
        created_at = CASE WHEN {schema}.{gov}.status = 'retired' THEN now() ELSE {schema}.{gov}.created_at END,
        updated_at = now()
    WHERE {schema}.{gov}.org_id = EXCLUDED.org_id
      AND {schema}.{gov}.source = EXCLUDED.source
      AND {schema}.{gov}.content_hash = EXCLUDED.content_hash
      AND {schema}.{gov}.metadata->>'assignment_id' = EXCLUDED.metadata->>'assignment_id'
    RETURNING id, status, seq, metadata->>'held_again_after' AS held_again_after"""
)
INSERT_AUDIT = sql.SQL(
    """INSERT INTO {mem}.audit (actor, action, org_id, assignment_id, document_id, details)
    VALUES (%(actor)s, %(action)s, %(org_id)s, %(assignment_id)s, %(document_id)s, %(details)s)"""
)
# A fact's lexemes for ranking (`haystack_osa_memory.store.ranking.TERM_CODE`): one bytea of big-endian
# int8s, ``hash * TERM_CODE + count`` per distinct lexeme of the tsvector ``{tsv}``, where ``hash`` is
# the first 48 bits of the md5 of the lexeme's UTF-8 bytes (whatever the database encoding) and
# ``count`` its positions (at most 256; a lexeme without positions counts 1). Written with the fact;
# recall hashes the query's lexemes with the same expression (QUERY_TERMS) and matches the two in
# numpy, so it no longer filters every fact's tsvector in SQL. Two lexemes share a 48-bit hash with a
# probability of about 2^-48 per pair: a query term would then also count the other lexeme.
LEXEME_HASH = sql.SQL("('x' || left(md5(convert_to({lexeme}, 'UTF8')), 12))::bit(48)::int8")
# One pass over the tsvector ``{tsv}``: ``dl``, its length in lexeme occurrences (BM25's document
# length), and ``terms``, its lexemes packed as above, those for which ``{keep}`` holds (all of them
# when a fact is written; at query time only the query's, which is all the ranking reads).
LEXEME_STATS = sql.SQL(
    """SELECT coalesce(sum(u.n), 0) AS dl,
       coalesce(string_agg(int8send({hash} * {code} + u.n), ''::bytea) FILTER (WHERE {keep}), ''::bytea) AS terms
FROM (SELECT l.lexeme, coalesce(array_length(l.positions, 1), 1) AS n FROM unnest({tsv}) l) u"""
)
# The query's distinct lexemes and their hashes (what `ranking.rank_scope` matches the facts' lexemes with).
QUERY_TERMS = sql.SQL(
    """SELECT coalesce(array_agg(q.lexeme), '{{}}'::text[]), coalesce(array_agg(DISTINCT {hash}), '{{}}'::int8[])
    FROM unnest(tsvector_to_array(to_tsvector(%(language)s::regconfig, %(query)s))) AS q(lexeme)"""
).format(hash=LEXEME_HASH.format(lexeme=sql.SQL("q.lexeme")))


# The same, with a held scope's check (`scope_cache.SCOPE_CHECK`) in the same round trip.
HELD_TERMS_CHECK = sql.SQL("SELECT * FROM ({query_terms}) q(lexemes, hashes), ({check}) c")


# A lexeme's key in its scope (GIN index of osa_fact_terms, version 10): the first 64 bits of the md5 of
# ``org/assignment/lexeme_hash``, so that one key's posting list holds one scope's facts only. Recall
# computes the query's keys the same way (`term_key`).
TERM_KEY = sql.SQL("('x' || left(md5({org} || '/' || {assignment} || '/' || {lexeme_hash}::text), 16))::bit(64)::int8")
# The keys of a fact's packed lexemes (`ranking.TERM_CODE`: each 8 bytes are ``hash * 1024 + count``).
TERM_KEYS = sql.SQL(
    """ARRAY(SELECT {key} FROM generate_series(1, length({terms}), 8) AS p(i),
    LATERAL (SELECT ('x' || encode(substring({terms} FROM p.i FOR 8), 'hex'))::bit(64)::int8 >> {bits} AS h) u)"""
)


def term_keys_of(terms: sql.Composable, org: sql.Composable, assignment: sql.Composable) -> sql.Composed:
    """`TERM_KEYS` of the packed lexemes ``terms`` in the scope (``org``, ``assignment``)."""
    key = TERM_KEY.format(org=org, assignment=assignment, lexeme_hash=sql.SQL("u.h"))
    return TERM_KEYS.format(key=key, terms=terms, bits=sql.Literal(TERM_BITS))


def term_key(org_id: str, assignment_id: str, lexeme_hash: int) -> int:
    """`TERM_KEY` computed here (for the query's lexemes)."""
    digest = hashlib.md5(f"{org_id}/{assignment_id}/{lexeme_hash}".encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def lexeme_stats(tsv: sql.Composable, keep: sql.Composable | None = None) -> sql.Composed:
    """`LEXEME_STATS` over the tsvector expression ``tsv``, packing the lexemes ``u.lexeme`` for which
    ``keep`` holds (all of them without it)."""
    return LEXEME_STATS.format(
        hash=LEXEME_HASH.format(lexeme=sql.SQL("u.lexeme")),
        code=sql.Literal(TERM_CODE),
        keep=keep if keep is not None else sql.SQL("true"),
        tsv=tsv,
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
           || CASE WHEN g.held_again_after IS NULL THEN '{{}}'::jsonb
                   ELSE jsonb_build_object('held_again_after', g.held_again_after) END
    FROM g WHERE %(audit)s::boolean
),
c AS (
    INSERT INTO {schema}.{chunk} (id, embedding, content, meta)
    SELECT %(chunk_id)s, %(embedding)s::vector, %(content)s, %(meta)s FROM g
    ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, content = EXCLUDED.content, meta = EXCLUDED.meta
),
t AS (
    INSERT INTO {schema}.osa_fact_terms
        (document_id, language, content_md5, terms, dl, content_hash, embedding, org_id, assignment_id, seq, term_keys)
    SELECT %(chunk_id)s, %(language)s, md5(%(content)s), ls.terms, ls.dl, %(content_hash)s, %(embedding)s::vector,
           %(org_id)s, %(assignment_id)s, g.seq, {term_keys}
    FROM g, (SELECT to_tsvector(%(language)s::regconfig,
                    regexp_replace(%(content)s, '^<!-- osa-memory:scope [^\n]* -->\n', '')) AS tsv
             OFFSET 0) x,  -- tokenised once (see SCOPE_ROWS)
         LATERAL ({lexeme_stats}) ls
    ON CONFLICT (document_id) DO UPDATE SET
        language = EXCLUDED.language, content_md5 = EXCLUDED.content_md5, terms = EXCLUDED.terms, dl = EXCLUDED.dl,
        content_hash = EXCLUDED.content_hash, embedding = EXCLUDED.embedding,
        org_id = EXCLUDED.org_id, assignment_id = EXCLUDED.assignment_id, seq = EXCLUDED.seq,
        term_keys = EXCLUDED.term_keys
)
SELECT g.id, g.status, g.held_again_after FROM g"""
)

# When a fact holds (its validity time, distinct from when it was stored): from ``valid_from`` (default the
# store time; facts stored before validity times existed hold from ``created_at``) until ``valid_to``
# (set by supersession or by the caller). ``%(valid_at)s`` NULL means any time; ``%(history)s`` admits
# facts that held at any time up to ``valid_at`` (recall with ``include_superseded``).
VALID_FROM = sql.SQL("coalesce((g.metadata->>'valid_from')::timestamptz, g.created_at)")
VALID_AT = sql.SQL(
    """(%(valid_at)s::timestamptz IS NULL
     OR (coalesce((g.metadata->>'valid_from')::timestamptz, g.created_at) <= %(valid_at)s::timestamptz
         AND (%(history)s::boolean
              OR coalesce((g.metadata->>'valid_to')::timestamptz, 'infinity') > %(valid_at)s::timestamptz)))"""
)
# The successor's valid_from as text (ISO 8601, UTC), for its predecessors' valid_to.
_VALID_FROM_TEXT = sql.SQL(
    """coalesce(s.metadata->>'valid_from',
                to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))"""
)
# Supersession, in the transaction that wrote the successor: each predecessor (same scope, a status that
# can be superseded, valid from before its successor) becomes `superseded`, holds until the successor's
# valid_from, links to it and gets an audit row; the successor lists its predecessors. The row lock of
# the UPDATE orders two supersessions of one fact: the second re-reads the row, finds it superseded and
# updates nothing, and `FactRepository.write` then refuses its whole transaction.
SUPERSEDE = sql.SQL(
    """WITH s AS (
    SELECT g.id, g.created_at, g.metadata, {valid_from} AS vf FROM {schema}.{gov} g
    WHERE g.id = %(successor)s AND g.org_id = %(org_id)s
),
old AS (
    UPDATE {schema}.{gov} g SET status = 'superseded', updated_at = now(),
        metadata = g.metadata || jsonb_build_object('valid_to', {valid_from_text}, 'superseded_by', s.id,
                                                    'superseded_from', g.status)
    FROM s
    WHERE g.id = ANY(%(ids)s) AND g.id <> s.id AND g.org_id = %(org_id)s AND g.source = %(source)s
      AND g.metadata->>'assignment_id' = %(assignment_id)s AND g.status = ANY(%(supersedable)s)
      AND {valid_from} < s.vf
    RETURNING g.id, g.metadata->>'superseded_from' AS previous, g.metadata->>'valid_to' AS valid_to
),
a AS (
    INSERT INTO {mem}.audit (actor, action, org_id, assignment_id, document_id, details)
    SELECT %(actor)s, 'supersede', %(org_id)s, %(assignment_id)s, old.id,
           jsonb_build_object('superseded_by', %(successor)s::text, 'valid_to', old.valid_to,
                              'previous_status', old.previous)
    FROM old
),
link AS (
    UPDATE {schema}.{gov} g SET metadata = jsonb_set(g.metadata, '{{supersedes}}', (
        SELECT coalesce(jsonb_agg(DISTINCT x.id), '[]'::jsonb)
        FROM (SELECT jsonb_array_elements_text(coalesce(g.metadata->'supersedes', '[]'::jsonb)) AS id
              UNION SELECT old.id FROM old) x))
    WHERE g.id = %(successor)s AND g.org_id = %(org_id)s AND EXISTS (SELECT 1 FROM old)
)
SELECT old.id FROM old"""
)
# A successor answers questions worded like the facts it replaced: its recall row's lexemes (and their
# scope-salted keys) are recomputed from its own text and its predecessors', so "Swift now runs in
# sa-east-1" is still found by "which region is the swift cluster in?" once it superseded "The swift
# cluster lives in region eu-west-1". Its vector, its length (BM25's dl: the words it takes do not make it
# look long), and what recall returns stay its own.
INHERIT_TERMS = sql.SQL(
    """UPDATE {schema}.osa_fact_terms t SET terms = ls.terms, term_keys = {term_keys}
    FROM (SELECT to_tsvector(%(language)s::regconfig,
                 regexp_replace(c.content, '^<!-- osa-memory:scope [^\n]* -->\n', '') || E'\n' ||
                 coalesce((SELECT string_agg(regexp_replace(p.content, '^<!-- osa-memory:scope [^\n]* -->\n', ''),
                                             E'\n' ORDER BY p.id)
                           FROM {schema}.{chunk} p
                           WHERE p.id IN (SELECT jsonb_array_elements_text(g.metadata->'supersedes')
                                          FROM {schema}.{gov} g
                                          WHERE g.id = %(successor)s AND g.org_id = %(org_id)s)), '')) AS tsv
          FROM {schema}.{chunk} c WHERE c.id = %(successor)s
          OFFSET 0) x,  -- tokenised once (see SCOPE_ROWS)
         LATERAL ({lexeme_stats}) ls
    WHERE t.document_id = %(successor)s AND t.org_id = %(org_id)s"""
)
# A superseded fact stored again holds again (UPSERT_GOVERNING_ROW): its former successor stops listing it,
# so that a value going back (X, then Y, then X again naming Y in ``supersedes``) is a new version of X after
# Y, never a loop of two facts listing each other. Its recall row is then recomputed (INHERIT_TERMS).
DETACH_SUCCESSOR = sql.SQL(
    """UPDATE {schema}.{gov} s
    SET metadata = CASE WHEN coalesce(s.metadata->'supersedes', '[]'::jsonb) - %(id)s::text = '[]'::jsonb
                        THEN s.metadata - 'supersedes'
                        ELSE jsonb_set(s.metadata, '{{supersedes}}', (s.metadata->'supersedes') - %(id)s::text) END
    WHERE s.id = %(successor)s AND s.org_id = %(org_id)s AND s.source = %(source)s
      AND s.metadata->>'assignment_id' = %(assignment_id)s"""
)
# Why an id named in ``supersedes`` was not superseded (read in the same transaction, before it is undone).
SUPERSEDE_REFUSALS = sql.SQL(
    """SELECT g.id, g.status, g.metadata->>'superseded_by', {valid_from}
    FROM {schema}.{gov} g
    WHERE g.id = ANY(%(ids)s) AND g.org_id = %(org_id)s AND g.source = %(source)s
      AND g.metadata->>'assignment_id' = %(assignment_id)s AND g.status <> 'retired'"""
)


# The rows of one scope, in storing order (`seq`): the caller's governing rows and nothing else, so
# there is no top-k before the scope is applied and a huge knowledge base of closer matches cannot
# crowd an assignment's facts out. For each fact it returns what ranking needs
# (`haystack_osa_memory.store.ranking`): the cosine with the query, the length in lexemes and the
# packed lexemes (LEXEME_STATS), matched against the query's (QUERY_TERMS) in numpy. These come from
# the fact's row in osa_fact_terms, written with the fact (lexical statistics and a copy of the
# chunk's vector) and used while its content hash is the governing row's; a fact without one (written
# by other tools, or before schema 7) is read from its chunk and tokenised at query time (only its
# lexemes that are the query's are packed: that is all the ranking reads). Reading one
# narrow row per fact instead of joining the chunk table took a 680-fact scope from ~5 to ~3 ms, and
# matching lexemes in numpy instead of filtering each tsvector in SQL from ~4.4 to ~2.5 ms. Text,
# metadata and timestamps are fetched afterwards for the few facts returned (SCOPE_FACTS). The recall
# row is fetched by primary key per fact (a fenced LATERAL): under row-level security the planner
# misjudged the policy-filtered table and re-scanned it for every fact (17 ms instead of 3 ms). Facts of
# `CONTEXT_STATUSES` are read too (``read_statuses``), marked unscored: they only lend context.
SCOPE_ROWS = sql.SQL(
    """WITH s AS MATERIALIZED (
    SELECT g.id AS document_id, g.seq, g.created_at, g.metadata->>'expires_at' AS expires_at, g.content_hash,
           g.status = ANY(%(statuses)s) AS scored
    FROM {schema}.{gov} g
    WHERE g.org_id = %(org_id)s
      AND g.audience = ANY(%(audiences)s)
      AND g.status = ANY(%(read_statuses)s)
      AND g.metadata->>'assignment_id' = %(assignment_id)s
      AND {valid_at}
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
# -- big scopes --------------------------------------------------------------------------------------
# Reading every fact of a scope costs time in proportion to its size (52 ms at 10,000 facts, 232 ms at
# 30,000). Past `EXACT_SCOPE_MAX` facts, recall takes its candidates from indexes of osa_fact_terms that
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
#: (it only lends context to the candidate's outermost scored neighbour). One, not two: ~13% fewer rows
#: read at 100,000 facts, the same top 8 on 200 queries where no fact near a candidate had changed.
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
BIG_SCOPE_VECTOR = sql.SQL(
    """SELECT t.seq FROM {schema}.osa_fact_terms t
    WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s
    ORDER BY t.embedding::vector({dimension}) <=> %(embedding)s::vector({dimension})
    LIMIT %(vector_k)s"""
)
# Session settings for the vector side: without the iterative scan, an HNSW scan filtered by scope would
# return fewer rows than asked when the scope is a small part of the table.
BIG_SCOPE_SETTINGS = sql.SQL(
    "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', false), set_config('hnsw.ef_search', %s, false)"
)
# A candidate and its neighbours are read by walking the scope index from it, one index range per candidate
# and side that returns whole rows (the candidate itself is the first row of the backward walk). Reading
# each row again by (scope, seq) after an index-only walk cost 2,000 extra index descents at 100,000 facts
# (24 vs 17 ms for the statement). Joining the governing table inside the walk made the planner hash-join
# the whole scope once per candidate (8 s for 200 candidates at 20,000 facts); it is probed per row
# instead, by primary key.
BIG_SCOPE_NEIGHBOURS = sql.SQL(
    """SELECT t.seq, t.document_id, t.content_hash, t.embedding, t.dl, t.terms FROM {schema}.osa_fact_terms t
            WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s AND t.seq {direction} c.seq
              AND t.language = %(language)s::text AND t.terms IS NOT NULL
            ORDER BY t.seq {order} LIMIT {limit}"""
)
# The rows of the walks that are admitted (fenced laterals: left to itself the planner hash-joined both
# whole tables of the scope, 45 ms at 20,000 facts, growing with the scope instead of with the
# candidates). Overlapping walks read a row twice: it is returned once. Rows of `CONTEXT_STATUSES` come
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


# The planner's statistics of the tables facts are written to, refreshed after a bulk load (`import`):
# until ANALYZE (or autovacuum, which may come minutes later) has seen the new rows, PostgreSQL takes a new
# scope for a few rows and plans the scope's statements for that. Only the tables' owner may analyze them;
# PostgreSQL skips (with a warning) a table another role owns.
ANALYZE_FACT_TABLES = sql.SQL("ANALYZE {schema}.{gov}, {schema}.{chunk}, {schema}.osa_fact_terms")
# Rows of the recall-row table written since it was last analyzed, and how many it had then: a big scope's
# recall refreshes the statistics itself when more rows were written since than the table had (many agents
# storing into a new assignment, faster than autovacuum's threshold of a tenth of the table).
WRITES_SINCE_ANALYZE = sql.SQL(
    """SELECT s.n_mod_since_analyze, c.reltuples, s.last_analyze IS NULL AND s.last_autoanalyze IS NULL
    FROM pg_catalog.pg_stat_user_tables s JOIN pg_catalog.pg_class c ON c.oid = s.relid
    WHERE s.schemaname = %(schema)s AND s.relname = 'osa_fact_terms'"""
)
#: Seconds between two looks at `WRITES_SINCE_ANALYZE` per process (only recalls of big scopes look).
STALE_STATISTICS_CHECK_S = 60.0


# Cosine similarity of one fact to others, from their recall rows (the vector written with each fact):
# `kb_memory_store` asks it of the facts it may replace (`Memory`'s `possibly_supersedes`).
COSINES_TO = sql.SQL(
    """SELECT b.document_id, 1 - (a.embedding <=> b.embedding)
    FROM {schema}.osa_fact_terms a
        JOIN {schema}.osa_fact_terms b ON b.org_id = a.org_id AND b.document_id = ANY(%(ids)s)
    WHERE a.document_id = %(document_id)s AND a.org_id = %(org_id)s
      AND a.embedding IS NOT NULL AND b.embedding IS NOT NULL"""
)


@dataclass(frozen=True)
class ScopeSize:
    """A scope's recall rows: how many, their mean length in lexemes, and when this was read."""

    facts: int
    mean_dl: float
    read_at: float


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

GOVERNING_ROWS = sql.SQL(
    """SELECT id, org_id, audience, status, metadata->>'assignment_id' AS assignment_id
    FROM {schema}.{gov} WHERE id = ANY(%s) AND org_id = %s"""
)


@dataclass(frozen=True)
class GoverningRow:
    """The access-relevant columns of one governing row."""

    document_id: str
    org_id: str
    audience: str
    status: str
    assignment_id: str | None


class QueryTerms(NamedTuple):
    """A query's distinct lexemes (PostgreSQL's ``to_tsvector``) and their hashes (`LEXEME_HASH`)."""

    lexemes: list[str]
    hashes: list[int]


class ScopeHit(NamedTuple):
    """One fact of a scope that made a top-k list, before its text is fetched (ranks ``None`` when
    that side missed it; ``position`` is its place in storing order, from 1). A named tuple, like
    `RankedFact`: cheap to build by the hundred."""

    document_id: str
    chunk_id: str
    expires_at: str | None
    lex_rank: int | None
    lex_score: float | None
    vec_rank: int | None
    vec_score: float | None
    fused: float
    position: int


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
#: When the facts must hold (`VALID_AT`): a time, ``"now"`` (PostgreSQL's transaction time) or ``None`` (any time).
ValidAt = datetime | Literal["now"] | None


def postings_prefix(counts: Sequence[float], budget: float) -> int:
    """How many of ``counts`` (facts holding each lexeme, rarest first) bring candidates: the longest prefix
    whose sum stays within ``budget``, and at least the first (0 when there is none)."""
    total = 0.0
    for n, count in enumerate(counts):
        total += count
        if n and total > budget:
            return n
    return len(counts)


def vector_literal(embedding: Vector | None) -> str | None:
    """pgvector's text form of an embedding (``None`` stays ``None``)."""
    if embedding is None:
        return None
    if isinstance(embedding, np.ndarray) and embedding.dtype == np.float32:
        # Nine significant digits give back every float32 exactly, at half the cost of repr().
        return "[" + ",".join(["%.9g" % x for x in embedding.tolist()]) + "]"  # noqa: UP031
    values = embedding.tolist() if isinstance(embedding, np.ndarray) else embedding
    return "[" + ",".join(repr(float(x)) for x in values) + "]"


class FactRepository:
    """All SQL on governing rows and chunks, for one configuration.

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
        self._upsert_row = UPSERT_GOVERNING_ROW.format(**names)
        self._scope_rows = SCOPE_ROWS.format(
            **names,
            valid_at=VALID_AT,
            lexeme_stats=lexeme_stats(sql.SQL("v.tsv"), sql.SQL("u.lexeme = ANY (%(lexemes)s::text[])")),
        )
        self._scope_facts = SCOPE_FACTS.format(
            **names, valid_at=VALID_AT, governing_row=governing_row_by_id(names, sql.SQL("r.document_id"))
        )
        self._supersede = SUPERSEDE.format(**names, valid_from=VALID_FROM, valid_from_text=_VALID_FROM_TEXT)
        self._supersede_refusals = SUPERSEDE_REFUSALS.format(**names, valid_from=VALID_FROM)
        self._detach_successor = DETACH_SUCCESSOR.format(**names)
        self._inherit_terms = INHERIT_TERMS.format(
            **names,
            lexeme_stats=lexeme_stats(sql.SQL("x.tsv")),
            term_keys=term_keys_of(sql.SQL("ls.terms"), sql.SQL("%(org_id)s"), sql.SQL("%(assignment_id)s")),
        )
        self._scope_stats = SCOPE_STATS.format(**names)
        self._big_df = BIG_SCOPE_DF.format(**names)
        self._big_lexical = BIG_SCOPE_LEXICAL.format(**names)
        self._big_vector = BIG_SCOPE_VECTOR.format(dimension=sql.Literal(config.embedding_dimension), **names)
        self._big_rows = BIG_SCOPE_ROWS.format(
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
        #: Scopes with more recall rows than this take the big-scope path (candidates from indexes).
        self.exact_scope_max = EXACT_SCOPE_MAX
        #: Scopes past `exact_scope_max` and within the cache are ranked exactly from memory (`scope_cache`).
        self.scope_cache = (
            ScopeCache(config.scope_cache_facts, config.embedding_dimension) if config.scope_cache_facts else None
        )
        self._cache_statements = CacheStatements.compose(names, VALID_AT)
        self._held_terms_check = HELD_TERMS_CHECK.format(query_terms=QUERY_TERMS, check=self._cache_statements.check)
        self._sizes: dict[tuple[str, str], ScopeSize] = {}
        self._counts: dict[tuple[str, str, int, bool], tuple[float, float]] = {}
        #: Read the common lexemes' counts from PostgreSQL's statistics (`COMMON_LEXEMES`) instead of counting.
        self.lexeme_estimates = True
        self._common: tuple[dict[int, float], float] = ({}, -math.inf)
        self._sizes_lock = threading.Lock()
        self._statistics_checked = -math.inf
        self._governing_rows = GOVERNING_ROWS.format(**names)
        self._cosines_to = COSINES_TO.format(**names)
        self._write_fact = WRITE_FACT.format(
            upsert_row=self._upsert_row,
            lexeme_stats=lexeme_stats(sql.SQL("x.tsv")),
            term_keys=term_keys_of(sql.SQL("ls.terms"), sql.SQL("%(org_id)s"), sql.SQL("%(assignment_id)s")),
            **names,
        )

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
            SupersessionError: a fact named in ``supersedes`` cannot be superseded, or the fact written
                waits for a person's review; nothing is written.
        """
        return [doc_id for doc_id, _ in self.write_statuses(items, audit=audit)]

    def write_statuses(
        self,
        items: Sequence[tuple[dict[str, Any], dict[str, Any]]],
        *,
        audit: dict[str, Any] | None = None,
    ) -> list[tuple[str, str]]:
        """`write`, returning each fact's id with the status it has after the write (storing the text of a
        fact held for review keeps it held: `tools.HELD_STATUSES`)."""
        now = datetime.now(UTC).isoformat()
        params = [
            {
                **{k: v for k, v in row.items() if k != "supersedes"},
                "metadata": json.dumps({"valid_from": now, **row["metadata"]}),
                "valid_from_given": "valid_from" in row["metadata"],
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
                "held": list(HELD_STATUSES),
            }
            for row, chunk in items
        ]
        written: list[tuple[str, str]] = []
        scopes = {(row["org_id"], row["metadata"].get("assignment_id")) for row, _ in items}
        org_id, assignment_id = next(iter(scopes)) if len(scopes) == 1 else ("", "")
        # Written inside the rows' scope: with row-level security on, PostgreSQL checks each new row
        # against it (a batch spanning scopes is refused there).
        with (
            fact_scope(org_id, assignment_id or ""),
            transaction(self.conn_str, self.config) as conn,
            conn.cursor() as cur,
        ):
            if len(params) == 1:
                cur.execute(self._write_fact, params[0])
            else:
                cur.executemany(self._write_fact, params, returning=True)
            detached: list[tuple[dict[str, Any], str]] = []
            for n, p in enumerate(params):
                if n:
                    cur.nextset()
                found = cur.fetchone()
                if found is None:
                    msg = f"document id {p['id']} belongs to another document; refusing to overwrite it"
                    raise DatabaseError(msg)
                written.append((p["id"], str(found[1])))
                if found[2] is not None:
                    detached.append((p, str(found[2])))
            for p, successor in detached:
                # It no longer lists the fact that holds again: its recall row loses that fact's words.
                scope = {**self._scope_of(p), "successor": successor}
                cur.execute(self._detach_successor, {**scope, "id": p["id"]})
                cur.execute(self._inherit_terms, {**scope, "language": p["language"]})
            for (row, _), p, (_, status) in zip(items, params, written, strict=True):
                if row.get("supersedes"):
                    if status != APPROVED:
                        msg = (
                            f"cannot supersede: fact {p['id']} is {status} and waits for a person's review "
                            "(osa-memory review); only an approved fact can supersede others. Nothing was stored."
                        )
                        raise SupersessionError(msg)
                    self._supersede_in(cur, p, list(row["supersedes"]))
        return written

    @staticmethod
    def _scope_of(written: dict[str, Any]) -> dict[str, Any]:
        return {
            "org_id": written["org_id"],
            "assignment_id": written["assignment_id"],
            "source": written["source"],
        }

    def _supersede_in(self, cur: psycopg.Cursor[Any], written: dict[str, Any], ids: list[str]) -> None:
        """Supersede ``ids`` by the fact just written (`SUPERSEDE`), in its transaction; refuses them all,
        with the reason for each, unless every one was superseded (the caller's transaction is then undone)."""
        scope = {
            "org_id": written["org_id"],
            "assignment_id": written["assignment_id"],
            "source": written["source"],
            "ids": ids,
        }
        params = {
            **scope,
            "successor": written["id"],
            "supersedable": list(SUPERSEDABLE_STATUSES),
            "actor": written["actor"] or "unknown",
        }
        done = {r[0] for r in cur.execute(self._supersede, params).fetchall()}
        if done == set(ids):
            inherit = {**scope, "successor": written["id"], "language": written["language"]}
            cur.execute(self._inherit_terms, inherit)
            return
        found = {r[0]: r[1:] for r in cur.execute(self._supersede_refusals, scope).fetchall()}
        successor = found.get(written["id"])
        reasons = []
        for doc_id in ids:
            if doc_id in done:
                continue
            row = found.get(doc_id)
            if doc_id == written["id"]:
                reasons.append(f"{doc_id} is the fact being stored: a fact cannot supersede itself")
            elif row is None:
                reasons.append(f"no fact {doc_id} in this assignment")
            elif row[0] == SUPERSEDED:
                reasons.append(f"fact {doc_id} is already superseded by {row[1]}")
            elif row[0] in REVIEWABLE_STATUSES:
                reasons.append(
                    f"fact {doc_id} is {row[0]} and waits for a person's review (osa-memory review); "
                    f"only {', '.join(SUPERSEDABLE_STATUSES)} facts can be superseded"
                )
            elif row[0] not in SUPERSEDABLE_STATUSES:
                allowed = ", ".join(SUPERSEDABLE_STATUSES)
                reasons.append(f"fact {doc_id} is {row[0]}; only {allowed} facts can be superseded")
            else:
                since = successor[2].isoformat() if successor is not None else "its valid_from"
                reasons.append(
                    f"fact {doc_id} holds from {row[2].isoformat()}, not before the new fact (valid from {since})"
                )
        msg = "cannot supersede: " + "; ".join(reasons) + ". Nothing was stored."
        raise SupersessionError(msg)

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
        with self.reading() as conn:
            hits = self.scope_hits(
                org_id=org_id,
                assignment_id=assignment_id,
                query=query,
                embedding=embedding,
                ranking=ranking,
                audiences=audiences,
                statuses=statuses,
                valid_at=valid_at,
                history=history,
                conn=conn,
            )
            return self.candidates(
                hits,
                org_id=org_id,
                assignment_id=assignment_id,
                audiences=audiences,
                statuses=statuses,
                valid_at=valid_at,
                history=history,
                conn=conn,
            )

    def scope_hits(
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
        conn: psycopg.Connection[Any] | None = None,
        boost: QueryTerms | None = None,
    ) -> list[ScopeHit]:
        """The scope's facts within the top ``ranking.k`` of the lexical, vector or fused ranking, in
        storing order, without their text (one statement over the scope's rows, ranked by
        `haystack_osa_memory.store.ranking.rank_scope`). ``conn``: a connection from `reading()`.
        ``boost``: lexemes whose holders gain ``ranking.time_boost`` (`query_terms` of some words)."""
        if embedding is not None and len(embedding) != self.config.embedding_dimension:
            msg = (
                f"query embedding has {len(embedding)} dimensions but the chunk table stores "
                f"{self.config.embedding_dimension}"
            )
            raise DatabaseError(msg)
        params = {
            **self._scope(org_id, assignment_id, audiences, statuses, valid_at, history),
            "language": self.config.language,
            "embedding": vector_literal(embedding),
        }
        with self._reading(conn) as c, c.cursor(binary=True) as cur:
            size = self.scope_size(org_id, assignment_id, conn=c)
            if size.facts > self.exact_scope_max:
                self._refresh_stale_statistics(c)
            cache = self.scope_cache
            held_here = (
                size.facts > self.exact_scope_max
                and cache is not None
                and size.facts <= cache.max_facts
                and self._held_kind(audiences, statuses, valid_at, history)
            )
            seen = Check(0, 0, 0)
            if held_here:
                # The query's lexemes and the held scope's check in one round trip.
                row = cur.execute(self._held_terms_check, {**params, "query": query}).fetchone()
                assert row is not None  # an aggregate over a one-row join: always one row
                params["lexemes"], query_terms = list(row[0]), list(row[1])
                seen = Check(int(row[2]), int(row[3]), int(row[4]))
            else:
                params["lexemes"], query_terms = self.query_terms(query, conn=c)
            boost_terms = boost.hashes if boost is not None and ranking.time_boost else []
            if boost_terms:
                assert boost is not None
                params["lexemes"] = [*params["lexemes"], *boost.lexemes]  # the fallback packs only these
            if size.facts > self.exact_scope_max:
                if held_here and cache is not None:
                    with cache.use(cur, self._cache_statements, params, seen) as held:
                        if held is not None:
                            ids, until = held.document_ids, held.expires
                            return [
                                ScopeHit(ids[i], ids[i], until[i], lr, ls, vr, vs, fused, i + 1)
                                for i, lr, ls, vr, vs, fused in held.rank(embedding, query_terms, ranking, boost_terms)
                            ]
                return self._big_scope_hits(
                    cur, params, query_terms, size, ranking, embedding is not None, boost_terms=boost_terms
                )
            rows = cur.execute(self._scope_rows, params).fetchall()
        if not rows:
            return []
        if not all(r[6] for r in rows):
            rows = list(compress(rows, context_kept([r[7] for r in rows], [r[6] for r in rows])))
        document_ids, chunk_ids, expires, cos, dl, terms, scored, _ = zip(*rows, strict=True)
        ranked = rank_scope(
            cos, dl, terms, query_terms, ranking, scored=None if all(scored) else scored, boost_terms=boost_terms
        )
        return [
            ScopeHit(document_ids[i], chunk_ids[i], expires[i], lr, ls, vr, vs, fused, i + 1)
            for i, lr, ls, vr, vs, fused in ranked
        ]

    def scope_size(self, org_id: str, assignment_id: str, *, conn: psycopg.Connection[Any]) -> ScopeSize:
        """The scope's recall rows (count, mean length): read at most every `SCOPE_STATS_TTL_S` seconds
        per process (one index-only scan; the figures only choose the path and weigh BM25 there)."""
        key = (org_id, assignment_id)
        now = time.monotonic()
        with self._sizes_lock:
            known = self._sizes.get(key)
        if known is not None and now - known.read_at <= SCOPE_STATS_TTL_S:
            return known
        row = conn.execute(self._scope_stats, {"org_id": org_id, "assignment_id": assignment_id}).fetchone()
        size = ScopeSize(int(row[0]), float(row[1]), now) if row else ScopeSize(0, 0.0, now)
        with self._sizes_lock:
            if len(self._sizes) > 10_000:  # a long-lived server sees many scopes: keep the memory bounded
                self._sizes.clear()
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
        missing = [k for k, v in known.items() if v is None or now - v[1] > SCOPE_STATS_TTL_S]
        counts = {k: v[0] for k, v in known.items() if v is not None and k not in missing}
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
                if len(self._counts) > 100_000:  # bounded, as the sizes
                    self._counts.clear()
                for k, c in fresh.items():
                    self._counts[(org, assignment, k, estimates)] = (c, now)
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

    def _held_kind(
        self, audiences: Sequence[str], statuses: Sequence[str] | None, valid_at: ValidAt, history: bool
    ) -> bool:
        """A recall the held scopes answer: the facts' audience, the admitted statuses, valid now."""
        admitted = list(statuses or self.config.admitted_statuses) == list(self.config.admitted_statuses)
        return admitted and list(audiences) == [FACT_AUDIENCE] and valid_at == "now" and not history

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

    def candidates(
        self,
        hits: Sequence[ScopeHit],
        *,
        org_id: str,
        assignment_id: str,
        audiences: Sequence[str] = (FACT_AUDIENCE,),
        statuses: Sequence[str] | None = None,
        valid_at: ValidAt = "now",
        history: bool = False,
        conn: psycopg.Connection[Any] | None = None,
    ) -> list[Candidate]:
        """``hits`` with their text, metadata and timestamps, in the same order; the scope is checked
        again, so a fact that left it since (retired, moved) is dropped. ``conn``: as in `scope_hits`."""
        if not hits:
            return []
        params = {
            **self._scope(org_id, assignment_id, audiences, statuses, valid_at, history),
            "document_ids": [h.document_id for h in hits],
            "chunk_ids": [h.chunk_id for h in hits],
        }
        with self._reading(conn) as c:
            details = {row[0]: row[1:] for row in c.execute(self._scope_facts, params).fetchall()}
        if (
            len(details) < len(hits)
            and self.scope_cache is not None
            and self._held_kind(audiences, statuses, valid_at, history)
        ):
            # Left the scope by a change of its governing row alone (superseded, retired, no longer valid),
            # which the held scope's check cannot see: it is ranked without them from now on.
            self.scope_cache.drop_facts((org_id, assignment_id), {h.document_id for h in hits} - set(details))
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

    def cosines_to(self, document_id: str, others: Sequence[str], org_id: str) -> dict[str, float]:
        """The cosine similarity of a fact to each of ``others`` (`COSINES_TO`); facts without vectors are absent."""
        if not others:
            return {}
        params = {"document_id": document_id, "ids": list(others), "org_id": org_id}
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
        return self._scope_rows

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
        (`WRITES_SINCE_ANALYZE`), looked at most every `STALE_STATISTICS_CHECK_S` seconds per process."""
        now = time.monotonic()
        with self._sizes_lock:
            if now - self._statistics_checked < STALE_STATISTICS_CHECK_S:
                return
            self._statistics_checked = now
        row = conn.execute(WRITES_SINCE_ANALYZE, {"schema": self.config.kb_schema}).fetchone()
        if row is None:
            return
        written, rows_then, never = int(row[0] or 0), max(float(row[1] or 0.0), 0.0), bool(row[2])
        if written > self.exact_scope_max and (never or written > rows_then):
            self.analyze(conn)

    def reading(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """One pooled connection for several reads (`scope_hits` then `candidates`: one checkout)."""
        return read(self.conn_str, self.config)

    def _reading(self, conn: psycopg.Connection[Any] | None) -> AbstractContextManager[psycopg.Connection[Any]]:
        return nullcontext(conn) if conn is not None else self.reading()

    def _scope(
        self,
        org_id: str,
        assignment_id: str,
        audiences: Sequence[str],
        statuses: Sequence[str] | None,
        valid_at: ValidAt = "now",
        history: bool = False,
    ) -> dict[str, Any]:
        admitted = list(statuses or self.config.admitted_statuses)
        return {
            "org_id": org_id,
            "assignment_id": assignment_id,
            "audiences": list(audiences),
            "statuses": admitted,
            "read_statuses": [*admitted, *(s for s in CONTEXT_STATUSES if s not in admitted)],
            "valid_at": valid_at,
            "history": history,
        }

    def governing_rows(self, document_ids: Sequence[str], org_id: str) -> dict[str, GoverningRow]:
        """Governing rows of ``org_id`` by id (ids with no row there are absent). The org is a condition
        of the statement, so a knowledge base distributed by org reads one shard (docs/scaling.md)."""
        if not document_ids:
            return {}
        with read(self.conn_str, self.config) as conn:
            rows = conn.execute(self._governing_rows, (list(document_ids), org_id)).fetchall()
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


# The recall rows (osa_fact_terms with its indexes) beside the server's shared buffers: recall in a big
# assignment reads its candidates' pages at random, from the operating system's cache when they do not fit
# (docs/operations.md, "Sizing").
RECALL_ROWS_SIZE = sql.SQL(
    """SELECT current_setting('shared_buffers'), pg_size_bytes(current_setting('shared_buffers')),
              coalesce(pg_total_relation_size(to_regclass(format('%%I.osa_fact_terms', %(schema)s::text))), 0)"""
)


@dataclass(frozen=True)
class BufferFit:
    """The server's ``shared_buffers`` and the size of the recall rows with their indexes, in bytes."""

    shared_buffers: str
    shared_buffers_bytes: int
    recall_rows_bytes: int

    @property
    def fits(self) -> bool:
        """The recall rows fit in the shared buffers."""
        return self.recall_rows_bytes <= self.shared_buffers_bytes


def buffer_fit(conn_str: str, config: MemoryConfig) -> BufferFit:
    """How the recall rows compare with the server's shared buffers (`RECALL_ROWS_SIZE`)."""
    with read(conn_str, config) as conn:  # one statement: no BEGIN / COMMIT round trips
        row = conn.execute(RECALL_ROWS_SIZE, {"schema": config.kb_schema}).fetchone()
    assert row is not None
    return BufferFit(str(row[0]), int(row[1]), int(row[2]))
