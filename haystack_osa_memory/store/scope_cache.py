"""A big assignment's recall rows held in process memory, kept current by a cheap check per recall.

Between `facts.EXACT_SCOPE_MAX` and `MemoryConfig.scope_cache_facts` facts, recall ranks the whole
scope exactly (as the exact path does) from rows read once and kept: each fact's normalised vector,
length and unpacked lexemes, in storing order. Reading them is slow, in proportion to the scope;
ranking them in numpy is cheap. Every recall first reads the count, sum and maximum of
the scope's recall rows' ``seq`` (`SCOPE_CHECK`, one index-only scan of the index the big path walks):

- unchanged: the rows held are current;
- only rows past the highest ``seq`` held were added (the rows up to it are as many, with the same
  sum): those rows are read and appended (`SCOPE_ROWS_AFTER`);
- anything else (a fact forgotten, a row committed late with a lower ``seq``): the scope is read again.

What the check cannot see is a change of the governing row alone (a fact superseded, retired or
flagged; its validity ending). The facts recall returns are fetched with their governing rows checked
again (`FactRepository.candidates`, fail closed): one that left the scope is not returned, and is
dropped from memory, so later recalls rank without it. A fact admitted again by a change of its
governing row alone is seen when the scope is next read in full: at least every `FULL_READ_S`
seconds. The scope is a condition of every statement, and held scopes are keyed by org and
assignment: nothing read for one scope can rank in another.

Usage:
```python
cache = ScopeCache(max_facts=50_000, dimension=384)
now = Check(*cursor.execute(statements.check, scope_params).fetchone())
with cache.use(cursor, statements, scope_params, now) as held:   # None: not held (too big for the cache)
    ranked = held.rank(query_embedding, query_terms, ranking) if held is not None else None
```
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql

from haystack_osa_memory.store.ranking import PackedTerms, RankedFact, RankingParams, context_kept, rank_scope

#: Seconds after which a held scope is read again in full (changes of governing rows alone show then).
FULL_READ_S = 30.0
#: Locks shared by the held scopes (a scope's is chosen by its key's hash).
LOCK_STRIPES = 64

# A governing row probed by its primary key and its org (a table partitioned or distributed by org needs
# the org to reach one partition); the scope's other conditions are applied outside the fence (`OFFSET 0`:
# PostgreSQL pushes no condition into it). Statistics that have not seen a burst of new rows take the new
# scope for one row; with the assignment and status inside, the planner then probed through the scope index
# and read the whole scope once per fact. Inside the fence that index can match the org only, which costs
# more than the primary key for any org the statistics know; for an org they have never seen, recall
# refreshes them first (`FactRepository` analyzes after many writes).
GOVERNING_ROW_BY_ID = sql.SQL(
    """(SELECT g.id, g.org_id, g.audience, g.status, g.content_hash, g.metadata, g.created_at, g.updated_at
     FROM {schema}.{gov} g WHERE g.id = {id} AND g.org_id = %(org_id)s OFFSET 0)"""
)


def governing_row_by_id(names: dict[str, sql.Identifier], document_id: sql.Composable) -> sql.Composed:
    """`GOVERNING_ROW_BY_ID` for the fact whose id is the expression ``document_id``."""
    return GOVERNING_ROW_BY_ID.format(id=document_id, schema=names["schema"], gov=names["gov"])


SCOPE_CHECK = sql.SQL(
    """SELECT count(*) AS count, coalesce(sum(t.seq), 0)::numeric AS sum, coalesce(max(t.seq), 0) AS max
    FROM {schema}.osa_fact_terms t
    WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s"""
)
# The admitted facts' recall rows past a seq, in storing order, with the check's figures and the count
# and sum of every recall row past that seq (admitted or not), all from one snapshot: an append is valid
# when the rows up to the seq are still those held (count and sum unchanged). The governing row is probed
# per row by primary key, as in BIG_SCOPE_ROWS; rows that only lend context come marked unscored. Vectors
# travel in pgvector's binary form (``vector_send``: a 2-byte dimension, 2 unused bytes, then big-endian
# float4s).
SCOPE_ROWS_AFTER = sql.SQL(
    """WITH c AS MATERIALIZED ({check}),
a AS MATERIALIZED (
    SELECT count(*) AS count, coalesce(sum(t.seq), 0)::numeric AS sum FROM {schema}.osa_fact_terms t
    WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s AND t.seq > %(after)s
)
SELECT c.count, c.sum, c.max, a.count, a.sum, r.id, r.expires_at, r.seq, r.vec, r.dl, r.terms, r.scored
FROM c, a LEFT JOIN LATERAL (
    SELECT g.id, g.expires_at, t.seq, vector_send(t.embedding) AS vec, t.dl::float8 AS dl, t.terms, g.scored
    FROM {schema}.osa_fact_terms t,
        LATERAL (SELECT g.id, g.metadata->>'expires_at' AS expires_at, g.status = ANY(%(statuses)s) AS scored
                 FROM {governing_row} g
                 WHERE g.content_hash = t.content_hash AND g.audience = ANY(%(audiences)s)
                   AND g.status = ANY(%(read_statuses)s) AND g.metadata->>'assignment_id' = %(assignment_id)s
                   AND {valid_at}) g
    WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s AND t.seq > %(after)s
      AND t.language = %(language)s::text AND t.terms IS NOT NULL
    ORDER BY t.seq
) r ON true
ORDER BY r.seq"""
)


@dataclass(frozen=True)
class HeldStats:
    """What the process holds, summed over its caches (for metrics): ``scopes``, ``facts`` and ``array_bytes``
    (the numpy arrays; ids and other Python objects aside) now, and the full reads, appends and facts
    dropped since the counts were last popped (`held_stats`)."""

    scopes: int
    facts: int
    array_bytes: int
    full_reads: int
    appends: int
    dropped: int


# Every cache of the process, for `held_stats` (a repository's cache goes with it), and the events of all
# of them since the last pop.
_caches: weakref.WeakSet[ScopeCache] = weakref.WeakSet()
_events_lock = threading.Lock()
_events = {"full_reads": 0, "appends": 0, "dropped": 0}


def _note(event: str, n: int = 1) -> None:
    with _events_lock:
        _events[event] += n


def held_stats(*, pop: bool = False) -> HeldStats:
    """The scopes, facts and array bytes held by this process's caches, and the events since the last pop
    (``pop``: reset them, for a sampler that adds them to counters)."""
    scopes = facts = size = 0
    for cache in list(_caches):
        for entry in cache.entries():
            scopes += 1
            facts += len(entry)
            size += entry.nbytes
    with _events_lock:
        events = dict(_events)
        if pop:
            _events.update(dict.fromkeys(_events, 0))
    return HeldStats(scopes, facts, size, events["full_reads"], events["appends"], events["dropped"])


@dataclass(frozen=True)
class Statements:
    """The cache's statements for one configuration (composed once by the repository)."""

    check: sql.Composed
    rows_after: sql.Composed

    @classmethod
    def compose(cls, names: dict[str, sql.Identifier], valid_at: sql.Composable) -> Statements:
        check = SCOPE_CHECK.format(**names)
        return cls(
            check=check,
            rows_after=SCOPE_ROWS_AFTER.format(
                check=check,
                valid_at=valid_at,
                governing_row=governing_row_by_id(names, sql.SQL("t.document_id")),
                **names,
            ),
        )


@dataclass(frozen=True)
class Check:
    """The scope's recall rows as `SCOPE_CHECK` saw them."""

    count: int
    seq_sum: int
    seq_max: int


class HeldScope:
    """One scope's admitted recall rows, in storing order, and the check they were read at. Not
    thread-safe by itself: `ScopeCache` hands it out under the scope's lock."""

    def __init__(self, dimension: int) -> None:
        self.dimension = dimension
        self.document_ids: list[str] = []
        self.expires: list[str | None] = []
        self._unit: npt.NDArray[np.float32] = np.zeros((0, dimension), dtype=np.float32)  # grows by doubling
        # How many rows of `_unit` are written, shared by the scopes sharing it (`extended`): one list per buffer.
        self._filled = [0]
        self.has_vec: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)
        self.dl: npt.NDArray[np.float64] = np.zeros(0, dtype=np.float64)
        self.scored: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)  # False: lends context, never ranked
        self.terms = PackedTerms.none()
        self.check = Check(0, 0, 0)
        self.read_at = time.monotonic()

    def __len__(self) -> int:
        return len(self.document_ids)

    @property
    def nbytes(self) -> int:
        """Bytes of the numpy arrays held (the vectors' spare room included)."""
        return self._unit.nbytes + self.has_vec.nbytes + self.dl.nbytes + self.scored.nbytes + self.terms.nbytes

    @property
    def unit(self) -> npt.NDArray[np.float32]:
        """The facts' vectors, normalised (zeros where a fact has none)."""
        return self._unit[: len(self)]

    def append(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Rows of `SCOPE_ROWS_AFTER` (id, expires_at, seq, vector bytes, dl, terms, scored), in storing order."""
        if not rows:
            return
        rows = context_kept(rows, seq_at=2, scored_at=6)
        n, m = len(self), len(rows)
        if n + m > self._unit.shape[0] or self._filled[0] != n:  # no room, or rows past ours are another's
            # Room for as many again as the rows, not twice the buffer: a copy made because rows past ours are
            # another scope's (`extended`) may come with every extension, and must not double it each time.
            grown = np.zeros((max(2 * (n + m), 64), self.dimension), dtype=np.float32)
            grown[:n] = self._unit[:n]
            self._unit, self._filled = grown, [n]
        self._filled[0] = n + m
        size = 4 + 4 * self.dimension  # vector_send: 4 header bytes, then the floats
        blobs = [r[3] for r in rows]
        has = np.fromiter((b is not None and len(b) == size for b in blobs), bool, m)
        if has.any():
            # One buffer for all: the header reads as one more float per row, dropped.
            raw = np.frombuffer(b"".join(b for b, h in zip(blobs, has.tolist(), strict=True) if h), dtype=">f4")
            vectors = raw.reshape(-1, self.dimension + 1)[:, 1:].astype(np.float32)
            norms = np.linalg.norm(vectors, axis=1)
            at = np.flatnonzero(has)
            has[at[norms == 0]] = False
            self._unit[n + at[norms > 0]] = vectors[norms > 0] / norms[norms > 0, None]
        self.document_ids.extend(str(r[0]) for r in rows)
        self.expires.extend(r[1] for r in rows)
        self.has_vec = np.concatenate([self.has_vec, has])
        self.dl = np.concatenate([self.dl, np.fromiter((float(r[4]) for r in rows), np.float64, m)])
        self.scored = np.concatenate([self.scored, np.fromiter((bool(r[6]) for r in rows), bool, m)])
        self.terms = self.terms.extended(PackedTerms([r[5] for r in rows]))

    def extended(self, rows: Sequence[tuple[Any, ...]]) -> HeldScope:
        """A new scope: these rows, then ``rows`` (as `append` takes them); this one is left as it is, so it
        can be ranked meanwhile. The vectors' buffer is shared while it has room past this scope's rows that
        no other scope has written (`_filled`), else copied; callers extending one scope from two threads hold
        a lock of their own (`scope_memo.ScopeMemo.written`)."""
        new = HeldScope.__new__(HeldScope)  # every field set here or by `append`: none of __init__'s arrays
        new.dimension = self.dimension
        new.document_ids, new.expires = list(self.document_ids), list(self.expires)
        new._unit, new._filled = self._unit, self._filled
        new.has_vec, new.dl, new.scored, new.terms = self.has_vec, self.dl, self.scored, self.terms
        new.check, new.read_at = self.check, self.read_at
        new.append(rows)  # replaces the arrays it extends (never writes into them) and writes vectors past ours
        return new

    def head(self, n: int) -> HeldScope:
        """A new scope of these rows' first ``n`` (this one itself when that is all of them), this one left as it
        is, for `extended` (its lexemes indexed when these are: `PackedTerms.head`). It shares the vectors'
        buffer: extending it copies them first, since rows past its own are this one's (`_filled`)."""
        if n == len(self):
            return self
        new = HeldScope(self.dimension)
        new.document_ids, new.expires = self.document_ids[:n], self.expires[:n]
        new._unit, new._filled = self._unit, self._filled
        new.has_vec, new.dl, new.scored = self.has_vec[:n], self.dl[:n], self.scored[:n]
        new.terms = self.terms.head(n)
        new.check, new.read_at = self.check, self.read_at
        return new

    def drop(self, document_ids: set[str]) -> None:
        """Forget these facts (they left the scope)."""
        keep = np.fromiter((d not in document_ids for d in self.document_ids), bool, len(self))
        self._unit = self.unit[keep]
        self._filled = [len(self._unit)]
        flags = keep.tolist()
        self.document_ids = [d for d, k in zip(self.document_ids, flags, strict=True) if k]
        self.expires = [e for e, k in zip(self.expires, flags, strict=True) if k]
        self.has_vec, self.dl, self.scored = self.has_vec[keep], self.dl[keep], self.scored[keep]
        self.terms = self.terms.take(keep).index()

    def rank(
        self,
        embedding: Sequence[float] | npt.NDArray[np.float32] | None,
        query_terms: Sequence[int],
        ranking: RankingParams,
        boost_terms: Sequence[int] = (),
    ) -> list[RankedFact]:
        """`rank_scope` over the rows held, as the exact path ranks the scope's rows (cosines computed here)."""
        n = len(self)
        cos: npt.NDArray[np.float64]
        if embedding is not None and n:
            q = np.asarray(embedding, dtype=np.float32)
            norm = float(np.linalg.norm(q))
            # einsum, not `@`: a product this size makes OpenBLAS wake its threads, which then fight the query
            # embedder's for the cores and lengthen recall's tail latency.
            cos = np.einsum("ij,j->i", self.unit, q / norm).astype(np.float64) if norm > 0 else np.zeros(n)
            cos = np.where(self.has_vec, cos, np.nan)
        else:
            cos = np.full(n, np.nan)
        scored = None if self.scored.all() else self.scored.tolist()
        return rank_scope(cos, self.dl, self.terms, query_terms, ranking, scored=scored, boost_terms=boost_terms)


class ScopeCache:
    """Held scopes of one process, least recently used first out, at most ``max_facts`` facts in all.

    Thread-safe: a scope is read, refreshed and ranked under its stripe's lock (recalls of one scope wait
    for one read instead of each doing it; `LOCK_STRIPES` locks for all scopes), the table of scopes under
    its own lock."""

    def __init__(self, max_facts: int, dimension: int) -> None:
        self.max_facts = max_facts
        self.dimension = dimension
        self._scopes: OrderedDict[tuple[str, str], HeldScope] = OrderedDict()
        self._stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self._lock = threading.Lock()
        #: This cache's full reads, appends, and facts dropped when their text fetch refused them (the
        #: process-wide counts the metrics pop are kept apart, by `_note`: caches come and go with repositories).
        self.full_reads = 0
        self.appends = 0
        self.dropped = 0
        _caches.add(self)

    def lock_for(self, key: tuple[str, str]) -> threading.Lock:
        """The lock of ``key``'s stripe: a fixed set, so that no lock is ever replaced while held."""
        return self._stripes[hash(key) % len(self._stripes)]

    def entries(self) -> list[HeldScope]:
        """The scopes held now (a snapshot; for metrics)."""
        with self._lock:
            return list(self._scopes.values())

    def held(self, key: tuple[str, str]) -> HeldScope | None:
        with self._lock:
            entry = self._scopes.get(key)
            if entry is not None:
                self._scopes.move_to_end(key)
            return entry

    def drop_facts(self, key: tuple[str, str], document_ids: set[str]) -> None:
        """These facts of a held scope left it (seen when their text was fetched): rank without them."""
        with self.lock_for(key):
            entry = self.held(key)
            if entry is not None and document_ids:
                before = len(entry)
                entry.drop(document_ids)
                self.dropped += before - len(entry)
                _note("dropped", before - len(entry))

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._scopes.pop(key, None)

    def keep(self, key: tuple[str, str], entry: HeldScope) -> bool:
        """Hold ``entry``, evicting the least recently used scopes for room; False when it cannot fit."""
        if len(entry) > self.max_facts:
            self.forget(key)
            return False
        with self._lock:
            self._scopes[key] = entry
            self._scopes.move_to_end(key)
            total = sum(len(e) for e in self._scopes.values())
            while total > self.max_facts and len(self._scopes) > 1:
                _, old = self._scopes.popitem(last=False)
                total -= len(old)
        return True

    @contextmanager
    def use(
        self, cur: psycopg.Cursor[Any], statements: Statements, params: dict[str, Any], now: Check
    ) -> Iterator[HeldScope | None]:
        """The scope of ``params`` (`FactRepository._scope` plus ``language``), brought up to date and held
        under the scope's lock while the caller ranks it; None when it does not fit in the cache.
        ``cur``: a binary cursor of the recall's connection; ``now``: `SCOPE_CHECK` as the caller just ran it
        (in the round trip of the query's lexemes)."""
        key = (str(params["org_id"]), str(params["assignment_id"]))
        with self.lock_for(key):
            entry = self.held(key)
            if now.count > self.max_facts:
                self.forget(key)
                yield None
                return
            if entry is not None and time.monotonic() - entry.read_at > FULL_READ_S:
                entry = None
            if entry is not None and now != entry.check:
                entry = self._append(cur, statements, params, entry)
            if entry is None:
                entry = self._read(cur, statements, params)
            yield entry if self.keep(key, entry) else None

    def _read(self, cur: psycopg.Cursor[Any], statements: Statements, params: dict[str, Any]) -> HeldScope:
        entry = HeldScope(self.dimension)
        rows = cur.execute(statements.rows_after, {**params, "after": 0}).fetchall()
        entry.check = Check(int(rows[0][0]), int(rows[0][1]), int(rows[0][2]))  # one row at least (c, a)
        entry.append([r[5:] for r in rows if r[5] is not None])
        self.full_reads += 1
        _note("full_reads")
        return entry

    def _append(
        self, cur: psycopg.Cursor[Any], statements: Statements, params: dict[str, Any], entry: HeldScope
    ) -> HeldScope | None:
        """Append what was added past the highest seq held; None when the scope changed otherwise."""
        rows = cur.execute(statements.rows_after, {**params, "after": entry.check.seq_max}).fetchall()
        now = Check(int(rows[0][0]), int(rows[0][1]), int(rows[0][2]))
        added, added_sum = int(rows[0][3]), int(rows[0][4])
        # Only appends: the rows up to the highest seq held are as many, with the same seqs, as when read.
        if now.count - added != entry.check.count or now.seq_sum - added_sum != entry.check.seq_sum:
            return None
        entry.append([r[5:] for r in rows if r[5] is not None])
        entry.check = now
        self.appends += 1
        _note("appends")
        return entry
