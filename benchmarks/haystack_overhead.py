"""Haystack's own work around a recall's components, its way and ours, in one process, blocks alternating.

Two parts of it, each measured alone (``--part``), the pipelines unchanged:

- ``spans``: the span `Pipeline.run` opens around each component, its tags built (Haystack's builder) or not
  while no tracer records them (`pipeline_spans.lean_component_span`);
- ``documents``: the facts recall returns built through Haystack's `Document` constructor and
  `dataclasses.replace` (which track every field they set) or directly (`FactDocument.of`, `with_content`);
- ``copies``: the plain documents a store's pipeline passes on (with the fact's embedding) copied for each
  component by `copy.deepcopy` or field by field (`pipeline_inputs.copy_document`).

Blocks of ``--block`` recalls (or stores, ``--phase``), Haystack's way then ours, then the other way round,
``--rounds`` times on one seeded knowledge base; it prints the median CPU per call of this process and of the
database cluster, each way, their ratio and the median of the paired differences.

    python benchmarks/haystack_overhead.py --part spans [--embedder minilm] [--block 300 --rounds 10]
    python benchmarks/haystack_overhead.py --part documents
    python benchmarks/haystack_overhead.py --part copies --phase store --embedder minilm
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from haystack import Document
from haystack.core.pipeline.base import PipelineBase

import haystack_osa_memory.pipeline_inputs as pipeline_inputs
from benchmarks.workload import two_ways, two_ways_main
from haystack_osa_memory import Memory
from haystack_osa_memory.components.fact_document import FactDocument
from haystack_osa_memory.pipeline_spans import _HAYSTACK_SPAN, lean_component_span

WAYS = ("haystack", "lean")


def _constructed(cls: type[FactDocument], *, id: str, content: str, meta: dict[str, Any], score: Any = None) -> Any:
    return cls(id=id, content=content, meta=meta, score=score)


def _replaced(self: FactDocument, content: str) -> FactDocument:
    return dataclasses.replace(self, content=content)


def _deep_copied(doc: Document) -> Document:
    return copy.deepcopy(doc)


#: Each part's attributes switched between the ways: (class or module, attribute, Haystack's way, the package's way).
PARTS: dict[str, list[tuple[Any, str, Any, Any]]] = {
    "spans": [
        (PipelineBase, "_create_component_span", staticmethod(_HAYSTACK_SPAN), staticmethod(lean_component_span)),
    ],
    "documents": [
        (FactDocument, "of", classmethod(_constructed), FactDocument.__dict__["of"]),
        (FactDocument, "with_content", _replaced, FactDocument.__dict__["with_content"]),
    ],
    "copies": [(pipeline_inputs, "copy_document", _deep_copied, pipeline_inputs.copy_document)],
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Seed a fresh knowledge base, then the alternating blocks (see the module's docstring)."""

    def switch(lean: bool) -> None:
        for cls, name, haystacks, ours in PARTS[args.part]:
            setattr(cls, name, ours if lean else haystacks)

    def to(memory: Memory) -> Callable[[bool], None]:
        return switch

    result = two_ways(args, f"hs_{args.part}", WAYS, to)
    result["part"] = args.part
    return result


def main(argv: list[str] | None = None) -> int:
    defaults = {"assignments": 4, "block": 300, "rounds": 10, "warmup": 50}

    def more(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--part", choices=list(PARTS), default="spans", help="which of Haystack's work to compare")

    def report(result: dict[str, Any]) -> None:
        print(f"  part: {result['part']} (haystack: Haystack's own; lean: the package's)")

    return two_ways_main(argv, __doc__, WAYS, run, defaults=defaults, report=report, more=more)


if __name__ == "__main__":
    raise SystemExit(main())
