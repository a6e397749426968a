"""The MiniLM embedders' precisions side by side in one runtime, in one process, rounds alternating.

Each precision of ``--fact-precisions`` embeds every stored fact once per round (`MiniLMDocumentEmbedder.run` on
one fact per call, as a store embeds) and each of ``--query-precisions`` every query (`MiniLMTextEmbedder.run`,
as a recall embeds), on one intra-op thread (as `osa-memory serve` runs them), the precisions' order reversed every
other round. It prints each precision's median CPU milliseconds per text, its ratio to the first precision of its
list, and its cosines with the float32 vectors of the same texts (the sentence-transformers vectors).

Texts: LoCoMo questions and turns from ``--data`` (read at run time, never copied), else `load.py`'s
synthetic questions and facts.

    python benchmarks/precisions.py [--data ../shared/data/locomo/locomo_dev.json] [--queries 300 --facts 200]
        [--rounds 4] [--runtime onnx] [--fact-precisions mixed,int8-cls,int8,float32]
        [--query-precisions int8,int8-cls] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, get_args

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.runtimes import cosines, cpu_ms
from benchmarks.workload import embedding_run, embedding_texts_main, one_thread_texts
from haystack_osa_memory.config import Precision, Runtime


def run(args: argparse.Namespace) -> dict[str, Any]:
    questions, turns = one_thread_texts(args)
    from haystack import Document

    from haystack_osa_memory.components.minilm_embedders import (
        BUNDLED_MODEL,
        MiniLMDocumentEmbedder,
        MiniLMTextEmbedder,
    )

    store = {p: MiniLMDocumentEmbedder(model=BUNDLED_MODEL, precision=p, runtime=args.runtime) for p in args.facts_of}
    query = {p: MiniLMTextEmbedder(model=BUNDLED_MODEL, precision=p, runtime=args.runtime) for p in args.queries_of}
    loaded: dict[str, Any] = {}
    for kind, embedders in (("fact", store), ("query", query)):
        for p, embedder in embedders.items():
            embedder.warm_up()
            assert embedder._backend is not None
            loaded[f"{kind} {p}"] = {"runtime": embedder._backend.runtime, "precision": embedder._backend.precision}
    reference_store = MiniLMDocumentEmbedder(model=BUNDLED_MODEL)
    reference_query = MiniLMTextEmbedder(model=BUNDLED_MODEL)

    def embed(kind: str, p: str) -> Any:
        if kind == "fact":
            return lambda text: store[p].run(documents=[Document(content=text)])
        return lambda text: query[p].run(text=text)

    ways = [("fact", p, turns) for p in args.facts_of] + [("query", p, questions) for p in args.queries_of]
    for kind, p, items in ways:  # warm-up: first passes allocate
        cpu_ms(embed(kind, p), items[:10])
    samples: dict[tuple[str, str], list[float]] = {(kind, p): [] for kind, p, _ in ways}
    for n in range(args.rounds):
        for kind, p, items in ways if n % 2 == 0 else list(reversed(ways)):
            samples[kind, p].append(cpu_ms(embed(kind, p), items))
    want = {
        "fact": [d.embedding for d in reference_store.run(documents=[Document(content=t) for t in turns])["documents"]],
        "query": [reference_query.run(text=t)["embedding"] for t in questions],
    }
    result: dict[str, Any] = {**embedding_run(args, questions, turns), "runtime": args.runtime, "loaded": loaded}
    for kind, precisions, items in (("fact", args.facts_of, turns), ("query", args.queries_of, questions)):
        per: dict[str, Any] = {}
        for p in precisions:
            if kind == "fact":
                got = [store[p].run(documents=[Document(content=t)])["documents"][0].embedding for t in items]
            else:
                got = [query[p].run(text=t)["embedding"] for t in items]
            per[p] = {
                "cpu_ms": statistics.median(samples[kind, p]),
                "rounds_ms": samples[kind, p],
                "cosine_to_float32": cosines(got, want[kind]),
            }
        for p in precisions:
            per[p]["ratio"] = per[p]["cpu_ms"] / per[precisions[0]]["cpu_ms"]
        result[kind] = per
    return result


def report(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(
        f"{m.get('cpu_model')} ({m.get('cores')} cores); {result['runtime']}; {result['texts']} texts, "
        f"{result['rounds']} rounds alternating"
    )
    print(f"{'':22s} {'CPU ms':>8s} {'ratio':>7s}   cosine to float32 (min / median)")
    for kind in ("fact", "query"):
        for p, k in result[kind].items():
            cos = k["cosine_to_float32"]
            print(
                f"{kind + ' ' + p:22s} {k['cpu_ms']:8.3f} {k['ratio']:6.3f}x   {cos['min']:.4f} / {cos['median']:.4f}"
            )


def _precisions(text: str) -> list[str]:
    chosen = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in get_args(Precision)]
    if not chosen or unknown:
        msg = f"precisions must be some of {list(get_args(Precision))}, comma-separated; got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return chosen


def main(argv: list[str] | None = None) -> dict[str, Any]:
    def more(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--runtime", choices=list(get_args(Runtime)), default="onnx")
        parser.add_argument(
            "--fact-precisions", dest="facts_of", type=_precisions, default=["mixed", "int8-cls", "int8", "float32"]
        )
        parser.add_argument("--query-precisions", dest="queries_of", type=_precisions, default=["int8", "int8-cls"])

    return embedding_texts_main(argv, __doc__, run, report, rounds=4, more=more)


if __name__ == "__main__":
    main()
