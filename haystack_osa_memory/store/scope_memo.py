"""A small assignment's recall rows, and the text a recall returns of them, kept in process memory while a
print of them, read with each recall's query terms, says they are what the exact path would read.

The exact path (`candidates.SCOPE_ROWS`) reads a whole scope on every recall: its governing rows, and for each
its recall row's vector, length and packed lexemes; then the text, metadata and timestamps of the facts it
returns (`candidates.SCOPE_FACTS`). Most of that is the same from one recall to the next, and reading it is
most of a lexical recall's PostgreSQL time. So a recall of the usual kind (the facts' audience, the admitted
statuses, valid now: `ScopeQuery.held_kind`) on a scope of at most `big_scope.EXACT_SCOPE_MAX` facts reads, in
the round trip of its query's lexemes, the scope's **print** (`MEMO_PRINT`): for the governing rows the exact
path would read, for the scope's recall rows and for those facts' chunks, how many there are and the sum of a
64-bit hash of each one's id and version (`xmin`: every write makes a new one). While the print is the one the
rows were read with (`MEMO_ROWS`, print, rows and text from one snapshot), they are ranked from memory
(`scope_cache.HeldScope.rank`, the ranking the exact path runs) and the facts returned carry their text
(`candidates.ScopeHit.detail`): the print this recall matched is the scope's check, and nothing more is read.
When it is not, the recall takes the exact path, and the rows are read again once two prints in a row agree
(`MAX_SKIPS`).

Facts stored after the rows were read (by this process or another) join them: the print's statement reads, with
it, the facts whose storing order (``seq``) is past the rows kept, through the scope index of their recall rows
(none, most of the time), each with what `MEMO_ROWS` reads of it and the hashes its rows add to the print. When
the print is the kept one plus theirs, they are appended to the rows kept, which then answer. So a store's search
for the facts it may replace, which follows its write, reads no more than that; a change of any other kind (a fact
forgotten, approved, superseded, rewritten, past its validity, or stored late with a lower ``seq``) does not add up,
and the recall takes the exact path.

Unlike the big scopes' check (`scope_cache.SCOPE_CHECK`), the print applies the scope's whole condition at
recall time: a fact stored, approved, retired, superseded or past its validity, a governing row's expiry,
status or metadata changed, a recall row rewritten in place (lexemes inherited by a successor, a fact stored
again with a new vector), a chunk's text rewritten (even with the trigger that drops its recall row switched
off) all change it, so the answer is always the exact path's. A scope holding a fact without a usable recall
row (written by other tools: the exact path tokenises its text at query time, packing only the query's
lexemes) or without its own chunk is noted as such and takes the exact path. The scope is a condition of every
statement, and the rows are kept by org and assignment; metadata is handed out as a copy
(`candidates.kept_details`).

Usage:
```python
memo = ScopeMemo(max_facts=12_000, dimension=384)
route = memo.route(("acme", "a1"))        # "print": read `MEMO_PRINT` with the query's terms, then
now = Print.of(*row[2:])                   # its last `PRINT_COLUMNS` columns
kept = memo.current(("acme", "a1"), now) if route == "print" else route
if kept == "rows":
    kept = memo.read(cursor, statement, params)
if isinstance(kept, Kept) and kept.scope is not None:  # else: the exact path
    ranked = kept.scope.rank(query_embedding, query_terms, ranking)
```
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from typing import Any, Literal

import psycopg
from psycopg import sql

from haystack_osa_memory.store.candidates import Detail, scope_governing_rows
from haystack_osa_memory.store.scope_cache import HeldScope

#: Facts of small assignments each process keeps (~3.9 kB each with 384-d vectors, their text and metadata),
#: least recently used out first; never more than `MemoryConfig.scope_cache_facts`, and none when that is 0.
MEMO_MAX_FACTS = 12_000

# The rows the exact path reads (`candidates.SCOPE_GOVERNING_ROWS`: the same condition), each with its version:
# the print reads nothing else of them; read with the rows, also the columns a recall returns
# (`candidates.SCOPE_FACTS`' metadata and timestamps).
_SCOPE = sql.SQL("m AS MATERIALIZED ({governing_rows})")
_VERSION = sql.SQL("g.id AS document_id, g.xmin::text AS version")  # all the print reads of a row
_VERSION_AND_DETAILS = sql.SQL(", g.xmin::text AS version, g.metadata, g.updated_at")
# The scope's recall rows (those the scope index of `osa_fact_terms` finds, `ddl.SCOPE_SEQ_INDEX`), each with
# its version and the columns named in ``columns``. A fact's recall row outside them (its scope columns not
# the governing row's) is one the kept rows do without: the scope then takes the exact path.
_RECALL_ROWS = sql.SQL(
    """r AS MATERIALIZED (
    SELECT t.document_id, t.xmin::text AS version{columns} FROM {schema}.osa_fact_terms t
    WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s
)"""
)
# The chunks of the scope's facts (the chunk whose id is the fact's, as the writer stores it), each with its
# version and the columns named in ``columns``: the text a recall returns is kept with the rows, so a chunk
# rewritten in place changes the print too. Probed by primary key, one fact at a time (a fenced LATERAL, as
# `candidates.SCOPE_FACTS` reads them): joined freely, the planner may hash the whole chunk table.
_CHUNKS = sql.SQL(
    """c AS MATERIALIZED (
    SELECT c.document_id, c.version{columns} FROM m,
        LATERAL (SELECT c.id AS document_id, c.xmin::text AS version, c.content, c.meta FROM {schema}.{chunk} c
                 WHERE c.id = m.document_id OFFSET 0) c
)"""
)
# How many rows ``{rows}`` holds and the sum of a hash of each one's id and version (a write makes a new one).
_PRINT = sql.SQL(
    "SELECT count(*), coalesce(sum(hashtextextended(x.document_id || '/' || x.version, 0)::numeric), 0) FROM {rows} x"
)
# The print alone (the governing rows', the recall rows', the chunks'), with the query's terms
# (`recall_rows.QUERY_TERMS`) in the same round trip, and the facts stored after the rows kept (``after``: their
# last ``seq``), found through the scope index of their recall rows (none, most of the time): each with the
# columns `MEMO_ROWS` reads and the hashes its three rows add to the print. When the print is the kept one plus
# theirs, they join the rows kept (`ScopeMemo.current`): another process's store is caught up on. Each governing
# row is probed by primary key behind a fence, the scope's conditions outside it (`scope_cache.GOVERNING_ROW_BY_ID`).
_AFTER = sql.SQL(
    """SELECT g.id, g.metadata->>'expires_at', g.seq, vector_send(t.embedding), t.dl::float8, t.terms,
       g.status = ANY(%(statuses)s),
       (t.content_hash = g.content_hash AND t.language = %(language)s::text AND t.terms IS NOT NULL
        AND c.meta->>'document_id' IS NOT DISTINCT FROM g.id),
       c.content, g.metadata, g.created_at, g.updated_at,
       hashtextextended(g.id || '/' || g.version, 0), hashtextextended(t.document_id || '/' || t.xmin::text, 0),
       hashtextextended(c.id || '/' || c.version, 0)
FROM {schema}.osa_fact_terms t,
     LATERAL (SELECT g.id, g.seq, g.audience, g.status, g.content_hash, g.metadata, g.created_at, g.updated_at,
                     g.xmin::text AS version
              FROM {schema}.{gov} g WHERE g.id = t.document_id AND g.org_id = %(org_id)s OFFSET 0) g
     LEFT JOIN LATERAL (SELECT c.id, c.xmin::text AS version, c.content, c.meta FROM {schema}.{chunk} c
                        WHERE c.id = g.id OFFSET 0) c ON true
WHERE t.org_id = %(org_id)s AND t.assignment_id = %(assignment_id)s AND t.seq > %(after)s::bigint
  AND g.audience = ANY(%(audiences)s) AND g.status = ANY(%(read_statuses)s)
  AND g.metadata->>'assignment_id' = %(assignment_id)s AND g.seq > %(after)s::bigint AND {valid_at}
ORDER BY g.seq, g.created_at, g.id"""
)
MEMO_PRINT = sql.SQL(
    """SELECT q.*, p.*, a.*
FROM ({query_terms}) q(lexemes, hashes),
     (WITH {scope}, {recall_rows}, {chunks}
      SELECT pm.*, pr.*, pc.* FROM ({print_m}) pm, ({print_r}) pr, ({print_c}) pc) p
     LEFT JOIN LATERAL ({after}) a ON true"""
)
#: Columns of `MEMO_PRINT` before the facts stored after the rows kept: the query's terms and the print.
PRINT_AND_TERMS_COLUMNS = 8
# The print and the rows, from one snapshot, in the exact path's order, with what a recall returns of each
# fact (`candidates.SCOPE_FACTS`' columns). ``usable``: the fact's recall row is among the scope's and is the
# one the exact path would rank (same content hash and language, lexemes packed), and its chunk is its own.
MEMO_ROWS = sql.SQL(
    """WITH {scope}, {recall_rows}, {chunks}
SELECT pm.*, pr.*, pc.*, m.document_id, m.expires_at, m.seq, vector_send(r.embedding), r.dl::float8, r.terms,
       m.scored,
       (r.document_id IS NOT NULL AND r.recall_hash = m.content_hash AND r.language = %(language)s::text
        AND r.terms IS NOT NULL AND c.meta->>'document_id' IS NOT DISTINCT FROM m.document_id) AS usable,
       c.content, m.metadata, m.created_at, m.updated_at
FROM ({print_m}) pm, ({print_r}) pr, ({print_c}) pc
    LEFT JOIN (m LEFT JOIN r ON r.document_id = m.document_id LEFT JOIN c ON c.document_id = m.document_id) ON true
ORDER BY m.seq, m.created_at, m.document_id"""
)
_RECALL_COLUMNS = sql.SQL(", t.content_hash AS recall_hash, t.language, t.embedding, t.dl, t.terms")
_CHUNK_COLUMNS = sql.SQL(", c.content, c.meta")
#: Columns of `MEMO_ROWS` before a fact's own: the print's.
PRINT_COLUMNS = 6


@dataclass(frozen=True)
class Statements:
    """The memo's two statements for one configuration (composed once by the repository)."""

    print: sql.Composed
    rows: sql.Composed

    @classmethod
    def compose(
        cls, names: dict[str, sql.Identifier], valid_at: sql.Composable, query_terms: sql.Composable
    ) -> Statements:
        prints = {name: _PRINT.format(rows=sql.SQL(name[-1])) for name in ("print_m", "print_r", "print_c")}
        return cls(
            print=MEMO_PRINT.format(
                scope=_SCOPE.format(governing_rows=scope_governing_rows(names, valid_at, only=_VERSION)),
                recall_rows=_RECALL_ROWS.format(columns=sql.SQL(""), **names),
                chunks=_CHUNKS.format(columns=sql.SQL(""), **names),
                query_terms=query_terms,
                after=_AFTER.format(valid_at=valid_at, **names),
                **prints,
            ),
            rows=MEMO_ROWS.format(
                scope=_SCOPE.format(governing_rows=scope_governing_rows(names, valid_at, _VERSION_AND_DETAILS)),
                recall_rows=_RECALL_ROWS.format(columns=_RECALL_COLUMNS, **names),
                chunks=_CHUNKS.format(columns=_CHUNK_COLUMNS, **names),
                **prints,
            ),
        )


@dataclass(frozen=True)
class Print:
    """A scope's print (`MEMO_PRINT`): how many governing rows the exact path would read and their hashes
    summed, and the same of the scope's recall rows and of its facts' chunks."""

    facts: int
    facts_total: int
    recall_rows: int
    recall_total: int
    chunks: int
    chunks_total: int

    @classmethod
    def of(cls, *columns: Any) -> Print:
        """From the print's `PRINT_COLUMNS` columns."""
        return cls(*(int(c) for c in columns))

    def __add__(self, other: Print) -> Print:
        return Print(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@dataclass(frozen=True)
class Kept:
    """A scope's rows as read at ``print``, and what a recall returns of each fact (``details``, by id);
    ``scope`` None when one lacks a usable recall row or chunk (``unusable``: the exact path reads the chunk
    fallback too, `candidates.SCOPE_ROWS`) or when they are too many to keep (exact path)."""

    print: Print
    scope: HeldScope | None
    details: dict[str, Detail] = field(default_factory=dict)
    unusable: bool = False
    #: The greatest storing order (``seq``) among the rows; None when there are none.
    last_seq: int | None = None

    def __len__(self) -> int:
        return len(self.scope) if self.scope is not None else 0


#: `ScopeMemo.after` when no row is kept: below every storing order.
NO_SEQ = -(2**63)


def _caught_up(kept: Kept, now: Print, stored_after: Sequence[tuple[Any, ...]]) -> Kept | None:
    """``kept`` with the facts ``stored_after`` it, when the print they make together is ``now`` and each of them
    can be ranked from memory (its recall row usable, its chunk its own); else None."""
    if not stored_after or kept.scope is None:
        return None
    if not all(r[7] and r[13] is not None and r[14] is not None for r in stored_after):
        return None
    if any(r[0] in kept.details for r in stored_after):
        return None
    n = len(stored_after)
    gained = Print(
        n, sum(r[12] for r in stored_after), n, sum(r[13] for r in stored_after), n, sum(r[14] for r in stored_after)
    )
    if kept.print + gained != now:
        return None
    return Kept(
        now,
        kept.scope.extended([r[:7] for r in stored_after]),
        {**kept.details, **{r[0]: r[8:12] for r in stored_after}},
        last_seq=stored_after[-1][2],
    )


#: After a recall finds its scope changed since its rows were read, it takes the exact path, and so do the next
#: 1, 2, 4, ... up to this many recalls of it; the rows are read again only when two prints in a row agree. A
#: scope written between most of its recalls (an agent storing facts, each store searching the facts it may
#: replace) would otherwise pay for a print that never matches and for rows kept for no recall.
MAX_SKIPS = 16


#: Seconds a scope holding a fact without a usable recall row (or too big to keep) takes the exact path before
#: it is read again.
UNUSABLE_RECHECK_S = 30.0

#: How a recall reads its scope (`ScopeMemo.route`).
Route = Literal["print", "rows", "exact"]


@dataclass
class _Entry:
    kept: Kept
    read_at: float = field(default_factory=time.monotonic)
    skips: int = 0  # recalls still to skip the print
    streak: int = 0  # changes found in a row
    seen: Print | None = None  # the print last found changed


class ScopeMemo:
    """Small scopes' rows of one process, least recently used first out, at most ``max_facts`` facts in all.

    Thread-safe: kept rows are never changed (a changed scope is read into a new `Kept`), so recalls rank them
    without a lock; the table of scopes has its own."""

    def __init__(self, max_facts: int, dimension: int) -> None:
        self.max_facts = max_facts
        self.dimension = dimension
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._facts = 0
        self._lock = threading.Lock()
        #: Scopes read, recalls answered from the rows kept, prints that found the scope changed, and facts
        #: stored after the rows kept that joined them when a print found them (`current`).
        self.reads = 0
        self.hits = 0
        self.changed = 0
        self.caught_up = 0

    def route(self, key: tuple[str, str]) -> Route:
        """How a recall of ``key`` reads its scope: ``print`` (rows are kept: read the print with the query's
        terms), ``rows`` (none kept: read them with their print), or ``exact`` (`candidates.SCOPE_ROWS`: the
        scope changes between most recalls, `MAX_SKIPS`; or it holds a fact without a usable recall row, or
        more facts than the memo has room for, looked at again after `UNUSABLE_RECHECK_S`)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return "rows"
            if entry.kept.scope is None:
                return "exact" if time.monotonic() - entry.read_at < UNUSABLE_RECHECK_S else "rows"
            if entry.skips > 0:
                entry.skips -= 1
                return "exact"
            return "print"

    def unusable(self, key: tuple[str, str]) -> bool:
        """Whether ``key`` was last read holding a fact without a usable recall row or chunk (`Kept.unusable`):
        its exact path reads the chunk fallback too (`candidates.SCOPE_ROWS`)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry is not None and entry.kept.unusable

    def after(self, key: tuple[str, str]) -> int:
        """The storing order (``seq``) past which `MEMO_PRINT` reads the facts stored after the rows kept."""
        with self._lock:
            entry = self._entries.get(key)
            last = entry.kept.last_seq if entry is not None else None
        return last if last is not None else NO_SEQ

    def current(
        self, key: tuple[str, str], now: Print, stored_after: Sequence[tuple[Any, ...]] = ()
    ) -> Kept | Literal["rows", "exact"]:
        """The rows kept for ``key`` if they were read at the print ``now``, or if ``now`` is their print plus
        what the facts ``stored_after`` them add (`MEMO_PRINT`'s columns past `PRINT_AND_TERMS_COLUMNS`): those
        join them first (another process stored them). Otherwise ``rows`` when the scope has not changed since
        the previous print found it changed (read the rows again: they are likely to be used), else ``exact``
        (take the exact path; the next recalls of ``key`` skip the print, `MAX_SKIPS`)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return "rows"
            caught_up = _caught_up(entry.kept, now, stored_after) if entry.kept.print != now else None
            if caught_up is not None:
                self._facts += len(caught_up) - len(entry.kept)
                entry.kept = caught_up
                self.caught_up += len(stored_after)
                self._evict()
                if key not in self._entries:
                    return caught_up
            if entry.kept.print == now:
                self._entries.move_to_end(key)
                entry.streak, entry.seen = 0, None
                self.hits += 1
                return entry.kept
            self.changed += 1
            if entry.seen == now:
                return "rows"
            entry.seen = now
            entry.streak = min(entry.streak + 1, MAX_SKIPS.bit_length())
            entry.skips = min(2 ** (entry.streak - 1), MAX_SKIPS)
            return "exact"

    def read(self, cur: psycopg.Cursor[Any], statement: sql.Composed | bytes, params: dict[str, Any]) -> Kept:
        """Read the scope of ``params`` (`FactRepository`'s scope parameters with ``language``) with
        `MEMO_ROWS` on ``cur`` (a binary cursor) and keep it when it fits."""
        rows = cur.execute(statement, params).fetchall()
        kept = self._kept_of(rows)
        self._keep((str(params["org_id"]), str(params["assignment_id"])), kept)
        return kept

    def _kept_of(self, rows: Sequence[tuple[Any, ...]]) -> Kept:
        at = PRINT_COLUMNS
        printed = Print.of(*rows[0][:at])  # the print's row joins every row (and stands alone if none)
        facts = [r for r in rows if r[at] is not None]
        if not all(r[at + 7] for r in facts):
            return Kept(printed, None, unusable=True)
        scope = HeldScope(self.dimension)
        scope.append([r[at : at + 7] for r in facts])
        last_seq = max((r[at + 2] for r in facts if r[at + 2] is not None), default=None)
        return Kept(printed, scope, {r[at]: r[at + 8 : at + 12] for r in facts}, last_seq=last_seq)

    def _keep(self, key: tuple[str, str], kept: Kept) -> None:
        with self._lock:
            self.reads += 1
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._facts -= len(entry.kept)
            if len(kept) > self.max_facts:
                kept = Kept(kept.print, None)  # too big to keep: the exact path, looked at again later
            if entry is None:
                entry = _Entry(kept)
            entry.kept, entry.read_at, entry.seen = kept, time.monotonic(), None
            self._entries[key] = entry
            self._facts += len(kept)
            self._evict()

    def _evict(self) -> None:
        while self._facts > self.max_facts:  # under the lock
            _, gone = self._entries.popitem(last=False)
            self._facts -= len(gone.kept)
