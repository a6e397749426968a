"""The MiniLM embedders on ONNX Runtime against torch, in one process, rounds alternating.

The product's pair in each runtime: queries in int8 (`MiniLMTextEmbedder`, one text per call, as a recall
embeds), stored facts (`MiniLMDocumentEmbedder.run` on one fact per call, as a store embeds) in ``--torch-facts``
(default float16, torch's default before ONNX Runtime) and ``--onnx-facts`` (default
`MemoryConfig().document_precision`). Every runtime on one
intra-op thread (as `osa-memory serve` runs them). Rounds alternate the runtimes (torch then ONNX Runtime, then
the other way), each round embedding every query and every fact once; it prints the median CPU milliseconds per
query and per fact of each runtime, their ratio, and each runtime's cosines with torch's float32 vectors of the
same texts (the sentence-transformers vectors).

Texts: LoCoMo questions and turns from ``--data`` (read at run time, never copied), else `load.py`'s
synthetic questions and facts.

    python benchmarks/runtimes.py [--data ../shared/data/locomo/locomo_dev.json] [--queries 300 --facts 200]
        [--rounds 4] [--torch-facts float16] [--onnx-facts mixed] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, get_args

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.workload import embedding_run, embedding_texts_main, one_thread_texts
from haystack_osa_memory.config import Precision

RUNTIMES = ("torch", "onnx")


def cpu_ms(call: Callable[[str], object], items: Sequence[str]) -> float:
    started = time.process_time()
    for item in items:
        call(item)
    return (time.process_time() - started) / len(items) * 1000


def cosines(vectors: Sequence[Sequence[float]], reference: Sequence[Sequence[float]]) -> dict[str, float]:
    import numpy as np

    got, want = np.asarray(vectors), np.asarray(reference)
    cos = (got * want).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    return {"min": float(cos.min()), "median": float(np.median(cos))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    questions, turns = one_thread_texts(args)
    from haystack import Document

    from haystack_osa_memory import MemoryConfig
    from haystack_osa_memory.components.minilm_embedders import (
        BUNDLED_MODEL,
        MiniLMDocumentEmbedder,
        MiniLMTextEmbedder,
    )

    config = MemoryConfig()
    facts = {"torch": args.torch_facts, "onnx": args.onnx_facts or config.document_precision}
    query = {r: MiniLMTextEmbedder(model=BUNDLED_MODEL, precision=config.query_precision, runtime=r) for r in RUNTIMES}
    store = {r: MiniLMDocumentEmbedder(model=BUNDLED_MODEL, precision=facts[r], runtime=r) for r in RUNTIMES}
    reference_query = MiniLMTextEmbedder(model=BUNDLED_MODEL)
    reference_store = MiniLMDocumentEmbedder(model=BUNDLED_MODEL)
    loaded: dict[str, Any] = {}
    for r in RUNTIMES:
        for kind, embedder in (("query", query[r]), ("fact", store[r])):
            embedder.warm_up()
            assert embedder._backend is not None
            loaded[f"{r} {kind}"] = {"runtime": embedder._backend.runtime, "precision": embedder._backend.precision}
    reference_query.warm_up()
    reference_store.warm_up()

    def embed_query(r: str) -> Callable[[str], object]:
        return lambda text: query[r].run(text=text)

    def embed_fact(r: str) -> Callable[[str], object]:
        return lambda text: store[r].run(documents=[Document(content=text)])

    for r in RUNTIMES:  # warm-up: first passes allocate
        cpu_ms(embed_query(r), questions[:10])
        cpu_ms(embed_fact(r), turns[:10])
    samples: dict[str, dict[str, list[float]]] = {kind: {r: [] for r in RUNTIMES} for kind in ("query", "fact")}
    for n in range(args.rounds):
        for r in RUNTIMES if n % 2 == 0 else tuple(reversed(RUNTIMES)):
            samples["query"][r].append(cpu_ms(embed_query(r), questions))
            samples["fact"][r].append(cpu_ms(embed_fact(r), turns))
    want_q = [reference_query.run(text=t)["embedding"] for t in questions]
    want_f = [d.embedding for d in reference_store.run(documents=[Document(content=t) for t in turns])["documents"]]
    result: dict[str, Any] = {**embedding_run(args, questions, turns), "loaded": loaded}
    for kind, items, want in (("query", questions, want_q), ("fact", turns, want_f)):
        per: dict[str, Any] = {}
        for r in RUNTIMES:
            if kind == "query":
                got = [query[r].run(text=t)["embedding"] for t in items]
            else:
                got = [store[r].run(documents=[Document(content=t)])["documents"][0].embedding for t in items]
            per[r] = {
                "cpu_ms": statistics.median(samples[kind][r]),
                "rounds_ms": samples[kind][r],
                "cosine_to_float32": cosines(got, want),
            }
        per["ratio"] = per["onnx"]["cpu_ms"] / per["torch"]["cpu_ms"]
        result[kind] = per
    return result


def report(result: dict[str, Any]) -> None:
    m = result["machine"]
    machine = f"{m.get('cpu_model')} ({m.get('cores')} cores)"
    print(f"{machine}; {result['texts']} texts, {result['rounds']} rounds alternating")
    for name, how in result["loaded"].items():
        print(f"  {name}: {how['runtime']} {how['precision']}")
    print(f"{'':8s} {'torch CPU ms':>13s} {'onnx CPU ms':>12s} {'ratio':>7s}   cosine to float32 (min / median)")
    for kind in ("query", "fact"):
        k = result[kind]
        cos = "   ".join(
            f"{r} {k[r]['cosine_to_float32']['min']:.4f} / {k[r]['cosine_to_float32']['median']:.4f}" for r in RUNTIMES
        )
        print(f"{kind:8s} {k['torch']['cpu_ms']:13.3f} {k['onnx']['cpu_ms']:12.3f} {k['ratio']:6.3f}x   {cos}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    def more(parser: argparse.ArgumentParser) -> None:
        precisions = list(get_args(Precision))
        parser.add_argument(
            "--torch-facts", choices=precisions, default="float16", help="torch's stored-fact precision"
        )
        parser.add_argument("--onnx-facts", choices=precisions, default=None, help="default: the product's")

    return embedding_texts_main(argv, __doc__, run, report, rounds=4, more=more)


if __name__ == "__main__":
    main()
