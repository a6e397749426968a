"""A call's statements prepared or not, in one process, blocks alternating.

With ``prepared_statements`` on (the default), psycopg prepares each statement on a connection's second run of it
and PostgreSQL plans it for its own parameters every time (``plan_cache_mode = force_custom_plan``): it skips
parsing and analysing the statement again, not its planning. This benchmark seeds one knowledge base and recalls
or stores (``--phase``) in blocks of ``--block`` calls, every pooled connection's ``prepare_threshold`` switched
between psycopg's "never" and the package's setting before each block, ``--rounds`` times; it prints the median
CPU per call of this process and of the database cluster, each way, their ratio and the median paired difference.

    python benchmarks/prepared_statements.py --phase store [--embedder minilm] [--block 300 --rounds 10]
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
from haystack_osa_memory.store.database import PREPARE_AFTER, get_pool

WAYS = ("unprepared", "prepared")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Seed a fresh knowledge base, then the alternating blocks (see the module's docstring)."""

    def to(memory: Memory) -> Callable[[bool], None]:
        store = memory.kb
        assert store is not None
        pool = get_pool(store.conn_str, store.config)

        def switch(prepared: bool) -> None:
            # Calls run one at a time here: between blocks every connection of the pool is idle in it.
            for conn in list(pool._pool):
                conn.prepare_threshold = PREPARE_AFTER if prepared else None

        return switch

    return two_ways(args, "prepared", WAYS, to)


def main(argv: list[str] | None = None) -> int:
    defaults = {"assignments": 16, "block": 300, "rounds": 10, "warmup": 100}
    return two_ways_main(argv, __doc__, WAYS, run, defaults=defaults)


if __name__ == "__main__":
    raise SystemExit(main())
