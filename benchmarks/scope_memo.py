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
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.workload import two_ways, two_ways_main
from haystack_osa_memory import Memory
from haystack_osa_memory.store.scope_memo import ScopeMemo

WAYS = ("exact", "memo")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Seed a fresh knowledge base, then the alternating blocks (see the module's docstring)."""
    kept: list[ScopeMemo] = []

    def switch(memory: Memory) -> Callable[[bool], None]:
        assert memory.kb is not None
        repo = memory.kb.facts
        if repo.scope_memo is None:
            msg = "the memo is off (OSA_MEMORY_SCOPE_CACHE_FACTS=0): nothing to compare"
            raise SystemExit(msg)
        kept.append(repo.scope_memo)

        def to(on: bool) -> None:
            repo.scope_memo = kept[0] if on else None

        return to

    result = two_ways(args, "memo", WAYS, switch)
    memo = kept[0]
    result["memo"] = {"reads": memo.reads, "hits": memo.hits, "changed": memo.changed}
    return result


def report(result: dict[str, Any]) -> None:
    m = result["memo"]
    print(f"  memo: {m['reads']} scopes read, {m['hits']} recalls from memory, {m['changed']} prints found a change")


def main(argv: list[str] | None = None) -> int:
    defaults = {"assignments": 16, "block": 100, "rounds": 10, "warmup": 60}
    return two_ways_main(argv, __doc__, WAYS, run, defaults=defaults, report=report)


if __name__ == "__main__":
    raise SystemExit(main())
