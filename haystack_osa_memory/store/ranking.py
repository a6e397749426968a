"""Ranking of one scope's facts: BM25 with a context window, exact cosine, convex fusion.

The scoped statement (`haystack_osa_memory.store.facts`) reads the caller's facts, and only them, in
storing order: each fact's cosine with the query, its length in lexemes and its lexemes, packed
(`TERM_CODE`). This module matches those lexemes against the query's and turns the rows into the
three rankings, with numpy. Doing the same arithmetic in SQL cost far more executor work (CTEs, a
cross join per window offset, grouping, window functions), and so did matching each fact's tsvector
against the query there.

The arithmetic is, for facts ``i`` in storing order and a context window of ``w`` facts either side:

- context length ``cdl[i] = dl[i] + lex_ctx * (sum(dl[i-w..i+w]) - dl[i])``;
- context term frequency ``tf[i, t] = f[i, t] + lex_ctx * (sum(f[i-w..i+w, t]) - f[i, t])``, where
  ``f`` counts the positions of query term ``t`` in fact ``i`` (PostgreSQL's tsvector, at most 256);
  a fact *has* a term when ``tf > 0``;
- ``lexical[i] = sum over its terms of idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * cdl / avgdl))``
  with ``idf(t) = ln(1 + (n - df + 0.5) / (df + 0.5))``, ``df`` the facts having ``t``, ``n`` the
  scope's facts and ``avgdl = max(mean(cdl), 1)``; a fact without any query term has no lexical score;
- ``vector[i] = cos[i] + vec_ctx * (sum(cos[i-w..i+w]) - cos[i])`` (facts without an embedding count 0
  in their neighbours' sums and have no vector score);
- ``fused = lex_share * lexical / max(lexical) + (1 - lex_share) * vector / max(max(vector), 0)``
  (a missing side, or a zero maximum, contributes 0), plus ``time_boost`` for a fact that itself holds
  one of the ``boost_terms`` (time words such as "yesterday" or "last week", for a question about time).

Ranks count from 1, best first, ties broken by storing order. A fact is returned when any of its
ranks is within ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RankingParams:
    """Weights of the scope ranking (see the module docstring for where each one enters)."""

    k: int
    k1: float = 0.9
    b: float = 0.3
    window: int = 2
    lex_ctx: float = 0.4
    vec_ctx: float = 0.2
    lex_share: float = 0.5
    time_boost: float = 0.0


class RankedFact(NamedTuple):
    """One fact of the scope that made one of the three top-k lists (``row``: its index in the input).

    A named tuple: a recall returns many of them, and frozen dataclasses are slower to build."""

    row: int
    lex_rank: int | None
    lex_score: float | None
    vec_rank: int | None
    vec_score: float | None
    fused: float


#: A `RankedFact` from a tuple of its fields, without `NamedTuple._make`'s Python call per fact.
_ranked_fact = partial(tuple.__new__, RankedFact)


def _window_sum(x: Floats, window: int) -> Floats:
    """``out[..., i] = x[..., i-window] + ... + x[..., i+window]`` along the last axis (facts beyond either
    end count as absent), summed from the earliest fact on, as PostgreSQL's window ``sum`` does."""
    n = x.shape[-1]
    out = np.zeros_like(x)
    for off in range(-window, window + 1):
        if abs(off) >= n:
            continue
        if off < 0:
            out[..., -off:] += x[..., : n + off]
        else:
            out[..., : n - off] += x[..., off:]
    return out


def _within(values: Floats, eligible: npt.NDArray[np.bool_], k: int) -> npt.NDArray[np.bool_]:
    """The eligible rows ranked within ``k`` by value descending, ties by position (a partition, not a
    sort: a scope of ten thousand facts ranks three ways per recall)."""
    idx = np.flatnonzero(eligible)
    if idx.shape[0] <= k:
        return eligible.copy()
    v = values[idx]
    cut = np.partition(v, idx.shape[0] - k)[idx.shape[0] - k]  # the k-th largest
    above = v > cut
    at_cut = np.flatnonzero(v == cut)[: k - int(above.sum())]  # ties by position
    within = np.zeros(values.shape[0], dtype=bool)
    within[idx[above]] = True
    within[idx[at_cut]] = True
    return within


#: Scopes of up to this many facts rank by one stable sort per ranking (`_all_ranks`); a bigger one partitions
#: (`_within`) and sorts only the values (`_rank_of`), and sorts the rows too when many of the ranked rows tie
#: (a sort of 10,000 values costs ~0.3 ms, a pass per tie ~10 us).
SORTED_RANKS_MAX = 2048
TIES_PER_SORT = 300


def _all_ranks(values: Floats, eligible: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """1-based rank of every row among the eligible rows by value descending, ties by position (a stable sort keeps
    tied rows in storing order); 0 for a row that is not eligible. A row is within ``k`` (`_within`) exactly when
    its rank is between 1 and ``k``."""
    idx = eligible.nonzero()[0]
    rank = np.zeros(values.shape[0], dtype=np.int64)
    if idx.shape[0]:
        rank[idx[np.argsort(-values[idx], kind="stable")]] = np.arange(1, idx.shape[0] + 1)
    return rank


def _rank_of(values: Floats, eligible: npt.NDArray[np.bool_], rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """1-based rank of each of ``rows`` among the eligible rows by value descending, ties by position;
    0 for a row that is not eligible."""
    n = values.shape[0]
    if n > SORTED_RANKS_MAX:
        ordered = np.sort(values[eligible])
        v = values[rows]
        right = np.searchsorted(ordered, v, side="right")
        tied = np.flatnonzero(right - np.searchsorted(ordered, v, side="left") > 1)
        if tied.shape[0] * TIES_PER_SORT <= ordered.shape[0]:
            ranks = (ordered.shape[0] - right + 1).astype(np.int64)
            for j in tied:  # ties by position, one pass each: few here
                ranks[j] += int((np.flatnonzero(eligible & (values == v[j])) < rows[j]).sum())
            return np.where(eligible[rows], ranks, 0)
    return _all_ranks(values, eligible)[rows]


#: A fact's lexemes travel as one bytes value of big-endian 8-byte ints, one per distinct lexeme:
#: ``lexeme_hash * TERM_CODE + count``, where ``count`` is how often the lexeme occurs (PostgreSQL keeps
#: at most 256 positions per lexeme, so it fits below 1024) and ``lexeme_hash`` a 48-bit hash of the
#: lexeme (`haystack_osa_memory.store.facts.LEXEME_HASH`; the query's lexemes are hashed the same way).
TERM_CODE = 1024
TERM_BITS = 10  # TERM_CODE == 1 << TERM_BITS


_NO_TERMS: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
_NO_TERMS.flags.writeable = False  # shared by every `PackedTerms.none()`


class PackedTerms:
    """Facts' packed lexemes (`TERM_CODE`) unpacked once, for matching against many queries: a scope held
    in memory (`haystack_osa_memory.store.scope_cache`) unpacks its facts' lexemes when it reads them,
    not on every recall.

    :param terms: each fact's packed lexemes (``None`` or empty: none).
    :raises ValueError: a packed value is not 8 bytes long, or a count is 0.
    """

    def __init__(self, terms: Sequence[bytes | None]) -> None:
        blobs = [b or b"" for b in terms]
        self.n = len(blobs)
        lengths = np.fromiter(map(len, blobs), dtype=np.int64, count=self.n)
        if (lengths % 8).any():
            msg = "packed lexemes must be whole 8-byte values"
            raise ValueError(msg)
        packed = np.frombuffer(b"".join(blobs), dtype=">i8").astype(np.int64)
        self.often: npt.NDArray[np.int64] = packed & (TERM_CODE - 1)
        if not self.often.all():
            msg = "a packed lexeme count is 0; counts run from 1 to 1023"
            raise ValueError(msg)
        self.hashes: npt.NDArray[np.int64] = packed >> TERM_BITS
        self.rows: npt.NDArray[np.int64] = np.repeat(np.arange(self.n), lengths // 8)
        self._order: npt.NDArray[np.int64] | None = None

    @classmethod
    def none(cls) -> PackedTerms:
        """No facts' lexemes: ``PackedTerms([])`` without its decoding (for arrays assigned next)."""
        out = cls.__new__(cls)
        out.n = 0
        out.often = out.hashes = out.rows = _NO_TERMS
        out._order = None
        return out

    def index(self) -> PackedTerms:
        """Sort the lexemes once (for a scope matched against many queries): `counts_by_term` then finds each query
        term's holders by binary search instead of comparing every lexeme of the scope."""
        self._order = np.argsort(self.hashes, kind="stable")
        self._sorted = self.hashes[self._order]
        return self

    def __len__(self) -> int:
        return self.n

    @property
    def nbytes(self) -> int:
        """Bytes of the unpacked arrays, the index's included."""
        arrays = [self.often, self.hashes, self.rows]
        if self._order is not None:
            arrays += [self._order, self._sorted]
        return sum(a.nbytes for a in arrays)

    def extend(self, more: PackedTerms) -> PackedTerms:
        """These facts' lexemes followed by ``more``'s."""
        out = PackedTerms.none()
        out.n = self.n + more.n  # (unindexed: `index` again)
        out.often = np.concatenate([self.often, more.often])
        out.hashes = np.concatenate([self.hashes, more.hashes])
        out.rows = np.concatenate([self.rows, more.rows + self.n])
        return out

    def extended(self, more: PackedTerms) -> PackedTerms:
        """`extend`, indexed: when these lexemes are, ``more``'s are merged into their index (a scope kept in
        memory takes a fact or two at a time, and sorting all its lexemes again grows with the scope). The same
        index as `index` builds: equal hashes in the order of their lexemes."""
        out = self.extend(more)
        if self._order is None:
            return out.index()
        order = np.argsort(more.hashes, kind="stable")
        added = more.hashes[order]
        at = np.searchsorted(self._sorted, added, side="right")  # after equal hashes: theirs come first
        out._order = np.insert(self._order, at, order + self.hashes.shape[0])
        out._sorted = np.insert(self._sorted, at, added)
        return out

    def head(self, n: int) -> PackedTerms:
        """The lexemes of the first ``n`` facts: views, not copies, since each fact's lexemes follow the facts'
        before it; indexed when these are (their index without the later facts' lexemes: the same index as
        `index` builds, in a pass instead of a sort, so `extended` can merge into it)."""
        at = int(np.searchsorted(self.rows, n))
        out = PackedTerms.none()
        out.n = n
        out.often, out.hashes, out.rows = self.often[:at], self.hashes[:at], self.rows[:at]
        if self._order is not None:
            earlier = self._order < at
            out._order, out._sorted = self._order[earlier], self._sorted[earlier]
        return out

    def indexed(self) -> PackedTerms:
        """These lexemes, indexed (`index`) unless they are already."""
        return self if self._order is not None else self.index()

    def take(self, keep: npt.NDArray[np.bool_]) -> PackedTerms:
        """The lexemes of the facts where ``keep`` is true (one flag per fact), renumbered."""
        out = PackedTerms.none()
        renumber = np.cumsum(keep) - 1
        held = keep[self.rows]
        out.n = int(keep.sum())
        out.often, out.hashes, out.rows = self.often[held], self.hashes[held], renumber[self.rows[held]]
        return out

    def counts_by_term(self, query_terms: Sequence[int]) -> Floats:
        """``f[t, i]``: how often fact ``i`` holds query term ``t`` (the ``t``-th of ``query_terms``), in C
        order: one contiguous row of facts per query term, which is how ranking walks it."""
        f: Floats = np.zeros((len(query_terms), self.n), dtype=np.float64)
        if not len(query_terms) or not self.hashes.shape[0]:
            return f
        if self._order is not None:
            # Each term's holders by binary search, all terms in one count: term t's facts are bins t * n + row,
            # each bin adding its term's lexemes in the order a count per term would.
            wanted = np.asarray(query_terms, dtype=np.int64)
            lo = np.searchsorted(self._sorted, wanted)
            hi = np.searchsorted(self._sorted, wanted + 1)
            many = hi - lo
            total = int(many.sum())
            if total:
                start = np.repeat(lo - (np.cumsum(many) - many), many)
                held = self._order[start + np.arange(total)]
                bins = np.repeat(np.arange(len(query_terms)) * self.n, many) + self.rows[held]
                f = (
                    np.bincount(bins, weights=self.often[held], minlength=f.size)
                    .reshape(f.shape)
                    .astype(np.float64, copy=False)
                )
            return f
        for t, wanted_hash in enumerate(query_terms):
            # A handful of query terms: one vectorised comparison each is cheaper than sorting first.
            held = np.flatnonzero(self.hashes == wanted_hash)
            if held.shape[0]:
                f[t] = np.bincount(self.rows[held], weights=self.often[held], minlength=self.n)
        return f


def term_counts(terms: Sequence[bytes | None] | PackedTerms, query_terms: Sequence[int]) -> Floats:
    """``f[i, t]``: how often fact ``i`` holds query term ``t`` (the ``t``-th of ``query_terms``).

    :param terms: each fact's packed lexemes (`TERM_CODE`; ``None`` or empty: none), or them unpacked.
    :param query_terms: the hashes of the query's distinct lexemes.
    :raises ValueError: a packed value is not 8 bytes long, or a count is 0.
    """
    packed = terms if isinstance(terms, PackedTerms) else PackedTerms(terms)
    return packed.counts_by_term(query_terms).T


@dataclass(frozen=True)
class ScopeStats:
    """What BM25 needs of a whole scope when only part of it is ranked (the big-scope path).

    ``facts``: the scope's facts; ``mean_dl``: their mean length in lexemes; ``df``: per query term (in
    ``query_terms`` order, repeats removed), how many of the scope's facts hold it."""

    facts: int
    mean_dl: float
    df: Sequence[float]


R = TypeVar("R", bound=Sequence[Any])


def context_kept(rows: Sequence[R], seq_at: int, scored_at: int) -> Sequence[R]:
    """The rows to rank, of rows read in storing order (``seq_at``, ``scored_at``: the positions of each row's
    ``seq`` and scored flag): every scored row, and each row only lending context (unscored) unless a scored
    row stands in its place (the same ``seq``: an observation takes the place of its earliest evidence, whose
    text it holds). ``rows`` itself when every row is scored."""
    if all(r[scored_at] for r in rows):
        return rows
    taken = {r[seq_at] for r in rows if r[scored_at]}
    return [r for r in rows if r[scored_at] or r[seq_at] not in taken]


def rank_scope(
    cos: Sequence[float] | Floats,
    dl: Sequence[float] | Floats,
    terms: Sequence[bytes | None] | PackedTerms,
    query_terms: Sequence[int],
    params: RankingParams,
    *,
    stats: ScopeStats | None = None,
    scored: Sequence[bool] | None = None,
    boost_terms: Sequence[int] = (),
) -> list[RankedFact]:
    """The scope's facts that are within ``params.k`` on the lexical, vector or fused ranking.

    One entry per fact of the scope, in storing order, in each column:

    :param cos: cosine with the query, NaN for a fact without an embedding (or a query without one).
    :param dl: length of the fact in lexemes.
    :param terms: the fact's lexemes, packed (`TERM_CODE`; ``None`` or empty: none), or `PackedTerms`.
    :param query_terms: the hashes of the query's distinct lexemes (a repeated hash counts once).
    :param stats: the whole scope's statistics, when the columns hold only part of it (candidates and
        their neighbours in storing order); without it the columns are the whole scope.
    :param scored: which rows may be returned (the candidates; their neighbours only lend their context);
        all by default.
    :param boost_terms: hashes of lexemes that earn a fact ``params.time_boost`` on the fused score when the
        fact itself holds one (none by default).
    :returns: the selected facts, in storing order.
    :raises ValueError: the columns differ in length, or a packed value is malformed.
    """
    n = len(cos)
    if not len(dl) == len(terms) == n or (scored is not None and len(scored) != n):
        msg = f"every column needs one entry per fact: {n} cos, {len(dl)} dl, {len(terms)} terms"
        raise ValueError(msg)
    if n == 0:
        return []
    query_terms = list(dict.fromkeys(query_terms))
    if stats is not None and len(stats.df) != len(query_terms):
        msg = f"stats.df needs one count per distinct query term ({len(query_terms)}), got {len(stats.df)}"
        raise ValueError(msg)
    w = params.window
    cosine: Floats = np.asarray(cos, dtype=np.float64)
    length: Floats = np.asarray(dl, dtype=np.float64)
    has_cos = ~np.isnan(cosine)
    any_cos = bool(has_cos.any())
    packed = terms if isinstance(terms, PackedTerms) else PackedTerms(terms)
    f = packed.counts_by_term(query_terms)  # (term, fact)
    any_f = bool(f.any())
    lex_window = any_f and params.lex_ctx > 0 and w > 0
    # The lengths', cosines' and term counts' window sums in one pass over one array (row by row the same sums).
    cos0 = np.where(has_cos, cosine, 0.0) if any_cos else None
    rows = [length[None, :], *([cos0[None, :]] if cos0 is not None else []), *([f] if lex_window else [])]
    sums = _window_sum(np.concatenate(rows) if len(rows) > 1 else rows[0], w)
    cdl = length + params.lex_ctx * (sums[0] - length)
    if cos0 is not None:
        vector = np.where(has_cos, cos0 + params.vec_ctx * (sums[1] - cos0), np.nan)
    else:  # a query without an embedding: no vector side (what the arithmetic gives, without it)
        vector = np.full(n, np.nan)

    lexical = np.full(n, np.nan)
    if any_f:
        tf = f + params.lex_ctx * (sums[-f.shape[0] :] - f) if lex_window else f
        present = tf > 0
        if present.any():
            if stats is None:
                df = present.sum(axis=1).astype(np.float64)
                idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
                avgdl = max(float(cdl.mean()), 1.0)
            else:
                # A fact "has" a term when it or a neighbour holds it (what the exact path counts): with
                # holders spread at random, 1 - (1 - p)^(2w + 1) of the facts, p the share holding it. The
                # mean context length of an interior fact is dl * (1 + 2w * lex_ctx).
                spread = 2 * w + 1 if params.lex_ctx > 0 else 1
                share = np.clip(np.asarray(stats.df, dtype=np.float64) / max(stats.facts, 1), 0.0, 1.0)
                df = stats.facts * (1 - (1 - share) ** spread)
                idf = np.log(1 + (stats.facts - df + 0.5) / (df + 0.5))
                avgdl = max(stats.mean_dl * (1 + params.lex_ctx * (spread - 1)), 1.0)
            # Dense over (term, fact), absent pairs 0: where a query's terms are common (half the pairs of a
            # big scope present, the context window spreading each holder over five facts), cheaper than
            # gathering the present pairs. Each fact's terms add up one by one in term order (numpy's
            # own sum may pair them up in another order; the scores stay bit for bit what they were).
            norm = params.k1 * (1 - params.b + params.b * cdl / avgdl)
            contrib = np.where(present, idf[:, None] * tf * (params.k1 + 1) / (tf + norm), 0.0)
            total = contrib[0].copy()
            for term in contrib[1:]:
                total += term
            lexical = np.where(present.any(axis=0), total, np.nan)

    if scored is not None:
        allowed = np.asarray(scored, dtype=bool)
        lexical = np.where(allowed, lexical, np.nan)
        vector = np.where(allowed, vector, np.nan)
    has_lex = ~np.isnan(lexical)
    has_vec = ~np.isnan(vector)
    kept = has_lex | has_vec
    lex_max = float(lexical[has_lex].max()) if has_lex.any() else 0.0
    vec_den = max(float(vector[has_vec].max()), 0.0) if has_vec.any() else 0.0
    lex_part = np.where(has_lex, lexical / lex_max, 0.0) if lex_max != 0 else np.zeros(n)
    vec_part = np.where(has_vec, vector / vec_den, 0.0) if vec_den != 0 else np.zeros(n)
    fused = params.lex_share * lex_part + (1 - params.lex_share) * vec_part
    if params.time_boost and len(boost_terms):
        fused = np.where(kept & packed.counts_by_term(boost_terms).any(axis=0), fused + params.time_boost, fused)

    k = params.k
    if n <= SORTED_RANKS_MAX:
        # Every rank at once, by one stable sort per ranking: a row is within k exactly when its rank is.
        ranks = np.stack([_all_ranks(lexical, has_lex), _all_ranks(vector, has_vec), _all_ranks(fused, kept)])
        ranks[ranks == 0] = k + 1
        at = (kept & (ranks.min(axis=0) <= k)).nonzero()[0]
        lex_rank, vec_rank = ranks[0, at], ranks[1, at]
    else:
        chosen = kept & (_within(lexical, has_lex, k) | _within(vector, has_vec, k) | _within(fused, kept, k))
        at = np.flatnonzero(chosen)
        lex_rank = _rank_of(lexical, has_lex, at) if has_lex.any() else np.zeros(at.shape[0], dtype=np.int64)
        vec_rank = _rank_of(vector, has_vec, at) if has_vec.any() else np.zeros(at.shape[0], dtype=np.int64)
    lex_at, vec_at = has_lex[at], has_vec[at]
    columns = (
        at.tolist(),
        _or_none(lex_at, lex_rank),
        _or_none(lex_at, lexical[at]),
        _or_none(vec_at, vec_rank),
        _or_none(vec_at, vector[at]),
        fused[at].tolist(),
    )
    return list(map(_ranked_fact, zip(*columns, strict=True)))


def _or_none(present: npt.NDArray[np.bool_], values: npt.NDArray[Any]) -> list[Any]:
    """``values`` as Python numbers, ``None`` where not ``present``."""
    if present.all():
        return values.tolist()  # type: ignore[no-any-return]
    if not present.any():
        return [None] * present.shape[0]
    return [v if p else None for p, v in zip(present.tolist(), values.tolist(), strict=True)]
