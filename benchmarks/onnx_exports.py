"""The MiniLM model exported to ONNX two ways, with transformers' attention implementations, in one process,
rounds alternating.

The product exports the encoder with attention as plain matrix products (``eager``); exported through torch's
scaled-dot-product attention (``sdpa``, transformers' default), the graph carries more nodes (shape bookkeeping,
NaN guards) that ONNX Runtime runs one by one on every pass. This script exports the model both ways into a
temporary folder (`onnx_runtime.export_files`, as the product's export does it), loads each way's query session
(int8) and stored-fact session (``--facts-precision``, default the product's) on one intra-op thread (as
`osa-memory serve` runs them), and runs every question and every turn through each, rounds alternating (sdpa
then eager, then the other way). It prints each graph's nodes, the median CPU milliseconds per query and per
fact of each way, their ratio, and how far apart the two ways' vectors are (cosine, largest difference).

Texts: LoCoMo questions and turns from ``--data`` (read at run time, never copied), else `load.py`'s synthetic
questions and facts.

    python benchmarks/onnx_exports.py [--data ../shared/data/locomo/locomo_dev.json] [--queries 300 --facts 200]
        [--rounds 6] [--facts-precision mixed] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, get_args

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.workload import embedding_run, embedding_texts, embedding_texts_main
from haystack_osa_memory.config import Precision

#: transformers' ``attn_implementation`` values compared: the default first, the product's second.
WAYS = ("sdpa", "eager")


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np
    import onnx
    import torch

    torch.set_num_threads(1)
    from haystack_osa_memory import MemoryConfig
    from haystack_osa_memory.components import minilm_embedders as me
    from haystack_osa_memory.components.onnx_runtime import FILES, OnnxModel, export_files

    questions, turns = embedding_texts(args.data, args.queries, args.facts)
    config = MemoryConfig()
    precision = {"query": config.query_precision, "fact": args.facts_precision or config.document_precision}
    spec = me._read_model_spec(Path(me._model_dir(me.BUNDLED_MODEL)))
    tokens = object.__new__(me._MiniLMBackend)
    tokens._init_tokenizer(spec)
    check = tokens._padded_lists([tokens._tokenizer.encode(t) for t in me._TRACE_CHECK])
    encoded = {
        kind: [tokens._tokenizer.encode(t) for t in items] for kind, items in (("query", questions), ("fact", turns))
    }
    models: dict[str, dict[str, Any]] = {}
    nodes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="osa-onnx-exports-") as tmp:
        for way in WAYS:
            out = Path(tmp) / way
            out.mkdir()
            with me._quiet_transformers():
                module = me._load_eager(spec, attention=way)
            export_files(module, dict(zip(("input_ids", "attention_mask", "token_type_ids"), check, strict=True)), out)
            nodes[way] = len(onnx.load(str(out / FILES["float32"]), load_external_data=False).graph.node)
            models[way] = {kind: OnnxModel.load(out, precision[kind], threads=1) for kind in ("query", "fact")}

    def cpu_ms(model: OnnxModel, items: list[Any]) -> float:
        started = time.process_time()
        for e in items:
            model.run([e.ids], [e.attention_mask], [e.type_ids])
        return (time.process_time() - started) / len(items) * 1000

    for way in WAYS:  # warm-up: first passes allocate
        for kind in ("query", "fact"):
            cpu_ms(models[way][kind], encoded[kind][:10])
    samples: dict[str, dict[str, list[float]]] = {kind: {w: [] for w in WAYS} for kind in ("query", "fact")}
    for n in range(args.rounds):
        for way in WAYS if n % 2 == 0 else tuple(reversed(WAYS)):
            for kind in ("query", "fact"):
                samples[kind][way].append(cpu_ms(models[way][kind], encoded[kind]))
    result: dict[str, Any] = {**embedding_run(args, questions, turns), "precision": precision, "nodes": nodes}
    for kind in ("query", "fact"):
        vectors = {
            w: np.concatenate([models[w][kind].run([e.ids], [e.attention_mask], [e.type_ids]) for e in encoded[kind]])
            for w in WAYS
        }
        cosines = (vectors["eager"] * vectors["sdpa"]).sum(axis=1)  # unit vectors
        result[kind] = {
            **{w: {"cpu_ms": statistics.median(samples[kind][w]), "rounds_ms": samples[kind][w]} for w in WAYS},
            "ratio": statistics.median(samples[kind]["eager"]) / statistics.median(samples[kind]["sdpa"]),
            "max_difference": float(np.abs(vectors["eager"] - vectors["sdpa"]).max()),
            "cosine": {"min": float(cosines.min()), "median": float(np.median(cosines))},
        }
    return result


def report(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(
        f"{m.get('cpu_model')} ({m.get('cores')} cores); {result['texts']} texts, {result['rounds']} rounds alternating"
    )
    print(f"graph nodes: sdpa {result['nodes']['sdpa']}, eager {result['nodes']['eager']}")
    head = "ways' cosine min / median, largest difference"
    print(f"{'':16s} {'sdpa CPU ms':>12s} {'eager CPU ms':>13s} {'ratio':>7s}   {head}")
    for kind in ("query", "fact"):
        k = result[kind]
        label = f"{kind} ({result['precision'][kind]})"
        cos = f"{k['cosine']['min']:.5f} / {k['cosine']['median']:.5f}, {k['max_difference']:.2e}"
        print(f"{label:16s} {k['sdpa']['cpu_ms']:12.3f} {k['eager']['cpu_ms']:13.3f} {k['ratio']:6.3f}x   {cos}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    def more(parser: argparse.ArgumentParser) -> None:
        precisions = [p for p in get_args(Precision) if p != "float16"]  # float16 runs the float32 graph
        parser.add_argument("--facts-precision", choices=precisions, default=None, help="default: the product's")

    return embedding_texts_main(argv, __doc__, run, report, rounds=6, more=more)


if __name__ == "__main__":
    main()
