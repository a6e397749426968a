"""LoCoMo through the product: the named variants, storing every turn and recalling every question.

Shared by locomo.py (the benchmark) and embedders.py (the same runs with other embedders).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from haystack import Document, Pipeline
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from benchmarks.harness import latency_summary
from benchmarks.locomo_data import Conversation, Turn, aggregate, question_metrics
from haystack_osa_memory import Memory, MemoryConfig, MiniLMDocumentEmbedder
from haystack_osa_memory.builders import build_recall_pipeline, build_store_pipeline
from haystack_osa_memory.config import Precision
from haystack_osa_memory.embedders import build_embedders
from haystack_osa_memory.store.schema import ensure_schema

# Wide enough for the per-category table when the output is a file or a pipe.
console = Console(width=None if sys.stdout.isatty() else 132)


# ----------------------------------------------------------------------------------------- variants


@dataclass(frozen=True)
class Variant:
    """One configuration: how turns are stored (embedder, embedded text) and how questions are recalled."""

    name: str
    description: str
    embedder: str = "minilm"  # minilm | none
    retriever: dict[str, Any] = field(default_factory=dict)  # ScopedMemoryRetriever parameters
    #: Store side: previous turns embedded together with each turn (0 = the fact alone, the product).
    embed_context: int = 0

    @property
    def store_key(self) -> tuple[Any, ...]:
        """Variants with the same key share one stored knowledge base."""
        return (self.embedder, self.embed_context)


#: The product before the recall-quality work: RRF k=60, no context window, BM25 k1=1.2 b=0.75.
BEFORE: dict[str, Any] = {"fusion": "rrf", "context_window": 0, "bm25_k1": 1.2, "bm25_b": 0.75}
#: The context window of the default (neighbours +-2, terms x0.4, cosines x0.2), with convex fusion.
CONTEXT: dict[str, Any] = {"fusion": "convex", "context_window": 2, "bm25_k1": 1.2, "bm25_b": 0.75}

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        Variant("default", "product default: hybrid, context window +-2, convex fusion, BM25 k1=0.9 b=0.3, MiniLM"),
        Variant("lexical", "product lexical only (no embedder): BM25 with the context window", embedder="none"),
        # The product before, then one idea at a time.
        Variant("before", "before: hybrid, RRF k=60, no context, BM25 k1=1.2 b=0.75", retriever=BEFORE),
        Variant("before-lexical", "before, lexical only", embedder="none", retriever=BEFORE),
        Variant(
            "before-lexical-bm25",
            "before, lexical, BM25 k1=0.9 b=0.3",
            embedder="none",
            retriever={**BEFORE, "bm25_k1": 0.9, "bm25_b": 0.3},
        ),
        Variant(
            "before-lexical-simple",
            "before, lexical, text search config 'simple' (no stemming, stop words kept)",
            embedder="none",
            retriever={**BEFORE, "language": "simple"},
        ),
        Variant(
            "rrf-k1-lex2",
            "before, RRF k=1, lexical weight 2 : vector 1",
            retriever={**BEFORE, "rrf_k": 1, "lexical_weight": 2.0},
        ),
        Variant(
            "convex", "convex fusion 0.5 lex/max + 0.5 cos/max, no context", retriever={**CONTEXT, "context_window": 0}
        ),
        Variant(
            "context-lexical", "lexical, context window +-2 (neighbour terms x0.4)", embedder="none", retriever=CONTEXT
        ),
        Variant(
            "context-rrf",
            "context window +-2 (terms x0.4, cosines x0.2), RRF k=60",
            retriever={**CONTEXT, "fusion": "rrf"},
        ),
        Variant("context", "context window +-2 (terms x0.4, cosines x0.2), convex fusion 0.5", retriever=CONTEXT),
        Variant(
            "context-embed",
            "context + 2 previous turns embedded with each turn (store side)",
            retriever=CONTEXT,
            embed_context=2,
        ),
    ]
}


def turn_document(turns: Sequence[Turn], turn: Turn, embed_context: int) -> Document:
    """The document handed to the store pipeline for one turn (content = the fact; previous turns in meta)."""
    if embed_context <= 0:
        return Document(content=turn.fact)
    before = turns[max(0, turn.position - embed_context) : turn.position]
    context = "\n".join(f"{t.speaker}: {t.text}" for t in before)
    return Document(content=turn.fact, meta={"context": context} if context else {})


def variant_embedders(config: MemoryConfig, variant: Variant) -> tuple[Any | None, Any | None]:
    """The product's embedders; with ``embed_context`` the document embedder also embeds ``meta["context"]``."""
    doc_embedder, text_embedder = build_embedders(config)
    if doc_embedder is None or variant.embed_context <= 0:
        return doc_embedder, text_embedder
    contextual = MiniLMDocumentEmbedder(
        model=doc_embedder.model, meta_fields_to_embed=["context"], precision=doc_embedder.precision
    )
    return contextual, text_embedder


# ------------------------------------------------------------------------------------------- runner


@dataclass
class StoredBase:
    """One knowledge base (schema) with every conversation stored, and the map back to dia_ids."""

    config: MemoryConfig
    dia_ids: dict[str, dict[str, frozenset[str]]]  # assignment -> document_id -> dia_ids
    by_content: dict[str, dict[str, frozenset[str]]]  # assignment -> fact text -> dia_ids
    seconds: float
    facts: int
    embedders: tuple[Any | None, Any | None]


@dataclass
class VariantResult:
    name: str
    description: str
    metrics: dict[str, dict[str, float]]
    timing: dict[str, Any]
    settings: dict[str, Any]
    per_question: list[dict[str, Any]] = field(default_factory=list)


def progress_bar(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
        transient=True,
    )


def store_entry(pipe: Pipeline) -> str:
    """The store pipeline's component that takes the plain facts (``redact``, ``embed`` or ``mark``)."""
    open_inputs = pipe.inputs()
    for name in ("redact", "embed", "mark"):
        if "documents" in open_inputs.get(name, {}):
            return name
    return next(name for name, sockets in open_inputs.items() if "documents" in sockets)


def store_all(
    conversations: Sequence[Conversation],
    variant: Variant,
    conn_str: str,
    batch_size: int,
    show: bool,
    embedders: tuple[Any | None, Any | None] | None = None,
    *,
    through_memory: bool = False,
    document_precision: Precision | None = None,
) -> StoredBase:
    """Store every turn through our store pipeline, in batches, into a fresh schema; with ``through_memory``,
    one turn per `Memory.store` call instead, as an agent stores through ``kb_memory_store`` (each store also
    searches for the facts it may replace and notes them, `possibly_supersedes`).

    ``embedders``: (document, text) embedders to use instead of the variant's (benchmarks/embedders.py).
    ``document_precision``: the configuration's `document_precision` (else its default).
    """
    schema = "locomo_" + uuid.uuid4().hex[:10]
    config = MemoryConfig(
        pg_conn_str=conn_str,
        kb_schema=schema,
        memory_schema=schema,
        embedder="minilm" if variant.embedder == "minilm" else "none",
    )
    if document_precision is not None:
        config = config.model_copy(update={"document_precision": document_precision})
    ensure_schema(conn_str, config)
    doc_embedder, text_embedder = embedders if embedders is not None else variant_embedders(config, variant)
    dia_ids: dict[str, dict[str, frozenset[str]]] = {}
    by_content: dict[str, dict[str, frozenset[str]]] = {}
    total = sum(len(c.turns) for c in conversations)
    started = time.perf_counter()
    if through_memory:
        memory = Memory(config)  # its own embedders, the same model (config.embedder)
        memory.warm_up()
        with progress_bar(show) as bar:
            task = bar.add_task(f"store [{variant.name}] one fact per Memory.store", total=total)
            for conv in conversations:
                ids: dict[str, set[str]] = defaultdict(set)
                for turn in conv.turns:
                    ids[memory.store(turn.fact, caller=conv.caller)["document_id"]].add(turn.dia_id)
                    bar.advance(task)
                dia_ids[conv.caller.assignment_id] = {k: frozenset(v) for k, v in ids.items()}
                by_content[conv.caller.assignment_id] = {}
    else:
        pipe: Pipeline = build_store_pipeline(config, doc_embedder)
        pipe.warm_up()
        entry = store_entry(pipe)
        with progress_bar(show) as bar:
            task = bar.add_task(f"store [{variant.name}]", total=total)
            for conv in conversations:
                caller = conv.caller
                scope = {"org_id": caller.org_id, "assignment_id": caller.assignment_id}
                ids = defaultdict(set)
                content: dict[str, set[str]] = defaultdict(set)
                for start in range(0, len(conv.turns), batch_size):
                    batch = conv.turns[start : start + batch_size]
                    docs = [turn_document(conv.turns, t, variant.embed_context) for t in batch]
                    data: dict[str, Any] = {"mark": dict(scope)}
                    data.setdefault(entry, {})["documents"] = docs
                    result = pipe.run(data, include_outputs_from={entry} if entry != "mark" else None)
                    # The stored text is what the pipeline's first component handed on (e.g. redacted).
                    entered = result.get(entry, {}).get("documents") if entry != "mark" else None
                    texts = [d.content or "" for d in entered] if entered else [t.fact for t in batch]
                    if len(texts) != len(batch):
                        texts = [t.fact for t in batch]
                    for text, turn in zip(texts, batch, strict=True):
                        content[text].add(turn.dia_id)
                    # ScopeMarkerWriter collapses identical facts of a batch: ids come in first-seen order.
                    unique = list(dict.fromkeys(texts))
                    written = result["write"]["document_ids"]
                    for doc_id, text in zip(written, unique, strict=False):
                        ids[doc_id] |= {t.dia_id for t, x in zip(batch, texts, strict=True) if x == text}
                    bar.advance(task, len(batch))
                dia_ids[caller.assignment_id] = {k: frozenset(v) for k, v in ids.items()}
                by_content[caller.assignment_id] = {k: frozenset(v) for k, v in content.items()}
    seconds = time.perf_counter() - started
    return StoredBase(
        config=config,
        dia_ids=dia_ids,
        by_content=by_content,
        seconds=seconds,
        facts=sum(len(v) for v in dia_ids.values()),
        embedders=(doc_embedder, text_embedder),
    )


def recall_all(
    conversations: Sequence[Conversation],
    base: StoredBase,
    variant: Variant,
    top_k: int,
    show: bool,
    keep_questions: bool,
) -> VariantResult:
    """Recall every question through our recall pipeline."""
    text_embedder = base.embedders[1]
    params = dict(variant.retriever)
    config = base.config
    if "language" in params:  # a MemoryConfig setting, passed to every knowledge-base component
        config = config.model_copy(update={"language": params.pop("language")})
    pipe = build_recall_pipeline(config, text_embedder, top_k=top_k, retriever_params=params)
    pipe.warm_up()
    rows: list[tuple[int, dict[str, float]]] = []
    per_question: list[dict[str, Any]] = []
    latencies: list[float] = []
    degraded = 0
    total = sum(len(c.questions) for c in conversations)
    started = time.perf_counter()
    with progress_bar(show) as bar:
        task = bar.add_task(f"recall [{variant.name}]", total=total)
        for conv in conversations:
            caller = conv.caller
            scope = {"org_id": caller.org_id, "assignment_id": caller.assignment_id}
            ids = base.dia_ids[caller.assignment_id]
            contents = base.by_content[caller.assignment_id]
            for q in conv.questions:
                bar.advance(task)
                if not q.evidence or not q.question:
                    continue
                data: dict[str, Any] = {"retrieve": {**scope, "query": q.question, "top_k": top_k}, "acl": scope}
                if text_embedder is not None:
                    data["embed"] = {"text": q.question}
                t0 = time.perf_counter()
                result = pipe.run(data, include_outputs_from={"embed"} if text_embedder is not None else None)
                latencies.append(time.perf_counter() - t0)
                if result.get("embed", {}).get("degraded"):
                    degraded += 1
                docs: list[Document] = result["strip"]["documents"]
                ranked = [
                    ids.get(str(d.meta.get("document_id")), contents.get(d.content or "", frozenset())) for d in docs
                ]
                metrics = question_metrics(ranked, q.evidence)
                rows.append((q.category, metrics))
                if keep_questions:
                    per_question.append(
                        {
                            "sample_id": conv.sample_id,
                            "question": q.question,
                            "category": q.category,
                            "evidence": list(q.evidence),
                            "top": [sorted(r) for r in ranked[:10]],
                            **metrics,
                        }
                    )
    seconds = time.perf_counter() - started
    timing = {
        "store_seconds": round(base.seconds, 2),
        "facts": base.facts,
        "store_facts_per_second": round(base.facts / base.seconds, 1) if base.seconds else None,
        "recall_seconds": round(seconds, 2),
        "queries": len(latencies),
        "latency": latency_summary(latencies),
        "degraded_queries": degraded,
    }
    settings = {
        "embedder": variant.embedder,
        "retriever": variant.retriever,
        "embed_context": variant.embed_context,
        "top_k": top_k,
    }
    return VariantResult(variant.name, variant.description, aggregate(rows), timing, settings, per_question)
