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
import random
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import machine_info
from benchmarks.workload import (
    add_block_arguments,
    alternating_blocks,
    caller_of,
    check_block_arguments,
    fact_text,
    knowledge_base,
    paired_medians,
    query_text,
    seed,
)
from haystack_osa_memory import Memory
from haystack_osa_memory.store import fact_writing, facts, scope_query
from haystack_osa_memory.store.parameters import text_array, vector_parameter
from haystack_osa_memory.store.recall_rows import vector_literal


def use_binary(binary: bool) -> None:
    """The parameter builders the store modules call: the binary ones, or the text forms they replaced."""
    facts.vector_parameter = vector_parameter if binary else vector_literal  # type: ignore[assignment]
    fact_writing.vector_parameter = vector_parameter if binary else vector_literal  # type: ignore[assignment]
    facts.text_array = text_array if binary else list  # type: ignore[assignment]
    scope_query.text_array = text_array if binary else list  # type: ignore[assignment]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Seed a fresh knowledge base, then the alternating blocks (see the module's docstring)."""
    rnd = random.Random(5)
    with knowledge_base("params", args.embedder) as (config, postmaster):
        memory = Memory(config, use_default_embedders=args.embedder != "none")
        callers = [caller_of(a) for a in range(args.assignments)]
        seed(memory, callers, args.facts, rnd)
        count = 0

        def call(_binary: bool) -> None:  # the way is switched per block (`use_binary`)
            nonlocal count
            a, count = count % len(callers), count + 1
            if args.phase == "recall":
                memory.recall(query_text(a, rnd), limit=8, caller=callers[a])
            else:
                memory.store(fact_text(a, 5 * 10**6 + count, rnd), caller=callers[a])

        try:
            samples = alternating_blocks(
                call, postmaster, warmup=args.warmup, block=args.block, rounds=args.rounds, switch=use_binary
            )
        finally:
            use_binary(True)  # as the package ships
    result: dict[str, Any] = {"embedder": args.embedder, "phase": args.phase, "block": args.block}
    result["rounds"] = args.rounds
    for part, (text, binary, paired) in paired_medians(samples).items():
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
