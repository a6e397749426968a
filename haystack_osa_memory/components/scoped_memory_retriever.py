from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt
from haystack import Document, component, default_from_dict, default_to_dict

from haystack_osa_memory.markers import check_identifier
from haystack_osa_memory.store.database import fact_scope
from haystack_osa_memory.store.facts import FACT_AUDIENCE, FactRepository, ScopeHit
from haystack_osa_memory.store.memory_store import MemoryStore
from haystack_osa_memory.store.ranking import RankingParams

Fusion = Literal["convex", "rrf", "lexical_first"]


def _is_stale(expires_at: object, now_iso: str) -> bool:
    return isinstance(expires_at, str) and expires_at <= now_iso


_FUSIONS: tuple[str, ...] = get_args(Fusion)


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
    from haystack_osa_memory import ScopedMemoryRetriever

    retriever = ScopedMemoryRetriever(top_k=8)        # PG_CONN_STR
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
        admitted_statuses: list[str] | None = None,
        store: MemoryStore | None = None,
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
        :param admitted_statuses: Statuses admitted (default `["approved"]`).
        :param store: The knowledge base (`MemoryStore`: connection, table names, timeouts); by default
            `MemoryStore()`, which reads the `PG_CONN_STR` secret on first use.
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
        self.admitted_statuses = list(admitted_statuses) if admitted_statuses is not None else ["approved"]
        self.store = store if store is not None else MemoryStore()
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
            admitted_statuses=self.admitted_statuses,
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
    ) -> dict[str, Any]:
        """
        :param query: The recall query (lexical side).
        :param org_id: The caller's org (from trusted context).
        :param assignment_id: The caller's assignment (from trusted context).
        :param query_embedding: Optional query embedding (vector side); `None` means lexical only.
        :param top_k: Overrides the number of documents returned.
        :returns: `documents` best first (content still carries the marker; `meta` holds `document_id`,
            `topic`, `stored_at`, ranks) and `mode` (`lexical` or `hybrid`).
        """
        check_identifier(org_id, "org")
        check_identifier(assignment_id, "assignment")
        k = top_k or self.top_k
        self.warm_up()
        assert self._repo is not None
        hybrid = query_embedding is not None
        with fact_scope(org_id, assignment_id), self._repo.reading() as conn:
            hits = self._repo.scope_hits(
                org_id=org_id,
                assignment_id=assignment_id,
                audiences=(FACT_AUDIENCE,),
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
                ),
                statuses=self.admitted_statuses,
                conn=conn,
            )
            now = datetime.now(UTC).isoformat()
            fused = self._fuse(hits, hybrid)
            # Facts past their time to live are kept, marked stale and ranked below every fresh one.
            fused.sort(key=lambda pair: _is_stale(pair[0].expires_at, now))
            scores = {hit.document_id: score for hit, score in fused[:k]}
            # Text and metadata only for the facts returned (the scope is checked again while fetching them).
            top = self._repo.candidates(
                [hit for hit, _ in fused[:k]],
                org_id=org_id,
                assignment_id=assignment_id,
                audiences=(FACT_AUDIENCE,),
                statuses=self.admitted_statuses,
                conn=conn,
            )
        documents = []
        for cand in top:
            meta = {
                "document_id": cand.document_id,
                "topic": cand.metadata.get("topic"),
                "kind": cand.metadata.get("kind", "fact"),
                "stale": _is_stale(cand.metadata.get("expires_at"), now),
                "stored_at": cand.updated_at.isoformat(),
                "created_at": cand.created_at.isoformat(),
                "lexical_rank": cand.lex_rank,
                "vector_rank": cand.vec_rank,
            }
            documents.append(
                Document(id=cand.document_id, content=cand.content, meta=meta, score=scores[cand.document_id])
            )
        return {"documents": documents, "mode": "hybrid" if hybrid else "lexical"}
