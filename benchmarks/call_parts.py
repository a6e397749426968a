"""Where a call's CPU goes, part by part, in one process on one seeded knowledge base.

Two parts of a call that the served figures (`load.py --driver wrk`) cannot tell apart:

- ``--part search``: a store with the search for the facts it may replace (``possibly_supersedes``) against
  the same store without it (`MemoryConfig.suggest_supersedes` off). Blocks of ``--block`` stores, one way then
  the other, the order swapped each round, ``--rounds`` times; it prints the median CPU per store of this
  process and of the database cluster, each way, and what the search adds.
- ``--part plans``: PostgreSQL's planning and execution time of each read statement a recall and a store run,
  medians over ``--calls`` recalls and stores. Right before a statement runs, the same text runs once more
  under ``EXPLAIN (ANALYZE, SUMMARY)`` on the same connection with the same parameters (psycopg's
  ``Cursor.execute`` is wrapped for the measured calls only). Statements that write are never explained (an
  ``EXPLAIN ANALYZE`` executes them): their planning is not in the table.

    python benchmarks/call_parts.py --part search [--embedder minilm] [--block 40 --rounds 10] [--json out.json]
    python benchmarks/call_parts.py --part plans [--calls 200]

One torch thread, as each `serve` worker of a 2-CPU machine has (``OMP_NUM_THREADS``, when not set).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads

import psycopg
from psycopg import sql

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import database, fresh_schema, machine_info, postmaster_pid
from benchmarks.workload import (
    add_block_arguments,
    caller_of,
    check_block_arguments,
    cluster_cpu_s,
    fact_text,
    query_text,
)
from haystack_osa_memory import Caller, Memory, MemoryConfig, use_lean_input_copies
from haystack_osa_memory.transfer import ImportItem

#: A statement that changes data: `EXPLAIN ANALYZE` would run it, so it is never explained.
WRITES = re.compile(rb"\b(INSERT|UPDATE|DELETE|MERGE|TRUNCATE|CREATE|ALTER|DROP|LOCK|SET|ANALYZE|VACUUM)\b", re.I)
EXPLAIN = b"EXPLAIN (ANALYZE, SUMMARY ON, FORMAT JSON) "
#: Audit rows of stores: one per store (an explained write would have added a second).
STORE_AUDITS = sql.SQL("SELECT count(*) FROM {mem}.audit WHERE action = 'store'")


def seeded(memory: Memory, callers: list[Caller], facts: int, rnd: random.Random) -> None:
    for a, caller in enumerate(callers):
        items = [ImportItem(fact_text(a, n, rnd), f"seed:{n}", topic="load") for n in range(facts)]
        memory.import_items(items, caller=caller)


@contextmanager
def knowledge_base(args: argparse.Namespace) -> Iterator[tuple[MemoryConfig, int | None]]:
    """A fresh schema on the scratch database (or ``PG_CONN_STR``'s), and its cluster's postmaster."""
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    use_lean_input_copies()  # as `serve` runs
    with database("osa-call-parts-") as conn_str:
        suffix = uuid.uuid4().hex[:8]
        config = MemoryConfig(
            pg_conn_str=conn_str, kb_schema=f"parts_{suffix}", memory_schema=f"parts_{suffix}", embedder=args.embedder
        )
        with fresh_schema(conn_str, config):
            yield config, postmaster_pid(conn_str)


def search_part(args: argparse.Namespace) -> dict[str, Any]:
    """Stores with and without the search for the facts they may replace, blocks alternating."""
    rnd = random.Random(5)
    with knowledge_base(args) as (config, postmaster):
        embedders = args.embedder != "none"
        ways = {
            True: Memory(config, use_default_embedders=embedders),
            False: Memory(config.model_copy(update={"suggest_supersedes": False}), use_default_embedders=embedders),
        }
        callers = [caller_of(a) for a in range(args.assignments)]
        seeded(ways[True], callers, args.facts, rnd)
        count = 0
        answered: dict[bool, int] = {True: 0, False: 0}

        def block(search: bool, calls: int, record: Callable[[float, float], None] | None = None) -> None:
            nonlocal count
            db, cpu = cluster_cpu_s(postmaster), time.process_time()
            for _ in range(calls):
                a, count = count % len(callers), count + 1
                answer = ways[search].store(fact_text(a, 5 * 10**6 + count, rnd), caller=callers[a])
                answered[search] += "possibly_supersedes" in answer
            if record is not None:
                record((time.process_time() - cpu) / calls * 1000, (cluster_cpu_s(postmaster) - db) / calls * 1000)

        for search in (True, False):
            block(search, args.warmup)
        samples: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for r in range(args.rounds):
            for search in (False, True) if r % 2 == 0 else (True, False):
                block(search, args.block, lambda s, d, k=search: samples[k].append((s, d)))
    result: dict[str, Any] = {"embedder": args.embedder, "block": args.block, "rounds": args.rounds}
    result["answers_with_suggestions"] = {"with_search": answered[True], "without_search": answered[False]}
    for part, pick in (("server", lambda x: x[0]), ("postgres", lambda x: x[1]), ("total", lambda x: x[0] + x[1])):
        without = statistics.median(pick(x) for x in samples[False])
        with_search = statistics.median(pick(x) for x in samples[True])
        paired = statistics.median(pick(w) - pick(o) for w, o in zip(samples[True], samples[False], strict=True))
        result[part] = {"without_ms": without, "with_ms": with_search, "search_ms": paired}
        result[part]["search_share"] = paired / with_search if with_search else None
    return result


def statement_text(query: Any, conn: psycopg.Connection[Any]) -> bytes:
    if isinstance(query, bytes):
        return query
    if isinstance(query, str):
        return query.encode()
    if isinstance(query, sql.Composable):
        return query.as_bytes(conn)
    return bytes(query)


def label(text: bytes, schemas: set[str]) -> str:
    """The statement's first words, its schema names left out (the same label on every connection)."""
    words = " ".join(text.decode(errors="replace").split())
    for schema in schemas:
        words = words.replace(f'"{schema}".', "").replace(f"{schema}.", "")
    return words[:90]


def plans_part(args: argparse.Namespace) -> dict[str, Any]:
    """Planning and execution time of the read statements of ``--calls`` recalls and stores."""
    rnd = random.Random(7)
    timings: dict[str, list[tuple[float, float]]] = defaultdict(list)
    skipped: dict[str, int] = defaultdict(int)
    with knowledge_base(args) as (config, _):
        memory = Memory(config, use_default_embedders=args.embedder != "none")
        callers = [caller_of(a) for a in range(args.assignments)]
        seeded(memory, callers, args.facts, rnd)
        schemas = {config.kb_schema, config.memory_schema}

        def call(i: int) -> None:
            a = i % len(callers)
            memory.recall(query_text(a, rnd), limit=8, caller=callers[a])
            memory.store(fact_text(a, 10**6 + i, rnd), caller=callers[a])

        for i in range(args.warmup):
            call(i)
        original = psycopg.Cursor.execute

        def explained(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kwargs: Any) -> Any:
            text = statement_text(query, self.connection)
            if WRITES.search(text):
                skipped[label(text, schemas)] += 1
            elif params is not None:
                with self.connection.cursor() as cur:  # text results: the plan as JSON
                    plan = original(cur, EXPLAIN + text, params).fetchone()
                assert plan is not None
                summary = plan[0][0]
                timings[label(text, schemas)].append((summary["Planning Time"], summary["Execution Time"]))
            return original(self, query, params, **kwargs)

        psycopg.Cursor.execute = explained  # type: ignore[method-assign,assignment]
        try:
            for i in range(args.calls):
                call(args.warmup + i)
        finally:
            psycopg.Cursor.execute = original  # type: ignore[method-assign]
        with psycopg.connect(config.pg_conn_str) as conn:  # each store written once (no write was explained)
            row = conn.execute(STORE_AUDITS.format(**config.sql_names())).fetchone()
        store_audits = int(row[0]) if row else 0
    statements = [
        {
            "statement": key,
            "runs": len(runs),
            "planning_ms": statistics.median(p for p, _ in runs),
            "execution_ms": statistics.median(e for _, e in runs),
        }
        for key, runs in timings.items()
    ]
    return {
        "embedder": args.embedder,
        "calls": args.calls,
        "statements": statements,
        "not_explained": dict(skipped),
        "store_audit_rows": store_audits,
        "stores": args.warmup + args.calls,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["search", "plans"], default="search")
    add_block_arguments(parser, assignments=16, block=40, rounds=10, warmup=20)
    parser.add_argument("--calls", type=int, default=200, help="recalls and stores explained (--part plans)")
    args = parser.parse_args(argv)
    check_block_arguments(parser, args, "calls")
    if args.part == "search":
        result = search_part(args)
        print(f"{args.embedder} store, {args.rounds} pairs of {args.block}-store blocks, CPU ms per store:")
        for part in ("server", "postgres", "total"):
            r = result[part]
            share = f"{r['search_share']:.0%}" if r["search_share"] is not None else "n/a"
            print(
                f"  {part:8} without the search {r['without_ms']:.3f}  with it {r['with_ms']:.3f}"
                f"  the search (median paired difference) {r['search_ms']:+.3f} ({share})"
            )
    else:
        result = plans_part(args)
        print(f"{args.embedder}: read statements of {args.calls} recalls and stores, medians, ms:")
        for s in sorted(result["statements"], key=lambda s: -s["planning_ms"] - s["execution_ms"]):
            print(f"  plan {s['planning_ms']:.3f}  exec {s['execution_ms']:.3f}  x{s['runs']:<5} {s['statement']}")
        for key, runs in result["not_explained"].items():
            print(f"  (writes, not explained) x{runs:<5} {key}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "result": result}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
