"""LoCoMo retrieval benchmark: does recall find the dialog turns that answer a question?

Usage::

    python benchmarks/locomo.py --data ../shared/data/locomo/locomo_dev.json [--json out.json]
                                [--limit-conversations N] [--embedder minilm|none]
                                [--variant NAME ...] [--rrf-k 60 --lexical-weight 1 ...]
                                [--store-through memory --reflect]
                                [--document-precision float32|float16|int8|int8-cls|mixed]

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
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, get_args

from rich.table import Table

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import database, drop_schema, latency_summary, machine_info
from benchmarks.locomo_data import (
    CATEGORIES,
    KS,
    METRIC_NAMES,
    ORG,
    Conversation,
    Question,
    Turn,
    aggregate,
    load_locomo,
    question_metrics,
)
from benchmarks.locomo_runs import (
    VARIANTS,
    StoredBase,
    Variant,
    VariantResult,
    console,
    recall_all,
    store_all,
)
from haystack_osa_memory import Memory, MemoryConfig
from haystack_osa_memory.config import Precision
from haystack_osa_memory.store.database import close_pools

#: What the other benchmarks imported from this script before the shared code moved into the package.
__all__ = [
    "CATEGORIES",
    "KS",
    "METRIC_NAMES",
    "ORG",
    "VARIANTS",
    "Conversation",
    "Question",
    "StoredBase",
    "Turn",
    "Variant",
    "VariantResult",
    "aggregate",
    "database",
    "drop_schema",
    "latency_summary",
    "load_locomo",
    "main",
    "question_metrics",
    "recall_all",
    "store_all",
]


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
        "--document-precision",
        choices=list(get_args(Precision)),
        default=None,
        help="how the MiniLM document embedder embeds the stored turns (default: the product's\n"
        "MemoryConfig.document_precision); queries keep MemoryConfig.query_precision",
    )
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


def _precision_of(embedders: Iterable[Any]) -> str | None:
    """The MiniLM precision the embedders ran with (a GuardedTextEmbedder's inner one), comma-joined."""
    found = {getattr(getattr(e, "embedder", e), "precision", None) for e in embedders}
    return ",".join(sorted(p for p in found if p)) or None


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
    if args.embedder == "minilm":
        defaults = MemoryConfig()
        console.print(
            f"MiniLM precision: documents {args.document_precision or defaults.document_precision}, "
            f"queries {defaults.query_precision}"
        )
    machine = machine_info()
    started = time.perf_counter()
    show = not args.no_progress
    results: list[VariantResult] = []
    with database("osa-locomo-") as conn_str:
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
                        document_precision=args.document_precision,
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
            # As the stored bases' embedders ran (None: lexical).
            "document_precision": _precision_of(b.embedders[0] for b in bases.values()),
            "query_precision": _precision_of(b.embedders[1] for b in bases.values()),
            "total_seconds": round(total, 1),
            "machine": machine,
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
