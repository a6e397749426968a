"""The scope ranking (`haystack_osa_memory.store.ranking`) against a plain-loop reading of its formulas,
on random scopes (missing embeddings, facts without query terms, ties, window 0, no lexical context),
plus the edge cases by hand."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from haystack_osa_memory.store.ranking import (
    SORTED_RANKS_MAX,
    TERM_CODE,
    PackedTerms,
    RankedFact,
    RankingParams,
    _all_ranks,
    _rank_of,
    _within,
    rank_scope,
    term_counts,
)

Row = tuple[float, float, list[int] | None, list[int] | None]


def reference(rows: list[Row], n_terms: int, p: RankingParams) -> dict[int, tuple[int | None, int | None, float]]:
    """index -> (lexical rank, vector rank, fused score), straight from the module docstring."""
    n = len(rows)
    w = p.window
    near = [range(max(0, i - w), min(n, i + w + 1)) for i in range(n)]
    dl = [r[1] for r in rows]
    cos = [r[0] for r in rows]
    f = [[0.0] * n_terms for _ in rows]
    for i, (_, _, terms, tfs) in enumerate(rows):
        for t, c in zip(terms or [], tfs or [], strict=True):
            f[i][t - 1] += c
    cdl = [dl[i] + p.lex_ctx * (sum(dl[j] for j in near[i]) - dl[i]) for i in range(n)]
    avgdl = max(sum(cdl) / n, 1.0)
    tf = [[f[i][t] + p.lex_ctx * (sum(f[j][t] for j in near[i]) - f[i][t]) for t in range(n_terms)] for i in range(n)]
    df = [sum(1 for i in range(n) if tf[i][t] > 0) for t in range(n_terms)]
    lexical: list[float | None] = []
    for i in range(n):
        held = [t for t in range(n_terms) if tf[i][t] > 0]
        if not held:
            lexical.append(None)
            continue
        score = 0.0
        for t in held:
            idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            score += idf * tf[i][t] * (p.k1 + 1) / (tf[i][t] + p.k1 * (1 - p.b + p.b * cdl[i] / avgdl))
        lexical.append(score)
    vector: list[float | None] = []
    for i in range(n):
        if math.isnan(cos[i]):
            vector.append(None)
        else:
            around = sum(cos[j] for j in near[i] if not math.isnan(cos[j]))
            vector.append(cos[i] + p.vec_ctx * (around - cos[i]))
    kept = [i for i in range(n) if lexical[i] is not None or vector[i] is not None]
    lex_max = max((lexical[i] or 0.0 for i in kept if lexical[i] is not None), default=0.0)
    vec_max = max(max((vector[i] or 0.0 for i in kept if vector[i] is not None), default=0.0), 0.0)
    fused = {}
    for i in kept:
        lex_part = (lexical[i] or 0.0) / lex_max if lexical[i] is not None and lex_max else 0.0
        vec_part = (vector[i] or 0.0) / vec_max if vector[i] is not None and vec_max else 0.0
        fused[i] = p.lex_share * lex_part + (1 - p.lex_share) * vec_part

    def ranks(score: dict[int, float]) -> dict[int, int]:
        return {i: r + 1 for r, i in enumerate(sorted(score, key=lambda i: (-score[i], i)))}

    lex_rank = ranks({i: s for i in kept if (s := lexical[i]) is not None})
    vec_rank = ranks({i: s for i in kept if (s := vector[i]) is not None})
    fused_rank = ranks(fused)
    return {
        i: (lex_rank.get(i), vec_rank.get(i), fused[i])
        for i in kept
        if lex_rank.get(i, p.k + 1) <= p.k or vec_rank.get(i, p.k + 1) <= p.k or fused_rank[i] <= p.k
    }


def _hash(term: int) -> int:
    """A made-up 48-bit lexeme hash for term number ``term`` (query term ``t`` is the ``t``-th, from 1)."""
    return (term * 2654435761 + 12345) % (1 << 48)


def _pack(terms: list[int] | None, tfs: list[int] | None) -> bytes | None:
    """Packed as PostgreSQL writes it: big-endian int8 ``hash * TERM_CODE + count`` per lexeme."""
    if not terms:
        return None
    return b"".join((_hash(t) * TERM_CODE + c).to_bytes(8, "big") for t, c in zip(terms, tfs or [], strict=True))


def _query(n_terms: int) -> list[int]:
    return [_hash(t) for t in range(1, n_terms + 1)]


def _rank(rows: list[Row], n_terms: int, p: RankingParams) -> list[RankedFact]:
    cos = [r[0] for r in rows]
    dl = [r[1] for r in rows]
    return rank_scope(cos, dl, [_pack(r[2], r[3]) for r in rows], _query(n_terms), p)


def _random_scope(rnd: random.Random, n: int, n_terms: int) -> list[Row]:
    rows: list[Row] = []
    for _ in range(n):
        cos = math.nan if rnd.random() < 0.1 else rnd.choice([rnd.uniform(-0.2, 0.9), 0.5])  # 0.5: ties
        held = sorted(rnd.sample(range(1, n_terms + 1), rnd.randint(0, n_terms))) if rnd.random() < 0.5 else []
        tfs = [rnd.randint(1, 3) for _ in held]
        rows.append((cos, float(rnd.randint(0, 30)), held or None, tfs or None))
    return rows


PARAMS = [
    RankingParams(k=5),
    RankingParams(k=3, window=0, lex_ctx=0.0, vec_ctx=0.0),
    RankingParams(k=10, k1=1.2, b=0.75, window=1, lex_ctx=0.0, vec_ctx=0.5, lex_share=0.3),
    RankingParams(k=1, window=4, lex_ctx=1.0, vec_ctx=0.0, lex_share=1.0),
    RankingParams(k=50, lex_share=0.0),
]


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("seed", range(25))
def test_matches_the_formulas(seed: int, params: RankingParams) -> None:
    rnd = random.Random(seed)
    n_terms = rnd.randint(0, 4)
    rows = _random_scope(rnd, rnd.randint(1, 40), n_terms)
    got = {h.row: (h.lex_rank, h.vec_rank, h.fused) for h in _rank(rows, n_terms, params)}
    want = reference(rows, n_terms, params)
    assert set(got) == set(want)
    for i, (lex_rank, vec_rank, fused) in want.items():
        assert got[i][:2] == (lex_rank, vec_rank), i
        assert got[i][2] == pytest.approx(fused, abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_a_scope_past_the_sorted_ranks_matches_the_formulas(seed: int) -> None:
    """Past `SORTED_RANKS_MAX` facts the ranks come from partitions and binary search instead of one sort per
    ranking: the same facts, ranks and scores as the formulas give."""
    rnd = random.Random(100 + seed)
    rows = _random_scope(rnd, SORTED_RANKS_MAX + rnd.randint(1, 400), 4)
    params = RankingParams(k=rnd.choice([5, 50]))
    got = {h.row: (h.lex_rank, h.vec_rank, h.fused) for h in _rank(rows, 4, params)}
    want = reference(rows, 4, params)
    assert set(got) == set(want)
    for i, (lex_rank, vec_rank, fused) in want.items():
        assert got[i][:2] == (lex_rank, vec_rank), i
        assert got[i][2] == pytest.approx(fused, abs=1e-12)


def test_scores_and_storing_order() -> None:
    rows: list[Row] = [(0.9, 4.0, [1], [2]), (0.1, 4.0, None, None), (math.nan, 4.0, [1, 2], [1, 1])]
    hits = _rank(rows, 2, RankingParams(k=5, window=0, lex_ctx=0.0, vec_ctx=0.0))
    assert [h.row for h in hits] == [0, 1, 2]  # storing order, whatever the ranks
    first, second, third = hits
    assert (first.vec_rank, second.vec_rank, third.vec_rank) == (1, 2, None)
    assert (first.vec_score, second.vec_score, third.vec_score) == (0.9, 0.1, None)
    assert second.lex_rank is None
    assert second.lex_score is None
    assert first.lex_score is not None
    assert third.lex_score is not None
    assert third.lex_rank == 1  # two distinct query terms beat one term twice in a fact of the same length
    assert first.fused == pytest.approx(0.5 * first.lex_score / third.lex_score + 0.5)


def test_context_window_lends_neighbour_terms() -> None:
    """A fact without the query term gets a lexical score from a neighbour within the window only."""
    rows: list[Row] = (
        [(math.nan, 5.0, None, None)] * 3 + [(math.nan, 5.0, [1], [1])] + [(math.nan, 5.0, None, None)] * 3
    )
    hits = {h.row: h for h in _rank(rows, 1, RankingParams(k=10, window=2, lex_ctx=0.4))}
    assert sorted(hits) == [1, 2, 3, 4, 5]
    assert hits[3].lex_rank == 1
    assert hits[2].lex_score == hits[4].lex_score  # symmetric
    assert hits[2].lex_score is not None
    assert hits[3].lex_score is not None
    assert hits[2].lex_score < hits[3].lex_score
    assert {h.row for h in _rank(rows, 1, RankingParams(k=10, window=2, lex_ctx=0.0))} == {3}


def test_ties_break_by_storing_order() -> None:
    rows: list[Row] = [(0.5, 3.0, None, None)] * 6
    hits = _rank(rows, 0, RankingParams(k=2, window=0, lex_ctx=0.0, vec_ctx=0.0))
    assert [(h.row, h.vec_rank) for h in hits] == [(0, 1), (1, 2)]


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("seed", range(10))
def test_matches_the_formulas_without_an_embedding(seed: int, params: RankingParams) -> None:
    """A lexical recall: no fact has a cosine, and the vector side (skipped) ranks nothing."""
    rnd = random.Random(1000 + seed)
    n_terms = rnd.randint(1, 4)
    rows = [(math.nan, *r[1:]) for r in _random_scope(rnd, rnd.randint(1, 40), n_terms)]
    ranked = _rank(rows, n_terms, params)
    got = {h.row: (h.lex_rank, h.vec_rank, h.fused) for h in ranked}
    want = reference(rows, n_terms, params)
    assert set(got) == set(want)
    for i, (lex_rank, vec_rank, fused) in want.items():
        assert got[i][:2] == (lex_rank, vec_rank), i
        assert vec_rank is None, i
        assert got[i][2] == pytest.approx(fused, abs=1e-12)
    assert all(h.vec_score is None for h in ranked)


def test_nothing_to_rank() -> None:
    assert _rank([], 3, RankingParams(k=5)) == []
    # no embedding and no query term: no fact has a score on either side
    assert _rank([(math.nan, 2.0, None, None)] * 4, 3, RankingParams(k=5)) == []
    # no lexemes in the query at all (stop words only), vector side still ranks
    assert [h.vec_rank for h in _rank([(0.2, 2.0, None, None), (0.4, 2.0, None, None)], 0, RankingParams(k=5))] == [
        2,
        1,
    ]


def test_negative_cosines_do_not_flip_the_vector_side() -> None:
    """All cosines negative: max(vector) < 0 counts as 0, the vector side adds nothing to the fusion."""
    rows: list[Row] = [(-0.3, 2.0, [1], [1]), (-0.1, 2.0, None, None)]
    hits = {h.row: h for h in _rank(rows, 1, RankingParams(k=5, window=0, lex_ctx=0.0, vec_ctx=0.0))}
    assert hits[0].fused == pytest.approx(0.5)
    assert hits[1].fused == 0.0
    assert hits[1].vec_rank == 1


def test_bad_input_refused() -> None:
    with pytest.raises(ValueError, match="one entry per fact"):
        rank_scope([0.1, 0.2], [1.0], [None, None], _query(1), RankingParams(k=5))
    with pytest.raises(ValueError, match="count is 0"):
        rank_scope([0.1], [1.0], [(_hash(1) * TERM_CODE).to_bytes(8, "big")], _query(2), RankingParams(k=5))
    with pytest.raises(ValueError, match="whole 8-byte values"):
        rank_scope([0.1], [1.0], [b"\x00" * 7], _query(1), RankingParams(k=5))


@pytest.mark.parametrize("seed", range(10))
def test_term_counts_match_a_loop(seed: int) -> None:
    """Each fact's counts of each query term, as a dictionary lookup per lexeme gives them (lexemes
    of the fact outside the query, query terms held by no fact, facts without lexemes)."""
    rnd = random.Random(seed)
    query = [rnd.getrandbits(48) for _ in range(rnd.randint(0, 6))]
    others = [rnd.getrandbits(48) for _ in range(20)]
    facts = [rnd.sample(query + others, rnd.randint(0, min(8, len(query) + 20))) for _ in range(30)]
    counts = [{h: rnd.randint(1, 256) for h in fact} for fact in facts]
    blobs = [b"".join((h * TERM_CODE + c).to_bytes(8, "big") for h, c in held.items()) or None for held in counts]
    got = term_counts(blobs, query)
    assert got.shape == (30, len(query))
    for i, held in enumerate(counts):
        assert list(got[i]) == [float(held.get(h, 0)) for h in query]


@pytest.mark.parametrize("seed", range(10))
def test_packed_terms_indexed_extended_and_taken_count_as_fresh_ones(seed: int) -> None:
    """A held scope's lexemes (`PackedTerms`): sorted once (`index`), grown (`extend`), thinned (`take`) and cut
    (`head`), they count each query term as lexemes packed afresh from the same facts do."""
    rnd = random.Random(seed)
    query = [rnd.getrandbits(48) for _ in range(rnd.randint(1, 6))]
    others = [rnd.getrandbits(48) for _ in range(20)]

    def blob() -> bytes | None:
        held = rnd.sample(query + others, rnd.randint(0, 8))
        return b"".join((h * TERM_CODE + rnd.randint(1, 256)).to_bytes(8, "big") for h in held) or None

    first, more = [blob() for _ in range(25)], [blob() for _ in range(7)]
    grown = PackedTerms(first).index().extend(PackedTerms(more)).index()
    assert (term_counts(first + more, query) == grown.counts_by_term(query).T).all()
    keep = np.array([rnd.random() < 0.6 for _ in range(32)])
    kept = grown.take(keep).index()
    assert len(kept) == int(keep.sum())
    kept_blobs = [b for b, k in zip(first + more, keep, strict=True) if k]
    assert (term_counts(kept_blobs, query) == kept.counts_by_term(query).T).all()
    assert (PackedTerms(first).counts_by_term(query) == PackedTerms(first).index().counts_by_term(query)).all()
    # The first n facts' (`head`), unindexed and indexed, grown again.
    n = rnd.randint(0, 32)
    head = grown.head(n)
    assert len(head) == n
    assert (term_counts((first + more)[:n], query) == head.counts_by_term(query).T).all()
    assert head.indexed() is head.indexed()
    regrown = head.extend(PackedTerms(more)).indexed()
    assert (term_counts((first + more)[:n] + more, query) == regrown.counts_by_term(query).T).all()
    assert len(PackedTerms.none()) == 0
    assert PackedTerms.none().counts_by_term(query).shape == (len(query), 0)


@pytest.mark.parametrize("seed", range(20))
def test_an_index_extended_is_the_index_built_afresh(seed: int) -> None:
    """`PackedTerms.extended` merges the new facts' lexemes into the index: the same order `index` sorts (equal
    hashes by position), one fact or several at a time, over many hashes held by several facts."""
    rnd = random.Random(seed)
    hashes = [rnd.getrandbits(48) for _ in range(12)]

    def blob() -> bytes | None:
        held = rnd.sample(hashes, rnd.randint(0, 6))
        return b"".join((h * TERM_CODE + rnd.randint(1, 9)).to_bytes(8, "big") for h in held) or None

    facts = [blob() for _ in range(rnd.randint(0, 20))]
    terms = PackedTerms(facts).index()
    for _ in range(6):
        more = [blob() for _ in range(rnd.randint(1, 3))]
        terms, facts = terms.extended(PackedTerms(more)), facts + more
        fresh = PackedTerms(facts).index()
        assert terms._order is not None
        assert fresh._order is not None
        assert terms._order.tolist() == fresh._order.tolist()
        assert terms._sorted.tolist() == fresh._sorted.tolist()
        assert terms.rows.tolist() == fresh.rows.tolist()
    assert PackedTerms(facts).extended(PackedTerms([blob()]))._order is not None  # unindexed: indexed afresh
    # The first n facts of an indexed scope keep their part of its index (`head`), which later facts merge into.
    n = rnd.randint(0, len(facts))
    head, fresh = terms.head(n), PackedTerms(facts[:n]).index()
    assert head._order is not None
    assert head._order.tolist() == fresh._order.tolist()
    assert head._sorted.tolist() == fresh._sorted.tolist()
    more = [blob() for _ in range(rnd.randint(1, 3))]
    grown, fresh = head.extended(PackedTerms(more)), PackedTerms(facts[:n] + more).index()
    assert grown._order is not None
    assert grown._order.tolist() == fresh._order.tolist()
    assert grown._sorted.tolist() == fresh._sorted.tolist()


@pytest.mark.parametrize("seed", range(24))
def test_partitioned_ranks_are_the_sorted_ones(seed: int) -> None:
    """`_within` (a partition), `_rank_of` (a stable sort, or past `SORTED_RANKS_MAX` facts binary search)
    and `_all_ranks` (a stable sort) give what a full sort gives: ranks by value descending, ties by position,
    among eligible rows only; many ties (values from a few levels, zeros of both signs), or few (a bigger scope,
    values from many levels)."""
    rnd = np.random.default_rng(seed)
    n = int(rnd.integers(1, 200)) if seed % 4 else int(rnd.integers(SORTED_RANKS_MAX + 1, 3 * SORTED_RANKS_MAX))
    levels = 6 if seed % 8 else 10**6
    values = rnd.integers(-2, levels, n).astype(np.float64)
    values[values == -1] = -0.0
    eligible = rnd.random(n) < 0.8
    values[~eligible] = np.nan
    idx = np.flatnonzero(eligible)
    order = idx[np.lexsort((idx, -values[idx]))]
    full = np.zeros(n, dtype=np.int64)
    full[order] = np.arange(1, order.shape[0] + 1)
    rows = np.arange(n)
    assert (_rank_of(values, eligible, rows) == full).all()
    assert (_all_ranks(values, eligible) == full).all()
    for k in (1, 3, 10, n):
        assert (_within(values, eligible, k) == (eligible & (full >= 1) & (full <= k))).all()


def test_a_repeated_query_hash_counts_once() -> None:
    rows: list[Row] = [(math.nan, 2.0, [1], [1]), (math.nan, 2.0, [2], [1])]
    params = RankingParams(k=5, window=0, lex_ctx=0.0)
    once = rank_scope([r[0] for r in rows], [r[1] for r in rows], [_pack(r[2], r[3]) for r in rows], _query(2), params)
    twice = rank_scope(
        [r[0] for r in rows], [r[1] for r in rows], [_pack(r[2], r[3]) for r in rows], _query(2) * 2, params
    )
    assert once == twice


def test_packed_counts_up_to_postgres_limit() -> None:
    """PostgreSQL keeps at most 256 positions per lexeme: such a count survives the packing."""
    rows: list[Row] = [(math.nan, 300.0, [1], [256]), (math.nan, 300.0, [1], [1])]
    params = RankingParams(k=5, window=0, lex_ctx=0.0)
    hits = _rank(rows, 1, params)
    assert [h.lex_rank for h in hits] == [1, 2]
    assert hits[0].fused == pytest.approx(reference(rows, 1, params)[0][2])


def test_terms_outside_the_query_are_ignored() -> None:
    rows: list[Row] = [(math.nan, 2.0, [0, 7], [1, 1]), (math.nan, 2.0, [1], [1])]  # 0 and 7: not query terms
    hits = _rank(rows, 1, RankingParams(k=5, window=0, lex_ctx=0.0))
    assert [h.row for h in hits] == [1]


def test_a_large_scope() -> None:
    """A thousand facts: at most 3k of them returned, the best fused score the same as by the formulas."""
    rnd = random.Random(7)
    rows = _random_scope(rnd, 1000, 5)
    hits = _rank(rows, 5, RankingParams(k=10))
    assert 10 <= len(hits) <= 30
    assert sorted(h.fused for h in hits if h.fused is not None)[-1] == pytest.approx(
        max(reference(rows, 5, RankingParams(k=10)).values(), key=lambda v: v[2])[2]
    )
    assert np.isfinite([h.fused for h in hits]).all()
