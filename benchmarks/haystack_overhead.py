"""Haystack's own work around a recall's components, its way and ours, in one process, blocks alternating.

Two parts of it, each measured alone (``--part``), the pipelines unchanged:

- ``spans``: the span `Pipeline.run` opens around each component, its tags built (Haystack's builder) or not
  while no tracer records them (`pipeline_spans.lean_component_span`);
- ``documents``: the facts recall returns built through Haystack's `Document` constructor and
  `dataclasses.replace` (which track every field they set) or directly (`FactDocument.of`, `with_content`).

Blocks of ``--block`` recalls (or stores, ``--phase``), Haystack's way then ours, then the other way round,
``--rounds`` times on one seeded knowledge base; it prints the median CPU per call of this process and of the
database cluster, each way, their ratio and the median of the paired differences.

    python benchmarks/haystack_overhead.py --part spans [--embedder minilm] [--block 300 --rounds 10]
    python benchmarks/haystack_overhead.py --part documents
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.workload import two_ways, two_ways_main
from haystack_osa_memory import Memory

WAYS = ("haystack", "lean")
PARTS = ("spans", "documents")


def _spans(on: bool) -> None:
    from haystack.core.pipeline.base import PipelineBase

    from haystack_osa_memory.pipeline_spans import _HAYSTACK_SPAN, lean_component_span

    PipelineBase._create_component_span = staticmethod(lean_component_span if on else _HAYSTACK_SPAN)  # type: ignore[method-assign]


_LEAN_DOCUMENTS: dict[str, Any] = {}


def _documents(on: bool) -> None:
    from haystack_osa_memory.components.fact_document import FactDocument

    if not _LEAN_DOCUMENTS:
        _LEAN_DOCUMENTS.update(of=FactDocument.__dict__["of"], with_content=FactDocument.__dict__["with_content"])

    def constructed(cls: type[FactDocument], *, id: str, content: str, meta: dict[str, Any], score: Any = None) -> Any:
        return cls(id=id, content=content, meta=meta, score=score)

    def replaced(self: FactDocument, content: str) -> FactDocument:
        return dataclasses.replace(self, content=content)

    FactDocument.of = _LEAN_DOCUMENTS["of"] if on else classmethod(constructed)  # type: ignore[method-assign,assignment]
    FactDocument.with_content = _LEAN_DOCUMENTS["with_content"] if on else replaced  # type: ignore[method-assign]


SWITCHES: dict[str, Callable[[bool], None]] = {"spans": _spans, "documents": _documents}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Seed a fresh knowledge base, then the alternating blocks (see the module's docstring)."""
    switch = SWITCHES[args.part]

    def to(memory: Memory) -> Callable[[bool], None]:
        return switch

    result = two_ways(args, f"hs_{args.part}", WAYS, to)
    result["part"] = args.part
    return result


def main(argv: list[str] | None = None) -> int:
    defaults = {"assignments": 4, "block": 300, "rounds": 10, "warmup": 50}

    def more(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--part", choices=PARTS, default="spans", help="which of Haystack's work to compare")

    def report(result: dict[str, Any]) -> None:
        print(f"  part: {result['part']} (haystack: Haystack's own; lean: the package's)")

    return two_ways_main(argv, __doc__, WAYS, run, defaults=defaults, report=report, more=more)


if __name__ == "__main__":
    raise SystemExit(main())
