"""Small scopes' rows kept in memory (`store/scope_memo.py`) against the exact path, in one process, blocks
alternating.

With the memo, a recall reads its scope's print with its query's words (one statement) and ranks the rows
kept; without it, the query's words and then the whole scope (`SCOPE_ROWS`), every time. A store searches the
facts it may replace through the same path and then changes the scope, so its next search finds the print
changed (and, after that, skips it for a while: `MAX_SKIPS`). The two ways differ by a few hundred
microseconds per call, less than this shared VM drifts between two runs, so they are compared in one process
on one seeded knowledge base: blocks of ``--block`` calls, exact then memo, then memo then exact, ``--rounds``
times, switching the repository's memo off and on between blocks. It prints the median CPU per call of this
process and of the database cluster's processes, per way, their ratio and the median of the paired
differences, and how the memo answered (scopes read, recalls answered from memory, prints that found a
change).

    python benchmarks/scope_memo.py --embedder none --phase recall [--block 100 --rounds 10] [--json out.json]
    python benchmarks/scope_memo.py --embedder minilm --phase store --block 40 --rounds 8
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Seed a fresh knowledge base, then the alternating blocks (see the module's docstring)."""
    rnd = random.Random(5)
    with knowledge_base("memo", args.embedder) as (config, postmaster):
        memory = Memory(config, use_default_embedders=args.embedder != "none")
        callers = [caller_of(a) for a in range(args.assignments)]
        seed(memory, callers, args.facts, rnd)
        memory.warm_up()
        assert memory.kb is not None
        repo = memory.kb.facts
        memo = repo.scope_memo
        if memo is None:
            msg = "the memo is off (OSA_MEMORY_SCOPE_CACHE_FACTS=0): nothing to compare"
            raise SystemExit(msg)
        count = 0

        def call(_kept: bool) -> None:  # the way is switched per block (`switch`)
            nonlocal count
            a, count = count % len(callers), count + 1
            if args.phase == "recall":
                memory.recall(query_text(a, rnd), limit=8, caller=callers[a])
            else:
                memory.store(fact_text(a, 5 * 10**6 + count, rnd), caller=callers[a])

        def switch(kept: bool) -> None:
            repo.scope_memo = memo if kept else None

        try:
            samples = alternating_blocks(
                call, postmaster, warmup=args.warmup, block=args.block, rounds=args.rounds, switch=switch
            )
        finally:
            repo.scope_memo = memo
    result: dict[str, Any] = {"embedder": args.embedder, "phase": args.phase, "block": args.block}
    result["rounds"] = args.rounds
    result["memo"] = {"reads": memo.reads, "hits": memo.hits, "changed": memo.changed}
    for part, (exact, kept, paired) in paired_medians(samples).items():
        result[part] = {"exact_ms": exact, "memo_ms": kept, "ratio": kept / exact if exact else None}
        result[part]["paired_difference_ms"] = paired
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_block_arguments(parser, assignments=16, block=100, rounds=10, warmup=60)
    parser.add_argument("--phase", choices=["recall", "store"], default="recall")
    args = parser.parse_args(argv)
    check_block_arguments(parser, args)
    result = run(args)
    print(f"{args.embedder} {args.phase}, {args.rounds} pairs of {args.block}-call blocks, CPU ms per call:")
    for part in ("server", "postgres", "total"):
        r = result[part]
        ratio = f"{r['ratio']:.3f}x" if r["ratio"] is not None else "n/a"
        print(
            f"  {part:8} exact {r['exact_ms']:.3f}  memo {r['memo_ms']:.3f}  ratio {ratio}"
            f"  median paired difference {r['paired_difference_ms']:+.3f}"
        )
    m = result["memo"]
    print(f"  memo: {m['reads']} scopes read, {m['hits']} recalls from memory, {m['changed']} prints found a change")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "result": result}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
