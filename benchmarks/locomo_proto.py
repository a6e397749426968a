"""Prototypes measured by ``locomo.py``: retrieval changes the package does not have yet.

Each prototype keeps our pipelines and components and replaces only what the change would touch,
so that the benchmark measures exactly the change proposed for the package:

**Fact order** (schema). Before anything is stored, the benchmark's governing table gets
``seq bigint GENERATED ALWAYS AS IDENTITY``. Our unchanged ``GovernedFactWriter`` inserts facts in
input order, so ``seq`` is the storing order; the product retriever ignores the column.

**Query-time context window** (``ContextScopedRetriever``, SQL ``CONTEXT_CANDIDATES``). Facts of one
assignment are numbered by ``seq``; the ``window`` facts stored just before and after a fact are its
neighbours. Lexical: BM25 over the fact's own terms plus ``lexical_context_weight`` x its
neighbours' term frequencies (document length likewise). Vector: the fact's cosine plus
``vector_context_weight`` x its neighbours' cosines. Nothing is re-embedded or re-stored.

**Convex fusion** (``fusion="convex"``). ``a * lex / max(lex) + (1 - a) * vec / max(vec)`` over the
whole scope, ``a = lexical_weight / (lexical_weight + vector_weight)``, computed in the SQL.

The SQL keeps the product's ``scope`` CTE (the scope is applied before anything is ranked) and is
written for PostgreSQL's poor row estimates on CTEs: every intermediate is ``MATERIALIZED``, the
neighbours are found by arithmetic on the position (no self-join), and the window lengths are one
array indexed by position. Ties are broken by storing order. At 419 facts it runs in 18 ms
(lexical) / 22 ms (hybrid) against 27 / 31 ms for the product's ``SCOPED_CANDIDATES``.

**Context embedding at store time** (``embed_context``). The document embedder embeds the previous
``embed_context`` turns (``"speaker: text"`` lines) followed by the fact, through Haystack's
``meta_fields_to_embed``; the stored fact text is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from haystack import Document, Pipeline, component
from haystack.utils import deserialize_secrets_inplace
from psycopg import sql

from haystack_osa_memory import MemoryConfig, ScopedMemoryRetriever
from haystack_osa_memory.database import transaction
from haystack_osa_memory.embedders import build_embedders as package_embedders
from haystack_osa_memory.markers import check_identifier
from haystack_osa_memory.store.facts import FACT_AUDIENCE, FactRepository, vector_literal

if TYPE_CHECKING:
    from locomo import Turn

ProtoFusion = Literal["product", "rrf", "convex"]


@dataclass(frozen=True)
class ProtoOptions:
    """Prototype switches. The defaults are the product as it is."""

    #: ``product``: the package's ScopedMemoryRetriever unchanged; ``rrf`` / ``convex``: ContextScopedRetriever.
    fusion: ProtoFusion = "product"
    #: Neighbours on each side that take part in a fact's scores (0 = none).
    window: int = 0
    #: Weight of a neighbour's term frequencies in a fact's BM25.
    lexical_context_weight: float = 0.0
    #: Weight of a neighbour's cosine in a fact's vector score.
    vector_context_weight: float = 0.0
    #: Store side: previous turns embedded together with the turn (0 = the fact alone, the product).
    embed_context: int = 0

    @property
    def store_key(self) -> tuple[Any, ...]:
        """Only the store-side option changes what is stored."""
        return (self.embed_context,)


def describe(options: ProtoOptions) -> dict[str, Any]:
    return asdict(options)


# ------------------------------------------------------------------------------------------- store


ADD_SEQ = sql.SQL("ALTER TABLE {schema}.{gov} ADD COLUMN IF NOT EXISTS seq bigint GENERATED ALWAYS AS IDENTITY")


def add_fact_order(conn_str: str, config: MemoryConfig) -> None:
    """The schema change of the prototype: a storing-order column on the governing table."""
    with psycopg.connect(conn_str, autocommit=True) as conn:
        conn.execute(
            ADD_SEQ.format(schema=sql.Identifier(config.kb_schema), gov=sql.Identifier(config.governing_table))
        )


def build_embedders(config: MemoryConfig, options: ProtoOptions) -> tuple[Any | None, Any | None]:
    """The package's embedders; with ``embed_context`` the document embedder also embeds ``meta["context"]``."""
    doc_embedder, text_embedder = package_embedders(config)
    if doc_embedder is None or options.embed_context <= 0:
        return doc_embedder, text_embedder
    from haystack_integrations.components.embedders.sentence_transformers import (
        SentenceTransformersDocumentEmbedder,
    )

    contextual = SentenceTransformersDocumentEmbedder(
        model=doc_embedder.model,
        local_files_only=True,
        progress_bar=False,
        token=None,
        meta_fields_to_embed=["context"],
        embedding_separator="\n",
    )
    return contextual, text_embedder


def turn_document(turns: Sequence[Turn], turn: Turn, options: ProtoOptions) -> Document:
    """The document handed to the store pipeline for one turn (content = the fact)."""
    if options.embed_context <= 0:
        return Document(content=turn.fact)
    before = turns[max(0, turn.position - options.embed_context) : turn.position]
    context = "\n".join(f"{t.speaker}: {t.text}" for t in before)
    return Document(content=turn.fact, meta={"context": context} if context else {})


# ------------------------------------------------------------------------------------------ recall

# The product's SCOPED_CANDIDATES with (1) facts numbered by storing order, (2) scores over a window
# of neighbouring facts, (3) both scores and ranks for every returned row, (4) the convex fusion.
CONTEXT_CANDIDATES = sql.SQL(
    """WITH scope AS MATERIALIZED (
    SELECT g.id AS document_id, g.seq, c.content, c.embedding, g.metadata, g.created_at, g.updated_at
    FROM {schema}.{gov} g JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
    WHERE g.org_id = %(org_id)s
      AND g.audience = ANY(%(audiences)s)
      AND g.status = ANY(%(statuses)s)
      AND g.metadata->>'assignment_id' = %(assignment_id)s
),
docs AS MATERIALIZED (
    SELECT x.*, (SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0) FROM unnest(x.tsv) u)::float8 AS dl
    FROM (
        SELECT s.*, row_number() OVER (ORDER BY s.seq, s.created_at, s.document_id)::int AS pos,
               to_tsvector(%(language)s::regconfig,
                           regexp_replace(s.content, '^<!-- osa-memory:scope [^\n]* -->\n', '')) AS tsv
        FROM scope s
    ) x
),
lens AS MATERIALIZED (
    SELECT array_agg(cdl ORDER BY pos) AS dl, count(*)::float8 AS n, greatest(avg(cdl), 1)::float8 AS avgdl
    FROM (
        SELECT pos, dl + %(lex_ctx)s * (sum(dl) OVER fr - dl) AS cdl
        FROM docs
        WINDOW fr AS (ORDER BY pos RANGE BETWEEN %(window)s::int PRECEDING AND %(window)s::int FOLLOWING)
    ) x
),
q AS MATERIALIZED (SELECT DISTINCT lexeme FROM unnest(to_tsvector(%(language)s::regconfig, %(query)s))),
matched AS MATERIALIZED (
    SELECT d.pos, u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS tf
    FROM docs d, unnest(d.tsv) u
    WHERE u.lexeme IN (SELECT lexeme FROM q)
),
tf AS MATERIALIZED (
    SELECT m.pos + o.off AS pos, m.lexeme,
           sum(CASE WHEN o.off = 0 THEN 1.0 ELSE %(lex_ctx)s END * m.tf)::float8 AS tf
    FROM matched m CROSS JOIN generate_series(-%(window)s::int, %(window)s::int) AS o(off)
    WHERE m.pos + o.off BETWEEN 1 AND (SELECT n FROM lens) AND (o.off = 0 OR %(lex_ctx)s > 0)
    GROUP BY 1, 2
),
df AS MATERIALIZED (SELECT lexeme, count(*)::float8 AS df FROM tf GROUP BY lexeme),
lex AS MATERIALIZED (
    SELECT tf.pos,
           sum(ln(1 + (l.n - df.df + 0.5) / (df.df + 0.5))
               * tf.tf * (%(k1)s + 1) / (tf.tf + %(k1)s * (1 - %(b)s + %(b)s * l.dl[tf.pos] / l.avgdl))) AS score
    FROM tf JOIN df USING (lexeme) CROSS JOIN lens l
    GROUP BY tf.pos
),
vec AS MATERIALIZED (
    SELECT pos, cos + %(vec_ctx)s * (sum(cos) OVER fr - cos) AS score
    FROM (
        SELECT pos, 1 - (embedding <=> p.qv) AS cos
        FROM docs, (SELECT %(embedding)s::vector AS qv) p
        WHERE p.qv IS NOT NULL AND embedding IS NOT NULL
    ) x
    WINDOW fr AS (ORDER BY pos RANGE BETWEEN %(window)s::int PRECEDING AND %(window)s::int FOLLOWING)
),
scored AS (
    SELECT pos, max(lex) AS lex_score, max(vec) AS vec_score
    FROM (SELECT pos, score AS lex, NULL::float8 AS vec FROM lex
          UNION ALL SELECT pos, NULL::float8, score FROM vec) u
    GROUP BY pos
),
fused AS (
    SELECT pos, lex_score, vec_score,
           %(lex_share)s * coalesce(lex_score / nullif(max(lex_score) OVER (), 0), 0)
           + (1 - %(lex_share)s) * coalesce(vec_score / nullif(greatest(max(vec_score) OVER (), 0), 0), 0) AS fused
    FROM scored
),
ranked AS MATERIALIZED (
    SELECT *
    FROM (
        SELECT *,
               CASE WHEN lex_score IS NOT NULL
                    THEN row_number() OVER (ORDER BY lex_score DESC NULLS LAST, pos) END AS lex_rank,
               CASE WHEN vec_score IS NOT NULL
                    THEN row_number() OVER (ORDER BY vec_score DESC NULLS LAST, pos) END AS vec_rank,
               row_number() OVER (ORDER BY fused DESC, pos) AS fused_rank
        FROM fused
    ) x
    WHERE lex_rank <= %(k)s OR vec_rank <= %(k)s OR fused_rank <= %(k)s
)
SELECT d.document_id, d.content, d.metadata, d.created_at, d.updated_at,
       r.lex_rank, r.lex_score, r.vec_rank, r.vec_score, r.fused
FROM ranked r JOIN docs d USING (pos)"""
)


@dataclass(frozen=True)
class ContextCandidate:
    """A fact of the scope with its context scores; ranks are ``None`` when that side did not score it."""

    document_id: str
    content: str
    metadata: dict[str, Any]
    created_at: Any
    updated_at: Any
    lex_rank: int | None
    lex_score: float | None
    vec_rank: int | None
    vec_score: float | None
    fused: float


class ContextRepository(FactRepository):
    """``FactRepository`` plus the prototype's candidate query."""

    def __init__(self, conn_str: str, config: MemoryConfig) -> None:
        super().__init__(conn_str, config)
        self._context = CONTEXT_CANDIDATES.format(
            schema=sql.Identifier(config.kb_schema),
            gov=sql.Identifier(config.governing_table),
            chunk=sql.Identifier(config.chunk_table),
        )

    def context_candidates(self, *, params: dict[str, Any]) -> list[ContextCandidate]:
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._context, params).fetchall()
        return [ContextCandidate(*row) for row in rows]


@component
class ContextScopedRetriever(ScopedMemoryRetriever):
    """Prototype: ``ScopedMemoryRetriever`` with a query-time context window and convex fusion.

    Same inputs, outputs and scope as the product retriever (the scope is applied inside the SQL);
    ``fusion="rrf"`` keeps the product's reciprocal rank fusion on the context scores.
    """

    def __init__(
        self,
        *,
        proto_fusion: Literal["rrf", "convex"] = "convex",
        window: int = 2,
        lexical_context_weight: float = 0.4,
        vector_context_weight: float = 0.2,
        **kwargs: Any,
    ) -> None:
        # Explicit base calls: @component rebuilds the class, which breaks zero-argument super().
        ScopedMemoryRetriever.__init__(self, **kwargs)
        if window < 0:
            msg = f"window must be >= 0, got {window}"
            raise ValueError(msg)
        self.proto_fusion = proto_fusion
        self.window = window
        self.lexical_context_weight = lexical_context_weight
        self.vector_context_weight = vector_context_weight
        self._context_repo: ContextRepository | None = None

    def warm_up(self) -> None:
        ScopedMemoryRetriever.warm_up(self)
        if self._context_repo is None:
            self._context_repo = ContextRepository(self._conn_str(), self._config)

    def _order(self, candidates: list[ContextCandidate], hybrid: bool) -> list[tuple[ContextCandidate, float]]:
        if not hybrid:
            ranked = sorted((c for c in candidates if c.lex_rank is not None), key=lambda c: c.lex_rank or 0)
            return [(c, float(c.lex_score or 0.0)) for c in ranked]
        if self.proto_fusion == "convex":
            ordered = sorted(candidates, key=lambda c: (-c.fused, c.document_id))
            return [(c, float(c.fused)) for c in ordered]
        scored = []
        for c in candidates:  # the product's RRF, on the context ranks (top candidate_k of each side)
            score = 0.0
            if c.lex_rank is not None and c.lex_rank <= self.candidate_k:
                score += self.lexical_weight / (self.rrf_k + c.lex_rank)
            if c.vec_rank is not None and c.vec_rank <= self.candidate_k:
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
        query_embedding: list[float] | None = None,
        top_k: int | None = None,
    ) -> dict[str, Any]:
        """Same contract as ``ScopedMemoryRetriever.run``."""
        check_identifier(org_id, "org")
        check_identifier(assignment_id, "assignment")
        k = top_k or self.top_k
        self.warm_up()
        assert self._context_repo is not None
        hybrid = query_embedding is not None
        if hybrid and len(query_embedding or []) != self._config.embedding_dimension:
            msg = f"query embedding has {len(query_embedding or [])} dimensions"
            raise ValueError(msg)
        share = self.lexical_weight / (self.lexical_weight + self.vector_weight) if hybrid else 1.0
        candidates = self._context_repo.context_candidates(
            params={
                "org_id": org_id,
                "assignment_id": assignment_id,
                "audiences": [FACT_AUDIENCE],
                "statuses": list(self.admitted_statuses),
                "language": self._config.language,
                "query": query,
                "embedding": vector_literal(query_embedding),
                "k": max(self.candidate_k, k),
                "k1": self.bm25_k1,
                "b": self.bm25_b,
                "window": self.window,
                "lex_ctx": self.lexical_context_weight,
                "vec_ctx": self.vector_context_weight,
                "lex_share": share,
            }
        )
        documents = []
        for cand, score in self._order(candidates, hybrid)[:k]:
            meta = {
                "document_id": cand.document_id,
                "topic": cand.metadata.get("topic"),
                "stored_at": cand.updated_at.isoformat(),
                "created_at": cand.created_at.isoformat(),
                "lexical_rank": cand.lex_rank,
                "vector_rank": cand.vec_rank,
            }
            documents.append(Document(id=cand.document_id, content=cand.content, meta=meta, score=score))
        return {"documents": documents, "mode": "hybrid" if hybrid else "lexical"}


def customise_recall_pipeline(pipe: Pipeline, options: ProtoOptions) -> Pipeline:
    """Swap the pipeline's retriever for the prototype, with every product setting carried over."""
    if options.fusion == "product":
        return pipe
    product = pipe.get_component("retrieve")
    assert isinstance(product, ScopedMemoryRetriever)
    params = product.to_dict()["init_parameters"]
    deserialize_secrets_inplace(params, keys=["connection_string"])
    for key in ("fusion", "context_window", "lexical_context_weight", "vector_context_weight"):
        params.pop(key, None)  # the product has these now; the prototype sets its own
    prototype = ContextScopedRetriever(
        proto_fusion=options.fusion,
        window=options.window,
        lexical_context_weight=options.lexical_context_weight,
        vector_context_weight=options.vector_context_weight,
        **params,
    )
    hybrid = "embed" in pipe.graph.nodes
    pipe.remove_component("retrieve")
    pipe.add_component("retrieve", prototype)
    if hybrid:
        pipe.connect("embed.embedding", "retrieve.query_embedding")
    pipe.connect("retrieve.documents", "acl.documents")
    return pipe
