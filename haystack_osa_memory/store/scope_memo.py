"""A small assignment's recall rows, and the text a recall returns of them, kept in process memory while a
print of them, read with each recall's query terms, says they are what the exact path would read.

The exact path (`candidates.SCOPE_ROWS`) reads a whole scope on every recall: its governing rows, and for each
its recall row's vector, length and packed lexemes; then the text, metadata and timestamps of the facts it
returns (`candidates.SCOPE_FACTS`). Most of that is the same from one recall to the next, and reading it is
most of a lexical recall's PostgreSQL time. So a recall of the usual kind (the facts' audience, the admitted
statuses, valid now: `ScopeQuery.held_kind`) on a scope of at most `big_scope.EXACT_SCOPE_MAX` facts reads, in
the round trip of its query's lexemes, the scope's **print** (`MEMO_PRINT`): for the governing rows the exact
path would read whenever they hold (its condition but for the validity), for the scope's recall rows and for
those facts' chunks, how many there are and the sum of a 64-bit hash of each one's id and version (`xmin`:
every write makes a new one), and the recall's time. The rows are read with their print and each one's
validity (`MEMO_ROWS`, print, rows and text from one snapshot); those that hold at the read's time are kept,
with the **window** until one of the scope's rows starts or stops holding (`Kept.window`). While the print is
the one the rows were read with and the recall's time is in the window, they are ranked from memory
(`scope_cache.HeldScope.rank`, the ranking the exact path runs) and the facts returned carry their text
(`candidates.ScopeHit.detail`): the print this recall matched is the scope's check, and nothing more is read.
(Reading every row's validity from its metadata was a third of a print's time.) When it is not, the recall
reads the facts stored since the rows were read (`MEMO_SINCE`: the facts past the
rows' last `seq`, each with the hashes it adds to the print). If the print is the rows' plus those facts'
(nothing else changed: the usual change when two processes serve one agent's stores), the rows kept are caught
up with them (`ScopeMemo.caught_up`) and rank the recall. Otherwise it takes the exact path, and the rows are
read again once two prints in a row agree (`MAX_SKIPS`).

A fact this process writes joins the rows kept (`ScopeMemo.written`): the statement that writes it returns its
version's hash and its recall row (`fact_writing.WrittenRow`), and the rows kept take it at the print they
make with it. So a store's search for the facts it may replace, which follows its write, reads the print alone
instead of the whole scope and the text of the facts it finds. Nothing is taken on trust: if anything else
changed the scope since its rows were read (another process's write), or the fact is not in it as written, the
next print does not match; if a fact started or stopped holding, or the new one does not hold yet, the window
does not: that recall catches up or takes the exact path.

Unlike the big scopes' check (`scope_cache.SCOPE_CHECK`), the print and the window apply the scope's whole
condition at recall time: a fact stored, approved, retired or superseded, a governing row's expiry, validity,
status or metadata changed, a recall row rewritten in place (lexemes inherited by a successor, a fact stored
again with a new vector), a chunk's text rewritten (even with the trigger that drops its recall row switched
off) all change the print, and a fact's validity beginning or ending while nothing is written ends the window,
so the answer is always the exact path's. A scope holding a fact without a usable recall
row (written by other tools: the exact path tokenises its text at query time, packing only the query's
lexemes) or without its own chunk is noted as such and takes the exact path. The scope is a condition of every
statement, and the rows are kept by org and assignment; metadata is handed out as a copy
(`candidates.kept_details`).

Usage:
```python
memo = ScopeMemo(max_facts=12_000, dimension=384)
route = memo.route(("acme", "a1"))        # "print": read `MEMO_PRINT` with the query's terms, then
now, at = Print.of(*row[2:8]), row[8]      # its `PRINT_COLUMNS` columns and the recall's time
kept = memo.current(("acme", "a1"), now, at) if route == "print" else route
if kept == "rows":
    kept = memo.read(cursor, statement, params)
if isinstance(kept, Kept) and kept.scope is not None:  # else: the exact path
    ranked = kept.scope.rank(query_embedding, query_terms, ranking)
```
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import psycopg
from psycopg import sql

from haystack_osa_memory.store.candidates import Detail, scope_governing_rows
from haystack_osa_memory.store.scope_cache import HeldScope
from haystack_osa_memory.store.scope_query import VALID_FROM, VALID_TO

#: Facts of small assignments each process keeps (~3.9 kB each with 384-d vectors, their text and metadata),
#: least recently used out first; never more than `MemoryConfig.scope_cache_facts`, and none when that is 0.
MEMO_MAX_FACTS = 12_000

# The rows the exact path reads (`candidates.SCOPE_GOVERNING_ROWS`: the same condition) but for their validity,
# each with its version: the print reads nothing else of them; read with the rows, also the columns a recall
# returns (`candidates.SCOPE_FACTS`' metadata and timestamps) and when each holds (`VALIDITY`). Reading each
# row's validity (its metadata's text made a `timestamptz`) was a third of a print's time on a scope of 375
# facts: the rows kept carry theirs instead (`Kept.window`).
_SCOPE = sql.SQL("m AS MATERIALIZED ({governing_rows})")
_VERSION = sql.SQL("g.id AS document_id, g.xmin::text AS version")  # all the print reads of a row


def microseconds(time: sql.Composable) -> sql.Composed:
    """The `timestamptz` expression ``time`` as microseconds since the epoch, a `float8` (exact: a whole number
    below 2**53; ``infinity`` is ``inf``)."""
    return sql.SQL("(extract(epoch FROM {time}) * 1000000)::float8").format(time=time)


#: A governing row's validity (`scope_query.VALID_AT`'s bounds) in `microseconds`: it holds at ``t`` when
#: ``valid_from_us <= t < valid_to_us``.
VALIDITY = sql.SQL("{valid_from} AS valid_from_us, {valid_to} AS valid_to_us").format(
    valid_from=microseconds(VALID_FROM), valid_to=microseconds(VALID_TO)
)
#: The time a recall of the usual kind asks the facts to hold at (``now``: the transaction's), in `microseconds`.
_AT = microseconds(sql.SQL("%(valid_at)s::timestamptz"))
_VERSION_AND_DETAILS = sql.SQL(", g.xmin::text AS version, g.metadata, g.updated_at, {validity}").format(
    validity=VALIDITY
)
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
# rewritten in place changes the print too. Read by primary key, all ids in one array: joined freely, the
# planner may hash the whole chunk table; the array is one index scan, where a probe per fact (a fenced
# LATERAL) walked the index from its root for each one.
_CHUNKS = sql.SQL(
    """c AS MATERIALIZED (
    SELECT c.id AS document_id, c.xmin::text AS version{columns} FROM {schema}.{chunk} c
    WHERE c.id = ANY(ARRAY(SELECT m.document_id FROM m))
)"""
)
# How many rows ``{rows}`` holds and the sum of a hash of each one's id and version (a write makes a new one).
_PRINT = sql.SQL(
    "SELECT count(*), coalesce(sum(hashtextextended(x.document_id || '/' || x.version, 0)::numeric), 0) FROM {rows} x"
)
# The print alone (the governing rows', the recall rows', the chunks'), with the query's terms
# (`recall_rows.QUERY_TERMS`) in the same round trip, and the time the facts must hold at.
MEMO_PRINT = sql.SQL(
    """SELECT q.*, p.*, {at}
FROM ({query_terms}) q(lexemes, hashes),
     (WITH {scope}, {recall_rows}, {chunks}
      SELECT pm.*, pr.*, pc.* FROM ({print_m}) pm, ({print_r}) pr, ({print_c}) pc) p"""
)
# The print and the rows, from one snapshot, in the exact path's order, with what a recall returns of each
# fact (`candidates.SCOPE_FACTS`' columns) and its validity, then the time the facts must hold at. ``usable``:
# the fact's recall row is among the scope's and is the one the exact path would rank (same content hash and
# language, lexemes packed), and its chunk is its own.
MEMO_ROWS = sql.SQL(
    """WITH {scope}, {recall_rows}, {chunks}
SELECT pm.*, pr.*, pc.*, m.document_id, m.expires_at, m.seq, vector_send(r.embedding), r.dl::float8, r.terms,
       m.scored,
       (r.document_id IS NOT NULL AND r.recall_hash = m.content_hash AND r.language = %(language)s::text
        AND r.terms IS NOT NULL AND c.meta->>'document_id' IS NOT DISTINCT FROM m.document_id) AS usable,
       c.content, m.metadata, m.created_at, m.updated_at, m.valid_from_us, m.valid_to_us, {at}
FROM ({print_m}) pm, ({print_r}) pr, ({print_c}) pc
    LEFT JOIN (m LEFT JOIN r ON r.document_id = m.document_id LEFT JOIN c ON c.document_id = m.document_id) ON true
ORDER BY m.seq, m.created_at, m.document_id"""
)
# The facts of the scope stored past ``since`` (their `seq`), with `MEMO_ROWS`' columns, the hashes each adds
# to the print and its validity: what other processes stored since the rows kept were read. Their recall rows
# (with the scope's condition the print's have) and chunks are read by primary key, one fact at a time (fenced
# LATERALs: never joined freely, see `_CHUNKS`; they are few).
MEMO_SINCE = sql.SQL(
    """SELECT m.document_id, m.expires_at, m.seq, vector_send(t.embedding), t.dl::float8, t.terms, m.scored,
       (t.document_id IS NOT NULL AND t.recall_hash = m.content_hash AND t.language = %(language)s::text
        AND t.terms IS NOT NULL AND k.meta->>'document_id' IS NOT DISTINCT FROM m.document_id) AS usable,
       k.content, m.metadata, m.created_at, m.updated_at,
       hashtextextended(m.document_id || '/' || m.version, 0),
       hashtextextended(t.document_id || '/' || t.version, 0),
       hashtextextended(k.document_id || '/' || k.version, 0), m.valid_from_us, m.valid_to_us
FROM ({governing_rows}) m
    LEFT JOIN LATERAL (SELECT t.document_id, t.xmin::text AS version{recall_columns}
                       FROM {schema}.osa_fact_terms t
                       WHERE t.document_id = m.document_id AND t.org_id = %(org_id)s
                         AND t.assignment_id = %(assignment_id)s OFFSET 0) t ON true
    LEFT JOIN LATERAL (SELECT k.id AS document_id, k.xmin::text AS version, k.content, k.meta
                       FROM {schema}.{chunk} k WHERE k.id = m.document_id OFFSET 0) k ON true
WHERE m.seq > %(since)s::bigint
ORDER BY m.seq, m.created_at, m.document_id"""
)
_RECALL_COLUMNS = sql.SQL(", t.content_hash AS recall_hash, t.language, t.embedding, t.dl, t.terms")
_CHUNK_COLUMNS = sql.SQL(", c.content, c.meta")
#: Columns of `MEMO_ROWS` before a fact's own: the print's.
PRINT_COLUMNS = 6
# Where `MEMO_ROWS`' rows (past `PRINT_COLUMNS`) and `MEMO_SINCE`'s hold a fact's validity.
_ROWS_VALIDITY = 12
_SINCE_VALIDITY = 15


@dataclass(frozen=True)
class Statements:
    """The memo's statements for one configuration (composed once by the repository)."""

    print: sql.Composed
    rows: sql.Composed
    since: sql.Composed

    @classmethod
    def compose(cls, names: dict[str, sql.Identifier], query_terms: sql.Composable) -> Statements:
        prints = {name: _PRINT.format(rows=sql.SQL(name[-1])) for name in ("print_m", "print_r", "print_c")}
        # The scope's condition but for the validity: the rows kept carry theirs (`Kept.window`).
        any_time = sql.SQL("true")
        return cls(
            print=MEMO_PRINT.format(
                scope=_SCOPE.format(governing_rows=scope_governing_rows(names, any_time, only=_VERSION)),
                recall_rows=_RECALL_ROWS.format(columns=sql.SQL(""), **names),
                chunks=_CHUNKS.format(columns=sql.SQL(""), **names),
                query_terms=query_terms,
                at=_AT,
                **prints,
            ),
            rows=MEMO_ROWS.format(
                scope=_SCOPE.format(governing_rows=scope_governing_rows(names, any_time, _VERSION_AND_DETAILS)),
                recall_rows=_RECALL_ROWS.format(columns=_RECALL_COLUMNS, **names),
                chunks=_CHUNKS.format(columns=_CHUNK_COLUMNS, **names),
                at=_AT,
                **prints,
            ),
            since=MEMO_SINCE.format(
                governing_rows=scope_governing_rows(names, any_time, _VERSION_AND_DETAILS),
                recall_columns=_RECALL_COLUMNS,
                **names,
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

    @classmethod
    def of_new_fact(cls, version: int) -> Print:
        """What a new fact adds to its scope's print (whenever it holds): one governing row, recall row and
        chunk, all with its id and written by one statement (one version: ``version``, the hash the print
        sums)."""
        return cls(1, version, 1, version, 1, version)

    def __add__(self, other: Print) -> Print:
        # Field by field: `dataclasses.astuple` deep-copies, ~50 us a call.
        return Print(
            self.facts + other.facts,
            self.facts_total + other.facts_total,
            self.recall_rows + other.recall_rows,
            self.recall_total + other.recall_total,
            self.chunks + other.chunks,
            self.chunks_total + other.chunks_total,
        )


#: When rows kept are the ones that hold (`Kept.window`): from, until (microseconds since the epoch).
Window = tuple[float, float]
#: A window in which no time falls: rows kept without one are never ranked.
NEVER: Window = (math.inf, -math.inf)


def within(window: Window, at: float) -> bool:
    """Whether the time ``at`` falls in ``window``."""
    return window[0] <= at < window[1]


def overlap(one: Window, other: Window) -> Window:
    """The times in both windows."""
    return max(one[0], other[0]), min(one[1], other[1])


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def written_validity(metadata: dict[str, Any], created_at: datetime) -> Window | None:
    """When a fact just written holds (`VALIDITY`'s bounds, microseconds since the epoch), from the metadata and
    creation time its write returned; None when a bound is not text that Python reads exactly as PostgreSQL does
    (ISO 8601 with an offset, as the package writes it): the fact then joins no rows kept, and the next print,
    finding it, reads it from the database (`ScopeMemo.caught_up`)."""
    bounds: list[float] = []
    for name, default in (("valid_from", created_at), ("valid_to", None)):
        value = metadata.get(name)
        if value is None:
            bound = default
        elif isinstance(value, str):
            try:
                bound = datetime.fromisoformat(value)
            except ValueError:
                return None
            if bound.tzinfo is None or bound.isoformat() != value:
                return None
        else:
            return None
        bounds.append(math.inf if bound is None else float((bound - _EPOCH) // _MICROSECOND))
    return bounds[0], bounds[1]


def holding(rows: Sequence[tuple[Any, ...]], at: float, validity: int) -> tuple[list[tuple[Any, ...]], Window]:
    """The rows of ``rows`` that hold at ``at`` (each one's validity, `VALIDITY`, at ``validity`` and the next
    column), and the window from ``at`` until the first time after it when one of ``rows`` starts or stops
    holding: within it, the same rows hold."""
    held = []
    until = math.inf
    for r in rows:
        if r[validity] is None or r[validity + 1] is None:
            continue  # a bound the database could not compute: never holds, as NULL compares in the exact path
        valid_from, valid_to = float(r[validity]), float(r[validity + 1])
        if valid_from <= at < valid_to:
            held.append(r)
        if valid_from > at:
            until = min(until, valid_from)
        if valid_to > at:
            until = min(until, valid_to)
    return held, (at, until)


@dataclass(frozen=True)
class Read:
    """What a read of a scope's rows found (`ScopeMemo.read`, or `ScopeMemo.caught_up`): their print, the greatest
    storing order (``seq``; None when there were none; rows that do not hold included), how many rows were kept
    (those that hold) and the window in which they are the ones that hold. Facts joined since
    (`ScopeMemo.written`) follow them."""

    print: Print
    seq: int | None
    rows: int
    window: Window


@dataclass(frozen=True)
class Kept:
    """A scope's rows as read at ``print``, and what a recall returns of each fact (``details``, by id);
    ``scope`` None when one lacks a usable recall row or chunk (``unusable``: the exact path reads the chunk
    fallback too, `candidates.SCOPE_ROWS`) or when they are too many to keep (exact path). Facts joined
    (`ScopeMemo.written`) wait in ``pending`` (each one's row and detail; ``print`` counts them) until a print
    matches: a print that misses reads them again (`ScopeMemo.caught_up`), so extending the rows with them
    before would be work lost."""

    print: Print
    scope: HeldScope | None
    details: dict[str, Detail] = field(default_factory=dict)
    unusable: bool = False
    #: The greatest storing order (``seq``) among the rows; None when there are none.
    last_seq: int | None = None
    #: The rows as read, before facts joined; None when ``scope`` is.
    read: Read | None = None
    pending: tuple[tuple[tuple[Any, ...], Detail], ...] = ()
    #: The times at which the rows kept, and the facts pending, are the scope's rows that hold (the print counts
    #: them whenever they hold): a recall at a time outside it finds the scope changed.
    window: Window = NEVER

    def holds_at(self, at: float) -> bool:
        """Whether the rows kept (and the facts pending) are the ones that hold at ``at``."""
        return within(self.window, at)

    def __len__(self) -> int:
        return (len(self.scope) if self.scope is not None else 0) + len(self.pending)

    def with_pending(self) -> Kept:
        """These rows with the facts pending after them (under the memo's lock: `HeldScope.extended`)."""
        if not self.pending or self.scope is None:
            return self
        rows = [row for row, _ in self.pending]
        details = {**self.details, **{row[0]: detail for row, detail in self.pending}}
        scope = self.scope.extended(rows)
        return Kept(self.print, scope, details, last_seq=self.last_seq, read=self.read, window=self.window)


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

#: `MEMO_SINCE`'s ``since`` for rows read without a storing order: every fact is past it.
_BEFORE_ALL = -(2**63)


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
        #: Scopes read, recalls answered from the rows kept, prints that found the scope changed, facts
        #: written that joined the rows kept (`written`), and changes caught up with (`caught_up`).
        self.reads = 0
        self.hits = 0
        self.changed = 0
        self.joined = 0
        self.caught = 0

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

    def current(self, key: tuple[str, str], now: Print, at: float) -> Kept | Literal["since", "rows", "exact"]:
        """The rows kept for ``key`` if they were read at the print ``now`` and are the ones that hold at ``at``
        (the recall's time, `microseconds`). Otherwise ``rows`` when the scope has not changed since the previous
        print found it changed (read the rows again: they are likely to be used), else ``since`` (read the facts
        stored since the rows were read: `caught_up`)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return "rows"
            if entry.kept.print == now and entry.kept.holds_at(at):
                self._entries.move_to_end(key)
                entry.streak, entry.seen = 0, None
                self.hits += 1
                # Under the lock: two stores of one scope share its vectors' buffer (`HeldScope.extended`).
                entry.kept = entry.kept.with_pending()
                return entry.kept
            self.changed += 1
            if entry.seen == now:
                return "rows"
            return "since" if entry.kept.read is not None else self._skip(entry, now)

    def caught_up(
        self,
        cur: psycopg.Cursor[Any],
        statement: sql.Composed | bytes,
        params: dict[str, Any],
        now: Print,
        at: float,
    ) -> Kept | Literal["rows", "exact"]:
        """The rows kept for the scope of ``params`` (as `read` takes them) caught up with the facts stored since
        they were read (`MEMO_SINCE` on ``cur``, a binary cursor), when the recall's print ``now`` is the rows
        read's plus those facts' (nothing else changed) and the rows read are the ones that hold at ``at``: the
        rows read, then those of the facts that hold at ``at`` (facts this process wrote that joined them are read
        again with the others). Otherwise ``exact``, and the next recalls skip the print as after any change
        (`MAX_SKIPS`); ``rows`` when nothing is kept any more.

        So a scope two processes write (an agent's stores served by two workers) keeps its rows: each process's
        print misses the other's facts, and it reads only them. The facts are read after the print, from a later
        snapshot: one stored, changed or gone in between makes them differ from the print, which then does not
        add up."""
        key = (str(params["org_id"]), str(params["assignment_id"]))
        with self._lock:
            entry = self._entries.get(key)
            base = entry.kept if entry is not None else None
        if base is None or base.read is None or base.scope is None:
            return "rows"
        since = base.read.seq if base.read.seq is not None else _BEFORE_ALL
        rows = cur.execute(statement, {**params, "since": since}).fetchall()
        with self._lock:  # extending the rows under it: two recalls catching up one scope share its vectors' buffer
            new = _caught_up(base, base.read, base.scope, rows, now, at)
            entry = self._entries.get(key)
            if entry is None:
                return "rows" if new is None else new
            if new is None:
                return self._skip(entry, now)
            self.caught += 1
            if entry.kept is base:  # else changed meanwhile (a fact joined): this recall ranks its own
                entry.kept, entry.streak, entry.seen = new, 0, None
                self._facts += len(new) - len(base)
                self._evict()
        return new

    def _skip(self, entry: _Entry, now: Print) -> Literal["exact"]:
        """``entry``'s scope changed, found at the print ``now``: take the exact path; the next recalls skip the
        print, 1, 2, 4, ... up to `MAX_SKIPS` after changes in a row (under the lock)."""
        entry.seen = now
        entry.streak = min(entry.streak + 1, MAX_SKIPS.bit_length())
        entry.skips = min(2 ** (entry.streak - 1), MAX_SKIPS)
        return "exact"

    def written(
        self, key: tuple[str, str], gained: Print, row: tuple[Any, ...], detail: Detail, validity: Window
    ) -> bool:
        """A new fact of ``key`` was written, and nothing else in its transaction touched its rows: the rows
        kept join it (``row``: its `MEMO_ROWS` columns from the id to the scored flag, ``detail`` what a recall
        returns of it, ``validity`` when it holds, `microseconds`) at the print they make with it (the kept print
        plus ``gained``), pending until a print matches (`Kept.pending`) at a time when it holds (the window kept
        narrowed to its validity). The next recall's print checks them like any other: if the scope changed
        otherwise since they were read (a write of another process), or the fact is not in it as written
        (another status), the print does not match, and if a fact started or stopped holding, or the new one does
        not hold yet, the window does not: that recall then catches up or takes the exact path. A store's search
        for the facts it may replace, which follows its write, is then answered from memory instead of reading
        the scope.

        Nothing joins a scope that takes the exact path now (`route`: none kept, unusable, or skipping prints
        after changes it did not see), that holds the fact already, or whose rows hold a later storing order
        (the fact would not be the last row of the exact path's order). True when it joined."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.skips > 0:
                return False
            kept = entry.kept
            if kept.scope is None or row[0] in kept.details or any(row[0] == r[0] for r, _ in kept.pending):
                return False
            if kept.last_seq is not None and row[2] <= kept.last_seq:
                # Stored before a fact the rows hold (their read and this write overlapped): it belongs before
                # that one in storing order, not after the rows, where joining would put it.
                return False
            # A new `Kept`: recalls may be ranking the one kept meanwhile, without the lock. The fact waits until
            # a print matches (`Kept.with_pending`).
            entry.kept = Kept(
                kept.print + gained,
                kept.scope,
                kept.details,
                last_seq=row[2],
                read=kept.read,
                pending=(*kept.pending, (row, detail)),
                window=overlap(kept.window, validity),
            )
            self._facts += 1
            self.joined += 1
            self._evict()
        return True

    def clear(self) -> None:
        """Forget every scope kept: the next recall of each reads its rows again."""
        with self._lock:
            self._entries.clear()
            self._facts = 0

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
        # Every governing row of the scope, whenever it holds: those that hold at the read's time are kept.
        every = [r[at:] for r in rows if r[at] is not None]
        facts, window = holding(every, float(rows[0][-1]), _ROWS_VALIDITY)
        if not all(r[7] for r in facts):
            return Kept(printed, None, unusable=True)
        scope = HeldScope(self.dimension)
        scope.append([r[:7] for r in facts])
        last_seq = max((r[2] for r in every if r[2] is not None), default=None)
        details = {r[0]: r[8:12] for r in facts}
        read = Read(printed, last_seq, len(scope), window)
        return Kept(printed, scope, details, last_seq=last_seq, read=read, window=window)

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


def _caught_up(
    base: Kept, read: Read, scope: HeldScope, rows: Sequence[tuple[Any, ...]], now: Print, at: float
) -> Kept | None:
    """``base``'s rows as read (``read``, the first of ``scope``'s) and those of the facts of ``rows``
    (`MEMO_SINCE`'s, past ``read.seq``) that hold at ``at`` after them, at the print ``now``; None unless ``now``
    is the rows read's print plus those facts' (nothing else changed: no fact read before left or changed, none
    came in before them in storing order), the rows read are the ones that hold at ``at``, and every fact that
    holds has a usable recall row and chunk."""
    if not within(read.window, at):
        return None
    facts, window = holding(rows, at, _SINCE_VALIDITY)
    if not all(r[7] for r in facts):  # usable: its recall row and chunk are there, so are their hashes
        return None
    n = len(rows)
    gained = Print(n, sum(int(r[12]) for r in rows), n, sum(int(r[13]) for r in rows), n, sum(int(r[14]) for r in rows))
    if read.print + gained != now:
        return None
    window = overlap(read.window, window)
    joined = set(scope.document_ids[read.rows :])
    held = scope.head(read.rows).extended([r[:7] for r in facts])
    held.terms = held.terms.indexed()  # no facts since: `extended` left the head as it was
    details = {k: v for k, v in base.details.items() if k not in joined}
    details.update((r[0], r[8:12]) for r in facts)
    seqs = [s for s in (read.seq, *(r[2] for r in rows)) if s is not None]
    last_seq = max(seqs, default=None)
    return Kept(now, held, details, last_seq=last_seq, read=Read(now, last_seq, len(held), window), window=window)
