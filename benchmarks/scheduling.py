"""Haystack's own scheduling of a pipeline's components against `use_lean_scheduling`'s: what `Pipeline.run`
itself costs per run of the shipped recall and store pipelines, both ways, blocks alternating.

`Pipeline.run` works out every component's priority again after each component that leaves its queue stale
and lists each component's receivers on every run; `haystack_osa_memory.pipeline_scheduling` does both in one
pass with the same result. The difference is tens of microseconds per run, far below what a served call's
CPU scatters by, so the pipelines run here with every component's ``run`` replaced by one returning a fixed
answer (the pipelines' graphs, sockets, input copies and spans are the shipped ones; no database, no model):
what is left is Haystack's own work per run. Blocks of ``--block`` runs, Haystack's then lean, then lean then
Haystack's, ``--rounds`` times; it prints the median CPU microseconds per run of each way and the median of
the paired differences.

    python benchmarks/scheduling.py [--block 2000 --rounds 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from haystack import Document, Pipeline
from haystack.core.pipeline.base import PipelineBase

from benchmarks.harness import machine_info
from haystack_osa_memory import (
    MemoryConfig,
    build_recall_pipeline,
    build_store_pipeline,
    use_lean_component_spans,
    use_lean_input_copies,
    use_lean_scheduling,
)
from haystack_osa_memory.pipeline_scheduling import _HAYSTACK_PRIORITY, _HAYSTACK_RECEIVERS

DOCS = [Document(content=f"fact {i}", meta={"document_id": f"d{i}"}) for i in range(8)]


def stubbed(pipe: Pipeline, answers: dict[str, dict[str, Any]]) -> Pipeline:
    """``pipe`` with each component answering ``answers[name]`` at once (and warming up to nothing)."""
    for name, instance in pipe.walk():
        instance.warm_up = lambda: None
        instance.run = lambda _answer=answers[name], **_: _answer
    return pipe


def pipelines() -> dict[str, tuple[Pipeline, dict[str, Any]]]:
    """The shipped lexical recall and store pipelines, stubbed, with the inputs `Memory` gives them."""
    config = MemoryConfig(embedder="none")
    scope = {"org_id": "acme", "assignment_id": "a1"}
    recall = stubbed(
        build_recall_pipeline(config),
        {"retrieve": {"documents": DOCS}, "acl": {"documents": DOCS}, "strip": {"documents": DOCS}},
    )
    store = stubbed(
        build_store_pipeline(config),
        {
            "redact": {"documents": DOCS[:1], "redactions": 0, "redactions_by_class": {}},
            "mark": {"documents": DOCS[:1], "governing_rows": [{}]},
            "write": {"document_ids": ["d0"], "statuses": ["active"]},
        },
    )
    return {
        "recall": (recall, {"retrieve": {"query": "which vpn", "top_k": 8, **scope}, "acl": scope}),
        "store": (store, {"redact": {"documents": DOCS[:1]}, "mark": scope}),
    }


def switch(lean: bool) -> None:
    PipelineBase._calculate_priority = staticmethod(_HAYSTACK_PRIORITY)  # type: ignore[method-assign]
    PipelineBase._find_receivers_from = _HAYSTACK_RECEIVERS  # type: ignore[method-assign]
    if lean and not use_lean_scheduling():
        msg = "use_lean_scheduling() refused this Haystack (its scheduling changed): nothing to compare"
        raise SystemExit(msg)


def compare(run: Callable[[], object], block: int, rounds: int) -> dict[str, float]:
    """Microseconds of CPU per run, Haystack's way and the lean one, blocks alternating."""
    samples: dict[bool, list[float]] = {False: [], True: []}
    for lean in (False, True):  # warm-up
        switch(lean)
        for _ in range(block // 10):
            run()
    for r in range(rounds):
        for lean in (False, True) if r % 2 == 0 else (True, False):
            switch(lean)
            started = time.process_time()
            for _ in range(block):
                run()
            samples[lean].append((time.process_time() - started) / block * 1e6)
    switch(True)
    haystack, lean = statistics.median(samples[False]), statistics.median(samples[True])
    paired = statistics.median(b - a for a, b in zip(samples[False], samples[True], strict=True))
    return {"haystack_us": haystack, "lean_us": lean, "ratio": lean / haystack, "paired_difference_us": paired}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block", type=int, default=2000, help="Runs per block.")
    parser.add_argument("--rounds", type=int, default=10, help="Pairs of blocks.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.block < 1 or args.rounds < 1:
        parser.error("--block and --rounds must be 1 or more")
    use_lean_input_copies()  # as `serve` runs
    use_lean_component_spans()
    results = {}
    print(f"Pipeline.run with stubbed components, {args.rounds} pairs of {args.block}-run blocks, CPU us per run:")
    for name, (pipe, data) in pipelines().items():
        results[name] = r = compare(lambda pipe=pipe, data=data: pipe.run(data), args.block, args.rounds)
        print(
            f"  {name:6} haystack {r['haystack_us']:.1f}  lean {r['lean_us']:.1f}  ratio {r['ratio']:.3f}x"
            f"  median paired difference {r['paired_difference_us']:+.1f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "result": results}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
