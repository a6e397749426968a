"""LoCoMo retrieval benchmark: does recall find the dialog turns that answer a question?

Usage::

    python benchmarks/locomo.py --data ../shared/data/locomo/locomo_dev.json [--json out.json]
                                [--limit-conversations N] [--embedder minilm|none]
                                [--variant NAME ...] [--rrf-k 60 --lexical-weight 1 ...]
                                [--store-through memory --reflect]

``PG_CONN_STR`` selects the database (a fresh schema per stored variant, dropped at the end);
when it is unset, an embedded PostgreSQL + pgvector is started in a temporary directory and
deleted afterwards. The data is read at run time and never copied.

Protocol (see ``../shared/data/locomo/README.md``; no LLM anywhere)
--------------------------------------------------------------------
- Each conversation is one assignment: ``Caller(org_id="locomo", assignment_id=<sample_id sanitised>)``.
- Every turn is stored as one fact ``"(<session date>) <speaker>: <text>"`` through OUR store
  pipeline (``build_store_pipeline``: [PrivacyRedactor ->] document embedder -> ScopeMarkerWriter ->
  GovernedFactWriter), run on batches of turns of one conversation (``--batch-size``).
- Every question is recalled through OUR recall pipeline (``build_recall_pipeline``: guarded text
  embedder -> ScopedMemoryRetriever -> GoverningRowAclFilter -> ScopeMarkerStripper) in its own
  assignment, top ``--top-k`` (50) facts.
- Returned facts are mapped back to dia_ids by their document id (store results) or content.
  Evidence ids are normalised: split on ';', leading zeros and stray colons removed
  (``"D8:6; D9:17"``, ``"D30:05"``, ``"D:11:26"``); ids that name no turn of the conversation
  (``"D"``) are dropped and counted. Questions without evidence are not scored.
- recall@k = share of the question's evidence turns among the top k facts, averaged over the
  questions; MRR = 1 / rank of the first evidence turn (0 beyond ``--top-k``); nDCG@10 with binary
  relevance. Reported for all categories, without category 5 (adversarial), and per category.

With ``--reflect`` the questions are recalled once more after reflect (``Memory.reflect``, as
``kb_memory_reflect``) ran on every conversation: an observation counts as a hit for the turns of its
evidence, and the questions whose R@10 fell are counted.

Variants
--------
``--variant NAME`` (repeatable) runs named configurations on the same data; see ``--list-variants``.
Without ``--variant`` one configuration is built from ``--embedder`` and the retriever flags. Every
variant is the product's pipelines with ``ScopedMemoryRetriever`` parameters (an ablation of the
product default: ``before`` is the product before the recall-quality work, each later variant adds
one idea); ``context-embed`` also embeds each turn with its ``embed_context`` previous turns at
store time (``meta_fields_to_embed`` of the MiniLM document embedder; the stored text is unchanged).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from haystack import Document, Pipeline
from psycopg import sql
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from haystack_osa_memory import Caller, Memory, MemoryConfig, MiniLMDocumentEmbedder
from haystack_osa_memory.builders import build_recall_pipeline, build_store_pipeline
from haystack_osa_memory.embedders import build_embedders
from haystack_osa_memory.markers import IDENTIFIER_PATTERN, MARKER_LOOKALIKE
from haystack_osa_memory.store.database import close_pools, scratch_database
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.validation import FACT_MAX

ORG = "locomo"
KS = (1, 5, 10, 20, 50)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
# Wide enough for the per-category table when the output is a file or a pipe.
console = Console(width=None if sys.stdout.isatty() else 132)


# --------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Turn:
    """One dialog turn, in conversation order (``position`` counts from 0 over all sessions)."""

    dia_id: str
    speaker: str
    text: str
    date: str
    session: int
    position: int
    caption: str | None = None

    @property
    def fact(self) -> str:
        """The stored fact: ``"(<session date>) <speaker>: <text>"`` (no date prefix when the session has none)."""
        prefix = f"({self.date}) " if self.date else ""
        return f"{prefix}{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Question:
    question: str
    evidence: tuple[str, ...]
    category: int


@dataclass
class Conversation:
    sample_id: str
    assignment_id: str
    turns: list[Turn]
    questions: list[Question]
    dropped_evidence: int = 0
    skipped_turns: int = 0

    @property
    def caller(self) -> Caller:
        return Caller(org_id=ORG, assignment_id=self.assignment_id)


_DIA_ID = re.compile(r"D:*0*(\d+):+0*(\d+):*")


def normalise_dia_id(raw: object) -> str:
    """``"D30:05"`` -> ``"D30:5"``, ``"D:11:26"`` -> ``"D11:26"``; anything else is returned stripped."""
    text = re.sub(r"\s+", "", str(raw))
    match = _DIA_ID.fullmatch(text)
    if match is None:
        return text
    return f"D{int(match.group(1))}:{int(match.group(2))}"


def split_evidence(raw: object) -> list[str]:
    """Evidence ids of one QA item, normalised (``"D8:6; D9:17"`` is two ids), order kept, no duplicates."""
    items = raw if isinstance(raw, list) else [raw] if raw else []
    out: list[str] = []
    for item in items:
        for part in str(item).split(";"):
            dia = normalise_dia_id(part)
            if dia and dia not in out:
                out.append(dia)
    return out


def sanitise_assignment_id(sample_id: str, taken: set[str]) -> str:
    """An assignment id allowed by ``IDENTIFIER_PATTERN`` and unique in this run."""
    base = re.sub(r"[^A-Za-z0-9._:@-]+", "-", sample_id).lstrip("._:@-")[:100] or "conv"
    candidate, n = base, 1
    while candidate in taken or not IDENTIFIER_PATTERN.fullmatch(candidate):
        n += 1
        candidate = f"{base}-{n}"
    taken.add(candidate)
    return candidate


def _session_number(key: str) -> int | None:
    match = re.fullmatch(r"session_(\d+)", key)
    return int(match.group(1)) if match else None


def load_locomo(path: Path, limit_conversations: int | None = None) -> list[Conversation]:
    """Read a LoCoMo-format file: a list of ``{sample_id, conversation, qa}`` samples."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(raw, dict):  # a single sample
        raw = [raw]
    if not isinstance(raw, list):
        msg = f"{path}: expected a list of LoCoMo samples"
        raise ValueError(msg)
    taken: set[str] = set()
    conversations = []
    for index, sample in enumerate(raw[:limit_conversations] if limit_conversations else raw):
        conv = sample["conversation"]
        sessions = sorted(
            (n, value)
            for key, value in conv.items()
            if (n := _session_number(key)) is not None and isinstance(value, list)
        )
        turns: list[Turn] = []
        skipped = 0
        for n, session in sessions:
            date = str(conv.get(f"session_{n}_date_time") or "").strip()
            for item in session:
                text = str(item.get("text") or "").strip()
                turn = Turn(
                    dia_id=normalise_dia_id(item.get("dia_id", f"D{n}:{len(turns) + 1}")),
                    speaker=str(item.get("speaker") or "?").strip(),
                    text=text,
                    date=date,
                    session=n,
                    position=len(turns),
                    caption=(str(item["blip_caption"]).strip() or None) if item.get("blip_caption") else None,
                )
                if not text or len(turn.fact) > FACT_MAX or MARKER_LOOKALIKE.search(turn.fact):
                    skipped += 1  # our store refuses it (empty, too long, or a scope-marker look-alike)
                    continue
                turns.append(turn)
        known = {t.dia_id for t in turns}
        questions, dropped = [], 0
        for qa in sample.get("qa", []):
            evidence = split_evidence(qa.get("evidence"))
            kept = tuple(e for e in evidence if e in known)
            dropped += len(evidence) - len(kept)
            category = int(qa.get("category", 0) or 0)
            questions.append(Question(question=str(qa.get("question", "")).strip(), evidence=kept, category=category))
        sample_id = str(sample.get("sample_id") or f"conv-{index + 1}")
        conversations.append(
            Conversation(
                sample_id=sample_id,
                assignment_id=sanitise_assignment_id(sample_id, taken),
                turns=turns,
                questions=questions,
                dropped_evidence=dropped,
                skipped_turns=skipped,
            )
        )
    return conversations


# ------------------------------------------------------------------------------------------ metrics


def question_metrics(ranked: Sequence[frozenset[str]], evidence: Sequence[str]) -> dict[str, float]:
    """Metrics of one question. ``ranked``: the dia_ids of each returned fact, best first."""
    wanted = set(evidence)
    out: dict[str, float] = {}
    for k in KS:
        found = set().union(*ranked[:k]) & wanted if ranked[:k] else set()
        out[f"R@{k}"] = len(found) / len(wanted)
    first = next((i for i, ids in enumerate(ranked, 1) if ids & wanted), None)
    out["MRR"] = 1.0 / first if first else 0.0
    gains = [1.0 if ids & wanted else 0.0 for ids in ranked[:10]]
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains))
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(wanted), 10)))
    out["nDCG@10"] = min(dcg / ideal, 1.0) if ideal else 0.0
    return out


METRIC_NAMES = [f"R@{k}" for k in KS] + ["MRR", "nDCG@10"]


def aggregate(rows: Sequence[tuple[int, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Mean metrics for all, without category 5, and per category. ``rows``: (category, metrics)."""
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for category, metrics in rows:
        groups["all"].append(metrics)
        if category != 5:
            groups["no-cat-5"].append(metrics)
        groups[f"cat-{category}"].append(metrics)
    out: dict[str, dict[str, float]] = {}
    for name in ["all", "no-cat-5", *sorted(g for g in groups if g.startswith("cat-"))]:
        if name not in groups:
            continue
        items = groups[name]
        out[name] = {"n": float(len(items))} | {
            m: round(statistics.fmean(x[m] for x in items), 4) for m in METRIC_NAMES
        }
    return out


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    if not seconds:
        return {}
    ordered = sorted(seconds)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))] * 1000

    return {
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
        "p50_ms": round(pct(0.50), 2),
        "p95_ms": round(pct(0.95), 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


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
    contextual = MiniLMDocumentEmbedder(model=doc_embedder.model, meta_fields_to_embed=["context"])
    return contextual, text_embedder


# ---------------------------------------------------------------------------------------- database


def database() -> AbstractContextManager[str]:
    """PG_CONN_STR, or an embedded PostgreSQL in a temporary directory (deleted afterwards)."""
    return scratch_database(prefix="osa-locomo-")


def drop_schema(conn_str: str, schema: str) -> None:
    close_pools()
    with psycopg.connect(conn_str, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


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
) -> StoredBase:
    """Store every turn through our store pipeline, in batches, into a fresh schema; with ``through_memory``,
    one turn per `Memory.store` call instead, as an agent stores through ``kb_memory_store`` (each store also
    searches for the facts it may replace and notes them, `possibly_supersedes`).

    ``embedders``: (document, text) embedders to use instead of the variant's (benchmarks/embedders.py).
    """
    schema = "locomo_" + uuid.uuid4().hex[:10]
    config = MemoryConfig(
        pg_conn_str=conn_str,
        kb_schema=schema,
        memory_schema=schema,
        embedder="minilm" if variant.embedder == "minilm" else "none",
    )
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


def reflect_base(conversations: Sequence[Conversation], base: StoredBase) -> dict[str, Any]:
    """Run reflect (`Memory.reflect`, as `kb_memory_reflect`) on every conversation's assignment of ``base``.
    From then on an observation counts as a hit for the turns of its evidence (``base.dia_ids`` gains them)."""
    memory = Memory(base.config)
    memory.warm_up()
    totals: dict[str, Any] = {"groups": 0, "observations": 0, "facts_consolidated": 0}
    started = time.perf_counter()
    for conv in conversations:
        caller = conv.caller
        report = memory.reflect(caller=caller)
        ids = dict(base.dia_ids[caller.assignment_id])
        observations = list(dict.fromkeys([*report["observations_created"], *report["observations_updated"]]))
        for obs in observations:
            evidence = memory.read(obs, caller=caller)["evidence"]
            ids[obs] = frozenset().union(*(ids.get(e, frozenset()) for e in evidence))
        base.dia_ids[caller.assignment_id] = ids
        totals["groups"] += report["groups"]
        totals["observations"] += len(report["observations_created"])
        totals["facts_consolidated"] += report["facts_consolidated"]
    totals["seconds"] = round(time.perf_counter() - started, 2)
    return totals


def lost_questions(before: VariantResult, after: VariantResult, k: int = 10) -> int:
    """Questions whose R@k is lower after reflect than before (matched by conversation and question)."""
    was = {(q["sample_id"], q["question"]): q[f"R@{k}"] for q in before.per_question}
    return sum(1 for q in after.per_question if q[f"R@{k}"] < was.get((q["sample_id"], q["question"]), 0.0))


# ------------------------------------------------------------------------------------------- report


def print_result(result: VariantResult) -> None:
    table = Table(title=f"LoCoMo recall - {result.name}: {result.description}", title_justify="left")
    table.add_column("group")
    table.add_column("n", justify="right")
    for m in METRIC_NAMES:
        table.add_column(m, justify="right")
    for group, values in result.metrics.items():
        label = group
        if group.startswith("cat-"):
            number = int(group.removeprefix("cat-"))
            label = f"{group} {CATEGORIES.get(number, '')}".strip()
        table.add_row(label, str(int(values["n"])), *(f"{values[m]:.3f}" for m in METRIC_NAMES))
    console.print(table)
    t = result.timing
    lat = t["latency"]
    console.print(
        f"  store: {t['facts']} facts in {t['store_seconds']:.1f} s ({t['store_facts_per_second']} facts/s)   "
        f"recall: {t['queries']} queries in {t['recall_seconds']:.1f} s   "
        f"latency mean {lat.get('mean_ms', 0):.1f} ms, p50 {lat.get('p50_ms', 0):.1f}, p95 {lat.get('p95_ms', 0):.1f}"
        + (f"   degraded: {t['degraded_queries']}" if t["degraded_queries"] else "")
    )


def print_summary(results: Sequence[VariantResult]) -> None:
    if len(results) < 2:
        return
    table = Table(title="LoCoMo recall - summary (all categories | without category 5)", title_justify="left")
    table.add_column("variant")
    for m in ("R@1", "R@5", "R@10", "R@20", "MRR", "nDCG@10"):
        table.add_column(m, justify="right")
    table.add_column("R@5 / R@10 w/o 5", justify="right")
    table.add_column("ms/query", justify="right")
    for r in results:
        a, b = r.metrics["all"], r.metrics.get("no-cat-5", r.metrics["all"])
        table.add_row(
            r.name,
            *(f"{a[m]:.3f}" for m in ("R@1", "R@5", "R@10", "R@20", "MRR", "nDCG@10")),
            f"{b['R@5']:.3f} / {b['R@10']:.3f}",
            f"{r.timing['latency'].get('mean_ms', 0):.1f}",
        )
    console.print(table)


# --------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--data", type=Path, help="LoCoMo-format JSON file (list of samples)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--limit-conversations", type=int, default=None, metavar="N")
    parser.add_argument("--embedder", choices=["minilm", "none"], default="minilm")
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME", help="named configuration (repeatable; 'all')"
    )
    parser.add_argument("--list-variants", action="store_true", help="print the named configurations and exit")
    parser.add_argument("--top-k", type=int, default=50, help="facts recalled per question (1..100)")
    parser.add_argument("--batch-size", type=int, default=64, help="turns per store-pipeline run")
    parser.add_argument("--rrf-k", type=int, default=None)
    parser.add_argument("--lexical-weight", type=float, default=None)
    parser.add_argument("--vector-weight", type=float, default=None)
    parser.add_argument("--bm25-k1", type=float, default=None)
    parser.add_argument("--bm25-b", type=float, default=None)
    parser.add_argument("--candidate-k", type=int, default=None)
    parser.add_argument("--fusion", choices=["rrf", "lexical_first"], default=None)
    parser.add_argument("--language", default=None, help="PostgreSQL text-search configuration (english, simple)")
    parser.add_argument(
        "--store-through",
        choices=["pipeline", "memory"],
        default="pipeline",
        help="store turns in batches through the store pipeline, or one per Memory.store call (as kb_memory_store)",
    )
    parser.add_argument(
        "--reflect",
        action="store_true",
        help="then run reflect (kb_memory_reflect) on every conversation and recall again; an observation\n"
        "counts as a hit for the turns of its evidence (result '<variant>+reflect')",
    )
    parser.add_argument("--per-question", action="store_true", help="include per-question results in the JSON")
    parser.add_argument("--keep-schema", action="store_true", help="do not drop the benchmark schemas")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if not args.list_variants and args.data is None:
        parser.error("--data is required")
    if not 1 <= args.top_k <= 100:
        parser.error("--top-k must be from 1 to 100")
    if args.reflect and (len(set(args.variant)) > 1 or "all" in args.variant):
        parser.error("--reflect changes the stored facts: give at most one --variant with it")
    unknown = [v for v in args.variant if v not in VARIANTS and v != "all"]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    return args


def custom_variant(args: argparse.Namespace) -> Variant:
    """The configuration given by --embedder and the retriever flags."""
    names = {
        "rrf_k": args.rrf_k,
        "lexical_weight": args.lexical_weight,
        "vector_weight": args.vector_weight,
        "bm25_k1": args.bm25_k1,
        "bm25_b": args.bm25_b,
        "candidate_k": args.candidate_k,
        "fusion": args.fusion,
        "language": args.language,
    }
    params = {k: v for k, v in names.items() if v is not None}
    if "candidate_k" not in params and args.top_k > 50:
        params["candidate_k"] = args.top_k
    name = "hybrid" if args.embedder == "minilm" else "lexical"
    if not params:
        description = VARIANTS["default" if args.embedder == "minilm" else "lexical"].description
    else:
        description = f"{name}: " + ", ".join(f"{k}={v}" for k, v in params.items())
    return Variant(name=name, description=description, embedder=args.embedder, retriever=params)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_variants:
        for v in VARIANTS.values():
            console.print(f"[bold]{v.name}[/bold]: {v.description}")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    names = list(VARIANTS) if "all" in args.variant else list(dict.fromkeys(args.variant))
    variants = [VARIANTS[name] for name in names] or [custom_variant(args)]
    conversations = load_locomo(args.data, args.limit_conversations)
    n_turns = sum(len(c.turns) for c in conversations)
    scored = sum(1 for c in conversations for q in c.questions if q.evidence and q.question)
    n_questions = sum(len(c.questions) for c in conversations)
    dropped = sum(c.dropped_evidence for c in conversations)
    skipped = sum(c.skipped_turns for c in conversations)
    console.print(
        f"LoCoMo: {args.data} - {len(conversations)} conversations, {n_turns} turns, {n_questions} questions "
        f"({scored} with evidence scored); {dropped} evidence id(s) naming no turn dropped"
        + (f"; {skipped} turn(s) our store refuses skipped" if skipped else "")
    )
    started = time.perf_counter()
    show = not args.no_progress
    results: list[VariantResult] = []
    with database() as conn_str:
        bases: dict[tuple[Any, ...], StoredBase] = {}
        try:
            for variant in variants:
                if variant.store_key not in bases:
                    bases[variant.store_key] = store_all(
                        conversations,
                        variant,
                        conn_str,
                        args.batch_size,
                        show,
                        through_memory=args.store_through == "memory",
                    )
                base = bases[variant.store_key]
                keep = args.per_question or args.reflect
                result = recall_all(conversations, base, variant, args.top_k, show, keep)
                print_result(result)
                results.append(result)
                if args.reflect:
                    stats = reflect_base(conversations, base)
                    after = recall_all(conversations, base, variant, args.top_k, show, keep)
                    after.name, after.description = f"{variant.name}+reflect", f"{variant.description}, after reflect"
                    stats["questions_with_lower_r10"] = lost_questions(result, after)
                    after.timing["reflect"] = stats
                    print_result(after)
                    console.print(
                        f"  reflect: {stats['groups']} groups, {stats['observations']} observations, "
                        f"{stats['facts_consolidated']} facts consolidated in {stats['seconds']:.1f} s; "
                        f"questions with a lower R@10 than before: {stats['questions_with_lower_r10']}"
                    )
                    results.append(after)
                    if not args.per_question:
                        result.per_question, after.per_question = [], []
        finally:
            if not args.keep_schema:
                for base in bases.values():
                    drop_schema(conn_str, base.config.kb_schema)
            close_pools()
    print_summary(results)
    total = time.perf_counter() - started
    console.print(f"total wall time {total:.1f} s")
    if args.json:
        report = {
            "data": str(args.data),
            "conversations": len(conversations),
            "turns": n_turns,
            "questions": n_questions,
            "scored_questions": scored,
            "dropped_evidence_ids": dropped,
            "skipped_turns": skipped,
            "top_k": args.top_k,
            "total_seconds": round(total, 1),
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
            "results": {
                r.name: {
                    "description": r.description,
                    "settings": r.settings,
                    "metrics": r.metrics,
                    "timing": r.timing,
                    **({"per_question": r.per_question} if r.per_question else {}),
                }
                for r in results
            },
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        console.print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
