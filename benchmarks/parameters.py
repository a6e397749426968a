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
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.workload import two_ways, two_ways_main
from haystack_osa_memory.store import fact_writing, facts, scope_query
from haystack_osa_memory.store.parameters import text_array, vector_parameter
from haystack_osa_memory.store.recall_rows import vector_literal


def use_binary(binary: bool) -> None:
    """The parameter builders the store modules call: the binary ones, or the text forms they replaced."""
    facts.vector_parameter = vector_parameter if binary else vector_literal  # type: ignore[assignment]
    fact_writing.vector_parameter = vector_parameter if binary else vector_literal  # type: ignore[assignment]
    facts.text_array = text_array if binary else list  # type: ignore[assignment]
    scope_query.text_array = text_array if binary else list  # type: ignore[assignment]


WAYS = ("text", "binary")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Seed a fresh knowledge base, then the alternating blocks (see the module's docstring)."""
    return two_ways(args, "params", WAYS, lambda _memory: use_binary)


def main(argv: list[str] | None = None) -> int:
    defaults = {"assignments": 4, "block": 100, "rounds": 30, "warmup": 30}
    return two_ways_main(argv, __doc__, WAYS, run, defaults=defaults)


if __name__ == "__main__":
    raise SystemExit(main())
