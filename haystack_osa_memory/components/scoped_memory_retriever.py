from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt
from haystack import Document, component, default_from_dict, default_to_dict

from haystack_osa_memory.components.fact_document import FactDocument
from haystack_osa_memory.markers import check_identifier, strip_marker
from haystack_osa_memory.store.database import fact_scope
from haystack_osa_memory.store.facts import Candidate, FactRepository, QueryTerms, ScopeHit, ScopeQuery, ValidAt
from haystack_osa_memory.store.memory_store import MemoryStore, store_from_environment
from haystack_osa_memory.store.ranking import RankingParams
from haystack_osa_memory.supersession import Weights, fact_words, similarity, subject_words, value_changed
from haystack_osa_memory.time_phrases import period_of
from haystack_osa_memory.tools import SUPERSEDED
from haystack_osa_memory.validation import check_timestamp

Fusion = Literal["convex", "rrf", "lexical_first"]


def _is_stale(expires_at: object, now_iso: str) -> bool:
    return isinstance(expires_at, str) and expires_at <= now_iso


#: A question about time ("when did ...", "how long ...") ...
TIME_QUESTION = re.compile(
    r"^\s*when\b|\bwhen (?:did|is|was|will|does|do|are|were)\b|\bhow long\b|\b(?:what|which) (?:year|month|day|date)\b"
    r"|\bhow many (?:years|months|weeks|days)\b",
    re.IGNORECASE,
)
#: ... prefers facts that carry a time expression of their own (tokenised with the store's language).
TIME_WORDS = (
    "yesterday tomorrow tonight ago week weekend month year last next "
    "monday tuesday wednesday thursday friday saturday sunday"
)


_FUSIONS: tuple[str, ...] = get_args(Fusion)
#: Candidates beyond the top k read for conflicts (a newer restatement ranked just below the cut).
CONFLICT_POOL = 8
#: Two conflicting facts are reordered and flagged only when they answer the query about equally well: the
#: lower scores at least this share of the higher, and both hold the query's subject words
#: (`supersession.subject_words`): two subjects described by one template differ there.
CONFLICT_SCORE_RATIO = 0.5
#: Content-word overlap (`supersession.similarity`, weighed among the candidates) of two conflicting facts.
CONFLICT_SIMILARITY_MIN = 0.35


def valid_from_of(cand: Candidate) -> datetime:
    """When a fact holds from: its ``valid_from``, else (stored before validity times) its creation."""
    raw = cand.metadata.get("valid_from")
    if isinstance(raw, str):
        try:
            return datetime.fromisoformat(raw)
        except ValueError:
            pass
    return cand.created_at


def successors_first(candidates: list[Candidate]) -> list[Candidate]:
    """History in its order: a superseded fact never ranks above the fact that replaced it when both are
    there (the successor moves up to just before it)."""
    order = list(candidates)
    for _ in range(len(order)):  # each pass moves one successor up; a chain of n needs at most n passes
        at = {c.document_id: i for i, c in enumerate(order)}
        moved = False
        for i, cand in enumerate(order):
            successor = cand.metadata.get("superseded_by")
            j = at.get(successor) if isinstance(successor, str) else None
            if j is not None and j > i:
                order.insert(i, order.pop(j))
                moved = True
                break
        if not moved:
            break
    return order


def newer_first(
    candidates: list[Candidate], scores: dict[str, float], query: str
) -> tuple[list[Candidate], dict[str, list[str]]]:
    """Among facts that restate each other with another value and answer the query about equally well, the
    one valid from later ranks first; returns the new order and each fact's conflicting ids. Restating: both
    hold the query's subject words (`supersession.subject_words`), a value changed, and beyond the subject
    their words overlap (`CONFLICT_SIMILARITY_MIN`)."""
    texts = [strip_marker(c.content) for c in candidates]
    words = [fact_words(t) for t in texts]
    bags = [w.tokens for w in words]
    weights = Weights(texts)
    subject = subject_words(query, weights, texts)
    if not subject:
        return candidates, {}
    since = [valid_from_of(c) for c in candidates]
    score = [scores.get(c.document_id, 0.0) for c in candidates]
    named = [subject <= bag for bag in bags]
    n = len(candidates)
    pairs: dict[int, set[int]] = {}
    for a in range(n):
        if not named[a]:
            continue  # (every test below is per pair and side-effect free: the cheapest go first)
        for b in range(a + 1, n):
            if not named[b] or since[a] == since[b]:
                continue
            high, low = (score[a], score[b]) if score[a] >= score[b] else (score[b], score[a])
            if high <= 0 or low < CONFLICT_SCORE_RATIO * high or not value_changed(words[a], words[b]):
                continue
            # Beyond the subject both name, they must say the same thing (not the subject's other attributes).
            if similarity(words[a], words[b], weights, ignore=subject) >= CONFLICT_SIMILARITY_MIN:
                pairs.setdefault(a, set()).add(b)
                pairs.setdefault(b, set()).add(a)
    if not pairs:
        return candidates, {}
    order = list(range(n))
    p = 0
    while p < n:
        here = order[p]
        newer = [q for q in range(p + 1, n) if order[q] in pairs.get(here, ()) and since[order[q]] > since[here]]
        if newer:
            # Each move puts a strictly newer fact at position p, so this ends.
            q = max(newer, key=lambda q: since[order[q]])
            order.insert(p, order.pop(q))
            continue
        p += 1
    conflicts = {candidates[i].document_id: sorted(candidates[j].document_id for j in pairs[i]) for i in pairs}
    return [candidates[i] for i in order], conflicts


@component
class ScopedMemoryRetriever:
    """Retrieves one assignment's facts with the governing-row scope applied inside the SQL query.

    The candidate set is the caller's governing rows (org, audience `ai_internal`, admitted status,
    `metadata.assignment_id`) joined with their chunks; lexical BM25 and, when a query embedding is
    given, exact vector similarity both rank that set only. Each fact is scored together with its
    neighbours in storing order (a context window: facts stored together tend to belong together),
    and the two sides are fused by a convex combination of their max-normalised scores. No
    post-filter after top k: nothing outside the scope can crowd the assignment's facts out.
    The defaults are the configuration that won on the LoCoMo development split (benchmarks/README.md).

    Usage example:
    ```python
    from haystack_osa_memory import MemoryStore, ScopedMemoryRetriever

    retriever = ScopedMemoryRetriever(store=MemoryStore(), top_k=8)  # PG_CONN_STR
    docs = retriever.run(query="how do we deploy to staging?", org_id="acme", assignment_id="asg-1")["documents"]
    ```
    """

    def __init__(
        self,
        top_k: int = 8,
        candidate_k: int = 50,
        fusion: Fusion = "convex",
        rrf_k: int = 60,
        lexical_weight: float = 1.0,
        vector_weight: float = 1.0,
        bm25_k1: float = RankingParams.k1,
        bm25_b: float = RankingParams.b,
        context_window: int = RankingParams.window,
        lexical_context_weight: float = RankingParams.lex_ctx,
        vector_context_weight: float = RankingParams.vec_ctx,
        time_boost: float = 0.12,
        period_boost: float = 0.15,
        admitted_statuses: list[str] | None = None,
        store: MemoryStore | None = None,
        resolve_conflicts: bool = True,
    ) -> None:
        """
        :param top_k: Documents returned by default (1..100).
        :param candidate_k: Candidates taken from each ranking before fusion (>= top_k).
        :param fusion: `convex` (weighted sum of max-normalised scores), `rrf` (reciprocal rank fusion) or
            `lexical_first` (lexical order, vector hits appended).
        :param rrf_k: The k constant of reciprocal rank fusion.
        :param lexical_weight: Weight of the lexical ranking in the fusion.
        :param vector_weight: Weight of the vector ranking in the fusion.
        :param bm25_k1: BM25 term-frequency saturation.
        :param bm25_b: BM25 length normalisation.
        :param context_window: Facts before and after a fact (in storing order) that count towards its score;
            0 scores every fact alone.
        :param lexical_context_weight: Weight of the neighbours' term frequencies in a fact's BM25.
        :param vector_context_weight: Weight of the neighbours' cosine similarities in a fact's vector score.
        :param time_boost: Added to the fused score of a fact holding a time word (yesterday, last week, a
            weekday, ...) when the query asks about time ("when ...", "how long ..."); 0 turns it off.
        :param period_boost: Added to the score of a candidate whose validity began in the period the query
            names ("last week", "in March", "since 2026-03-01"; `time_phrases`); 0 turns it off.
        :param admitted_statuses: Statuses admitted (default `["approved"]`).
        :param resolve_conflicts: Among facts that restate each other with another value and answer the query
            about equally well, rank the one valid from later first and flag the pair (`conflicts_with`).
        :param store: The knowledge base (`MemoryStore`: connection, table names, timeouts). Required:
            without it the component still falls back to `MemoryStore()` (the `PG_CONN_STR` secret, read on
            first use) and warns (`DeprecationWarning`); from 0.2.0 it will not load.
        """
        if not 1 <= top_k <= 100:
            msg = f"top_k must be from 1 to 100, got {top_k}"
            raise ValueError(msg)
        if candidate_k < top_k:
            msg = f"candidate_k must be at least top_k ({top_k}), got {candidate_k}"
            raise ValueError(msg)
        if fusion not in _FUSIONS:
            msg = f"Unknown fusion '{fusion}'. Supported fusions in ScopedMemoryRetriever are: {list(_FUSIONS)}"
            raise ValueError(msg)
        self.top_k = top_k
        self.candidate_k = candidate_k
        self.fusion = fusion
        self.rrf_k = rrf_k
        self.lexical_weight = lexical_weight
        self.vector_weight = vector_weight
        if context_window < 0 or context_window > 20:
            msg = f"context_window must be from 0 to 20, got {context_window}"
            raise ValueError(msg)
        if lexical_weight < 0 or vector_weight < 0 or lexical_weight + vector_weight == 0:
            msg = "lexical_weight and vector_weight must be non-negative and not both 0"
            raise ValueError(msg)
        self.bm25_k1 = bm25_k1
        self.bm25_b = bm25_b
        self.context_window = context_window
        self.lexical_context_weight = lexical_context_weight
        self.vector_context_weight = vector_context_weight
        if time_boost < 0:
            msg = f"time_boost must be non-negative, got {time_boost}"
            raise ValueError(msg)
        self.time_boost = time_boost
        if period_boost < 0:
            msg = f"period_boost must be non-negative, got {period_boost}"
            raise ValueError(msg)
        self.period_boost = period_boost
        self._time_terms: QueryTerms | None = None
        self.admitted_statuses = list(admitted_statuses) if admitted_statuses is not None else ["approved"]
        self.resolve_conflicts = resolve_conflicts
        self.store = store if store is not None else store_from_environment("ScopedMemoryRetriever")
        self._repo: FactRepository | None = None

    def warm_up(self) -> None:
        """Resolve the connection string (safe to call twice)."""
        if self._repo is None:
            self._repo = self.store.facts

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            top_k=self.top_k,
            candidate_k=self.candidate_k,
            fusion=self.fusion,
            rrf_k=self.rrf_k,
            lexical_weight=self.lexical_weight,
            vector_weight=self.vector_weight,
            bm25_k1=self.bm25_k1,
            bm25_b=self.bm25_b,
            context_window=self.context_window,
            lexical_context_weight=self.lexical_context_weight,
            vector_context_weight=self.vector_context_weight,
            time_boost=self.time_boost,
            period_boost=self.period_boost,
            admitted_statuses=self.admitted_statuses,
            resolve_conflicts=self.resolve_conflicts,
            store=self.store.to_dict(),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScopedMemoryRetriever:
        params = data["init_parameters"]
        if isinstance(params.get("store"), dict):
            params["store"] = MemoryStore.from_dict(params["store"])
        return default_from_dict(cls, data)

    def _fuse(self, candidates: list[ScopeHit], hybrid: bool) -> list[tuple[ScopeHit, float]]:
        if not hybrid:
            ranked = [c for c in candidates if c.lex_rank is not None]
            ranked.sort(key=lambda c: c.lex_rank or 0)
            return [(c, float(c.lex_score or 0.0)) for c in ranked]
        if self.fusion == "convex":
            fused = [(c, float(c.fused)) for c in candidates if c.lex_rank is not None or c.vec_rank is not None]
            fused.sort(key=lambda pair: (-pair[1], pair[0].position))
            return fused
        if self.fusion == "lexical_first":
            lex = sorted((c for c in candidates if c.lex_rank is not None), key=lambda c: c.lex_rank or 0)
            vec = sorted((c for c in candidates if c.lex_rank is None), key=lambda c: c.vec_rank or 0)
            return [(c, float(c.lex_score or 0.0)) for c in lex] + [(c, float(c.vec_score or 0.0)) for c in vec]
        scored = []
        for c in candidates:
            score = 0.0
            if c.lex_rank is not None:
                score += self.lexical_weight / (self.rrf_k + c.lex_rank)
            if c.vec_rank is not None:
                score += self.vector_weight / (self.rrf_k + c.vec_rank)
            scored.append((c, score))
        scored.sort(key=lambda pair: (-pair[1], pair[0].document_id))
        return scored

    @component.output_types(documents=list[Document], mode=str)
    def run(
        self,
        query: str,
        org_id: str,
        assignment_id: str,
        # Haystack compares Union types position by position: this order accepts both the
        # `NDArray | None` of GuardedTextEmbedder and the `list[float]` of Haystack's embedders.
        query_embedding: npt.NDArray[np.float32] | None | list[float] = None,  # noqa: RUF036
        top_k: int | None = None,
        as_of: str | None = None,
        include_superseded: bool = False,
    ) -> dict[str, Any]:
        """
        :param query: The recall query (lexical side).
        :param org_id: The caller's org (from trusted context).
        :param assignment_id: The caller's assignment (from trusted context).
        :param query_embedding: Optional query embedding (vector side); `None` means lexical only.
        :param top_k: Overrides the number of documents returned.
        :param as_of: ISO 8601 time: the facts that held then (default: the facts that hold now).
        :param include_superseded: Also the facts that no longer hold (superseded, or past their `valid_to`).
        :returns: `documents` best first (content still carries the marker; `meta` holds `document_id`,
            `topic`, `stored_at`, `valid_from`, `valid_to`, `superseded_by`, `conflicts_with`, ranks) and
            `mode` (`lexical` or `hybrid`).
        """
        check_identifier(org_id, "org")
        check_identifier(assignment_id, "assignment")
        k = top_k or self.top_k
        at = check_timestamp(as_of, "as_of")
        valid_at: ValidAt = at if at is not None else ("now" if not include_superseded else None)
        statuses = list(self.admitted_statuses)
        if include_superseded or at is not None:
            statuses.append(SUPERSEDED)
        self.warm_up()
        assert self._repo is not None
        hybrid = query_embedding is not None
        about_time = hybrid and self.fusion == "convex" and self.time_boost > 0 and bool(TIME_QUESTION.search(query))
        scope = ScopeQuery(
            org_id, assignment_id, statuses=tuple(statuses), valid_at=valid_at, history=include_superseded
        )
        with fact_scope(org_id, assignment_id), self._repo.reading() as conn:
            if about_time and self._time_terms is None:
                self._time_terms = self._repo.query_terms(TIME_WORDS, conn=conn)
            hits = self._repo.scope_hits(
                scope,
                query=query,
                embedding=query_embedding,
                ranking=RankingParams(
                    k=max(self.candidate_k, k),
                    k1=self.bm25_k1,
                    b=self.bm25_b,
                    window=self.context_window,
                    lex_ctx=self.lexical_context_weight,
                    vec_ctx=self.vector_context_weight,
                    lex_share=self.lexical_weight / (self.lexical_weight + self.vector_weight),
                    time_boost=self.time_boost if about_time else 0.0,
                ),
                boost=self._time_terms if about_time else None,
                conn=conn,
            )
            now = datetime.now(UTC).isoformat()
            fused = self._fuse(hits, hybrid)
            # Facts past their time to live are kept, marked stale and ranked below every fresh one.
            fused.sort(key=lambda pair: _is_stale(pair[0].expires_at, now))
            # A few more than asked: a restatement with a newer value may rank just below the top k.
            pool = fused[: k + CONFLICT_POOL] if self.resolve_conflicts else fused[:k]
            scores = {hit.document_id: score for hit, score in pool}
            # Text and metadata only for these facts (the scope is checked again while fetching them, or they
            # come with a kept scope's rows, checked by this recall's print: `store.scope_memo`).
            top = self._repo.candidates([hit for hit, _ in pool], scope, conn=conn)
        period = period_of(query, at or datetime.now(UTC)) if self.period_boost > 0 else None
        if period is not None:
            # "What did we decide last week?": facts whose validity began then come first among close matches.
            for cand in top:
                if period.holds(valid_from_of(cand)):
                    scores[cand.document_id] += self.period_boost
            top.sort(key=lambda c: (_is_stale(c.metadata.get("expires_at"), now), -scores[c.document_id]))
        conflicts: dict[str, list[str]] = {}
        if self.resolve_conflicts and not include_superseded:
            top, conflicts = newer_first(top, scores, query)
        if include_superseded:
            top = successors_first(top)
        documents = []
        for cand in top[:k]:
            meta = {
                "document_id": cand.document_id,
                "topic": cand.metadata.get("topic"),
                "kind": cand.metadata.get("kind", "fact"),
                "stale": _is_stale(cand.metadata.get("expires_at"), now),
                "stored_at": cand.updated_at.isoformat(),
                "created_at": cand.created_at.isoformat(),
                "valid_from": valid_from_of(cand).isoformat(),
                "valid_to": cand.metadata.get("valid_to"),
                "lexical_rank": cand.lex_rank,
                "vector_rank": cand.vec_rank,
            }
            if cand.metadata.get("superseded_by"):
                meta["superseded_by"] = cand.metadata["superseded_by"]
            if conflicts.get(cand.document_id):
                meta["conflicts_with"] = conflicts[cand.document_id]
            documents.append(
                FactDocument.of(id=cand.document_id, content=cand.content, meta=meta, score=scores[cand.document_id])
            )
        return {"documents": documents, "mode": "hybrid" if hybrid else "lexical"}
