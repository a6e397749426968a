"""Binary statement parameters against the text forms they replaced, in one process, blocks alternating.

`store.parameters` sends embeddings as binary ``float4[]`` and id and status lists as binary ``text[]``;
before, an embedding went as pgvector's text form (`recall_rows.vector_literal`) and lists through psycopg's
list dumper. The two ways differ in a few hundred microseconds per call, less than this shared VM drifts
between two runs, so they are compared in one process on one seeded knowledge base: blocks of ``--block``
calls, text then binary, then binary then text, ``--rounds`` times, switching the modules' parameter
builders between blocks. It prints the median CPU per call of this process (the server's side) and of the
database cluster's processes, per way, their ratio and the median of the paired differences.

    python benchmarks/parameters.py --embedder none --phase recall [--block 100 --rounds 30] [--json out.json]
    python benchmarks/parameters.py --embedder minilm --phase store --block 40 --rounds 24
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from haystack_osa_memory import Memory, MemoryConfig, use_lean_input_copies
from haystack_osa_memory.store import fact_writing, facts, scope_query
from haystack_osa_memory.store.parameters import text_array, vector_parameter
from haystack_osa_memory.store.recall_rows import vector_literal
from haystack_osa_memory.transfer import ImportItem


def use_binary(binary: bool) -> None:
    """The parameter builders the store modules call: the binary ones, or the text forms they replaced."""
    facts.vector_parameter = vector_parameter if binary else vector_literal  # type: ignore[assignment]
    fact_writing.vector_parameter = vector_parameter if binary else vector_literal  # type: ignore[assignment]
    facts.text_array = text_array if binary else list  # type: ignore[assignment]
    scope_query.text_array = text_array if binary else list  # type: ignore[assignment]


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    use_lean_input_copies()  # as `serve` runs
    rnd = random.Random(5)
    with database("osa-parameters-") as conn_str:
        suffix = uuid.uuid4().hex[:8]
        config = MemoryConfig(
            pg_conn_str=conn_str, kb_schema=f"params_{suffix}", memory_schema=f"params_{suffix}", embedder=args.embedder
        )
        with fresh_schema(conn_str, config):
            return measure(args, config, postmaster_pid(conn_str), rnd)


def measure(
    args: argparse.Namespace, config: MemoryConfig, postmaster: int | None, rnd: random.Random
) -> dict[str, Any]:
    """Seed ``config``'s knowledge base, then the alternating blocks (see the module's docstring)."""
    memory = Memory(config, use_default_embedders=args.embedder != "none")
    callers = [caller_of(a) for a in range(args.assignments)]
    for a, caller in enumerate(callers):
        texts = [fact_text(a, n, rnd) for n in range(args.facts)]
        memory.import_items([ImportItem(t, f"seed:{n}", topic="load") for n, t in enumerate(texts)], caller=caller)
    count = 0

    def call() -> None:
        nonlocal count
        a, count = count % len(callers), count + 1
        if args.phase == "recall":
            memory.recall(query_text(a, rnd), limit=8, caller=callers[a])
        else:
            memory.store(fact_text(a, 5 * 10**6 + count, rnd), caller=callers[a])

    def block(binary: bool, calls: int, record: Callable[[float, float], None] | None = None) -> None:
        use_binary(binary)
        db, cpu = cluster_cpu_s(postmaster), time.process_time()
        for _ in range(calls):
            call()
        if record is not None:
            record((time.process_time() - cpu) / calls * 1000, (cluster_cpu_s(postmaster) - db) / calls * 1000)

    for binary in (True, False):  # warm both ways
        block(binary, args.warmup)
    samples: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    try:
        for r in range(args.rounds):
            for binary in (False, True) if r % 2 == 0 else (True, False):
                block(binary, args.block, lambda s, d, b=binary: samples[b].append((s, d)))
    finally:
        use_binary(True)  # as the package ships
    return summary(samples, args)


def summary(samples: dict[bool, list[tuple[float, float]]], args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"embedder": args.embedder, "phase": args.phase, "block": args.block}
    result["rounds"] = args.rounds
    for part, pick in (
        ("server", lambda x: x[0]),
        ("postgres", lambda x: x[1]),
        ("total", lambda x: x[0] + x[1]),
    ):
        text = statistics.median(pick(x) for x in samples[False])
        binary = statistics.median(pick(x) for x in samples[True])
        paired = statistics.median(pick(b) - pick(t) for b, t in zip(samples[True], samples[False], strict=True))
        result[part] = {"text_ms": text, "binary_ms": binary, "ratio": binary / text if text else None}
        result[part]["paired_difference_ms"] = paired
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_block_arguments(parser, assignments=4, block=100, rounds=30, warmup=30)
    parser.add_argument("--phase", choices=["recall", "store"], default="recall")
    args = parser.parse_args(argv)
    check_block_arguments(parser, args)
    result = run(args)
    print(f"{args.embedder} {args.phase}, {args.rounds} pairs of {args.block}-call blocks, CPU ms per call:")
    for part in ("server", "postgres", "total"):
        r = result[part]
        ratio = f"{r['ratio']:.3f}x" if r["ratio"] is not None else "n/a"
        print(
            f"  {part:8} text {r['text_ms']:.3f}  binary {r['binary_ms']:.3f}  ratio {ratio}"
            f"  median paired difference {r['paired_difference_ms']:+.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "result": result}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
