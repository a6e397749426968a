"""Where a recall's or a store's PostgreSQL time goes, statement by statement (pg_stat_statements).

Starts an embedded PostgreSQL of its own with ``pg_stat_statements`` loaded (or uses ``PG_CONN_STR`` when that
server preloads it), seeds ``--assignments`` x ``--facts`` facts, runs ``--warmup`` calls in process, resets the
statistics, then runs ``--calls`` recalls or stores, round robin over the assignments. It prints, per statement,
how many times a call runs it and its execution and planning milliseconds per call (the server's own timing),
and beside them the CPU per call of the whole database cluster and of this process (/proc): what the statements'
timing leaves out of the cluster's CPU is parsing, the protocol, commits and the server's own background work.

    python benchmarks/pg_statements.py --phase store [--embedder none] [--calls 800] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import machine_info
from benchmarks.workload import cluster_cpu, cpu_spent, seeded_calls
from haystack_osa_memory.store.database import start_embedded, stop_embedded

PRELOAD = (
    "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'",
    "ALTER SYSTEM SET pg_stat_statements.track = 'all'",
    "ALTER SYSTEM SET pg_stat_statements.track_planning = on",
)
STATEMENTS = """SELECT calls, total_exec_time, total_plan_time, regexp_replace(query, '\\s+', ' ', 'g')
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time + total_plan_time DESC"""


@contextmanager
def counting_database() -> Iterator[str]:
    """``PG_CONN_STR`` when its server preloads pg_stat_statements (refused otherwise); else an embedded server in
    a temporary directory, restarted once with the extension preloaded, stopped and deleted afterwards."""
    given = os.environ.get("PG_CONN_STR")
    if given:
        with psycopg.connect(given, autocommit=True) as conn:
            row = conn.execute("SHOW shared_preload_libraries").fetchone()
            if row is None or "pg_stat_statements" not in str(row[0]):
                msg = "PG_CONN_STR's server does not preload pg_stat_statements: add it, or unset PG_CONN_STR"
                raise SystemExit(msg)
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="osa-pgss-") as tmp:
        uri = start_embedded(Path(tmp))
        with psycopg.connect(uri, autocommit=True) as conn:
            for statement in PRELOAD:
                conn.execute(statement)
        stop_embedded()  # the library is loaded at start only
        uri = start_embedded(Path(tmp))
        try:
            with psycopg.connect(uri, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            os.environ["PG_CONN_STR"] = uri
            yield uri
        finally:
            os.environ.pop("PG_CONN_STR", None)
            stop_embedded()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Seed, warm up, reset the statistics, measure (see the module's docstring)."""
    with counting_database() as uri, seeded_calls(args, "pgss") as (_, postmaster, call):
        for n in range(args.warmup):
            call(n)
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
        db, cpu = cluster_cpu(postmaster), time.process_time()
        for n in range(args.warmup, args.warmup + args.calls):
            call(n)
        cluster_ms = cpu_spent(db, cluster_cpu(postmaster)) / args.calls * 1000
        process_ms = (time.process_time() - cpu) / args.calls * 1000
        with psycopg.connect(uri, autocommit=True) as conn:
            rows = conn.execute(STATEMENTS).fetchall()
    statements = [
        {
            "runs_per_call": r[0] / args.calls,
            "exec_ms": r[1] / args.calls,
            "plan_ms": r[2] / args.calls,
            "statement": str(r[3]),
        }
        for r in rows
        if r[0] * 4 >= args.calls and "pg_stat_statements" not in str(r[3])  # a statement of the calls measured
    ]
    return {
        "phase": args.phase,
        "embedder": args.embedder,
        "calls": args.calls,
        "machine": machine_info(),
        "cluster_cpu_ms": cluster_ms,
        "process_cpu_ms": process_ms,
        "statements": statements,
    }


def report(result: dict[str, Any], width: int = 100) -> None:
    print(
        f"{result['embedder']} {result['phase']}, {result['calls']} calls: CPU ms per call, process "
        f"{result['process_cpu_ms']:.3f}, database cluster {result['cluster_cpu_ms']:.3f}"
    )
    print(f"{'runs':>5} {'exec ms':>8} {'plan ms':>8}  statement (per call)")
    timed = 0.0
    for s in result["statements"]:
        timed += s["exec_ms"] + s["plan_ms"]
        print(f"{s['runs_per_call']:5.2f} {s['exec_ms']:8.3f} {s['plan_ms']:8.3f}  {s['statement'][:width]}")
    rest = result["cluster_cpu_ms"] - timed
    print(f"statements' own time {timed:.3f} ms per call; the rest of the cluster's CPU {rest:.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=["recall", "store"], default="recall")
    parser.add_argument("--embedder", choices=["none", "minilm"], default="none")
    parser.add_argument("--assignments", type=int, default=16)
    parser.add_argument("--facts", type=int, default=60, help="facts seeded per assignment")
    parser.add_argument("--calls", type=int, default=800)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if min(args.assignments, args.facts, args.calls) < 1 or args.warmup < 0:
        parser.error("--assignments, --facts and --calls must be at least 1, --warmup at least 0")
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    result = run(args)
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
