"""A fact's recall row (osa_fact_terms) in the forms recall matches it in: its lexemes packed with their
counts, their scope-salted keys, the query's lexemes hashed alike, and vectors in pgvector's text form.
The SQL expressions here and the Python beside them compute the same values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from psycopg import sql

from haystack_osa_memory.store.ranking import TERM_BITS, TERM_CODE

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


class QueryTerms(NamedTuple):
    """A query's distinct lexemes (PostgreSQL's ``to_tsvector``) and their hashes (`LEXEME_HASH`)."""

    lexemes: list[str]
    hashes: list[int]


def with_boost(lexemes: list[str], boost: QueryTerms | None, time_boost: float) -> tuple[list[str], list[int]]:
    """The lexemes a scope's statement packs for a fact without its recall row (the query's, and ``boost``'s when
    the ranking boosts, ``time_boost``), and the boost's hashes for the ranking (none when it does not)."""
    if boost is None or not time_boost or not boost.hashes:
        return lexemes, []
    return [*lexemes, *boost.lexemes], boost.hashes


Vector = Sequence[float] | npt.NDArray[np.float32]


def vector_literal(embedding: Vector | None) -> str | None:
    """pgvector's text form of an embedding (``None`` stays ``None``)."""
    if embedding is None:
        return None
    if isinstance(embedding, np.ndarray) and embedding.dtype == np.float32:
        # Nine significant digits give back every float32 exactly, at half the cost of repr().
        return "[" + ",".join(["%.9g" % x for x in embedding.tolist()]) + "]"  # noqa: UP031
    values = embedding.tolist() if isinstance(embedding, np.ndarray) else embedding
    return "[" + ",".join(repr(float(x)) for x in values) + "]"
