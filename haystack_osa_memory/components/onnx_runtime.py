"""The MiniLM embedders' forward pass in ONNX Runtime (`MiniLMTextEmbedder(runtime="onnx")`).

The torch module the embedders build (encoder, mean pooling, L2 normalisation) is exported to ONNX, float32 and
quantized to int8 (int8 weights with one scale per output channel, activations quantized per forward pass, like
torch's int8), and run by an ONNX Runtime session. In float32 the vectors are torch's within float rounding; in
int8 they are closer to the float32 ones than torch's int8 (median cosine ~0.995 against ~0.98), at about 0.75 of
torch's int8 CPU per query; a stored fact in float32 costs what torch's float16 does, on a CPU thread
(benchmarks/README.md, "ONNX Runtime"). `INT8_CLS_FILE` is int8 with the first token's activations quantized
apart from the other tokens' (`first_token_apart`): closer to float32 than `MIXED_FILE`, for int8's CPU.

**Exported once per model, in a child process** (`exported`): a process that exports in itself keeps ~270 MB
of the torch model's and the export's freed memory (glibc does not hand it back), which every forked `serve`
worker would then carry. The child writes both files and the float32 vectors of a few check texts into a cache
directory (`cache_root`: ``$XDG_CACHE_HOME/osa-memory/onnx``, else ``~/.cache/osa-memory/onnx``, private to
the user), keyed by the model directory, its files' sizes and times, and the versions of torch, transformers,
onnxruntime and this export; later processes only load the files (a fraction of a second). A session is checked
against the stored vectors when it loads (`OnnxModel.check`), so a damaged file is refused (and torch runs).

The session runs its operators one after the other on as many threads as torch uses in the process
(`torch.get_num_threads()`: one under `osa-memory serve`), without spinning between passes, and is safe to
call from several threads at once. It holds no thread of its own on one thread, so `serve` can build it before
forking its workers, which then share its weights' pages.

onnxruntime and onnx (for the quantization) come with the `embeddings` extra.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from haystack_osa_memory.errors import EmbeddingTimeoutError

if TYPE_CHECKING:
    import torch

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17
#: Part of the cache key: bump it when what `export_files` writes changes.
EXPORT_VERSION = 4
FLOAT32_FILE, INT8_FILE, MIXED_FILE, CHECK_FILE = "model.onnx", "model.int8.onnx", "model.mixed.onnx", "check.json"
INT8_CLS_FILE = "model.int8cls.onnx"
#: The file of each precision (``float16`` runs the float32 graph: no CPU kernels for float16 weights).
FILES = {
    "float32": FLOAT32_FILE,
    "float16": FLOAT32_FILE,
    "int8": INT8_FILE,
    "mixed": MIXED_FILE,
    "int8-cls": INT8_CLS_FILE,
}
#: Ends of the two slices `first_token_apart` cuts: the first token, and the rest (past any sequence's end).
_SLICES = {"first_start": 0, "first_end": 1, "rest_end": 2**62, "token_axis": 1}
#: Seconds the child process may take to export (loading torch and the model, exporting, quantizing: ~6 s).
EXPORT_TIMEOUT_S = 600.0
#: A float32 session's vectors must equal the exported module's within this; a quantized one's keep this cosine.
FLOAT32_TOLERANCE = 1e-5
INT8_MIN_COSINE = 0.9


class ExportError(RuntimeError):
    """The model could not be exported or loaded for ONNX Runtime (the embedders then run torch)."""


def feed_forward_outputs(names: Sequence[str], *, separator: str = "/", suffix: str = "/MatMul") -> list[str]:
    """Of ``names`` (the graph's matrix products, or with ``separator`` "." and no ``suffix`` a torch module's
    submodules), those that close each layer's feed-forward block (BERT's ``layer.N/output/dense``, not the
    attention's ``attention/output/dense``): `MIXED_FILE` keeps them in float32. Their input, the GELU's output,
    has a few large values per token, and one 8-bit scale over the whole tensor loses the rest (docs/traps.md).

    :raises ExportError: not one of them per feed-forward block (another architecture).
    """
    output = f"{separator}output{separator}dense{suffix}"
    attention = f"{separator}attention{separator}"
    found = [n for n in names if n.endswith(output) and attention not in n]
    blocks = [n for n in names if n.endswith(f"{separator}intermediate{separator}dense{suffix}")]
    if not found or len(found) != len(blocks):
        msg = f"found {len(found)} feed-forward outputs for {len(blocks)} feed-forward blocks; mixed needs one each"
        raise ExportError(msg)
    return found


def first_token_apart(model: Any) -> int:
    """Split each matrix product of a hidden state by a weight (``MatMul`` of an activation that shape inference
    finds to be ``(texts, tokens, features)`` and an initializer) of the ONNX ``model`` in two, in place: the first
    token's row and the other tokens' rows, each its own product, joined again along the tokens. Returns how many
    were split.

    The float graph computes the same thing. Quantized dynamically (`INT8_CLS_FILE`), each part gets its own
    activation scale: BERT's first token ([CLS]) carries values up to ~30 in a few features of every layer's
    feed-forward input and output where the other tokens stay within ~3-12, and one 8-bit scale over the whole
    tensor gave the other tokens a step several times coarser than they need (docs/traps.md). Both parts use the
    same int8 weights.
    """
    from onnx import helper, numpy_helper, shape_inference

    graph = model.graph
    weights = {i.name for i in graph.initializer}
    # Only activations known to be (texts, tokens, features): a row per text (a pooler's) has no tokens to split.
    inferred = shape_inference.infer_shapes(model).graph
    ranks = {
        v.name: len(v.type.tensor_type.shape.dim)
        for v in [*inferred.input, *inferred.value_info, *inferred.output]
        if v.type.tensor_type.HasField("shape")
    }
    names = {key: f"osa_first_token_apart/{key}" for key in _SLICES}
    nodes: list[Any] = []
    split = 0
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in weights or ranks.get(node.input[0]) != 3:
            nodes.append(node)
            continue
        split += 1
        x, w = node.input
        base = node.name.removesuffix("/MatMul") if node.name else f"osa_matmul_{split}"
        first, rest = f"{base}/first_token", f"{base}/other_tokens"
        starts_ends = {
            first: (names["first_start"], names["first_end"]),
            rest: (names["first_end"], names["rest_end"]),
        }
        for part, (start, end) in starts_ends.items():
            nodes.append(
                helper.make_node("Slice", [x, start, end, names["token_axis"]], [f"{part}/x"], name=f"{part}/Slice")
            )
            nodes.append(helper.make_node("MatMul", [f"{part}/x", w], [f"{part}/y"], name=f"{part}/MatMul"))
        nodes.append(
            helper.make_node("Concat", [f"{first}/y", f"{rest}/y"], list(node.output), name=f"{base}/Concat", axis=1)
        )
    if split:
        graph.initializer.extend(
            numpy_helper.from_array(np.array([value], dtype=np.int64), names[key]) for key, value in _SLICES.items()
        )
        del graph.node[:]
        graph.node.extend(nodes)
    return split


class _QuantizerNoise(logging.Filter):
    """ONNX Runtime's quantizer logs on the root logger at every run: advice to pre-process models, and a line per
    tensor it leaves in float. Noise in a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{Path('onnxruntime') / 'quantization'}" not in record.pathname


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    noise = _QuantizerNoise()
    root = logging.getLogger()
    root.addFilter(noise)
    try:
        yield
    finally:
        root.removeFilter(noise)


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/osa-memory/onnx``, else ``~/.cache/osa-memory/onnx``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "osa-memory" / "onnx"


def _version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "-"


def cache_key(model_dir: Path) -> str:
    """What the exported files depend on: the model's files (name, size, time) and the exporting versions."""
    files = sorted(
        (str(p.relative_to(model_dir)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in model_dir.rglob("*")
        if p.is_file()
    )
    versions = {d: _version(d) for d in ("torch", "transformers", "onnxruntime", "onnx")}
    data = {"model": str(model_dir), "files": files, "versions": versions, "export": EXPORT_VERSION, "opset": OPSET}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:24]


def exported(model_dir: Path) -> Path:
    """The directory holding ``model_dir``'s exported files (`FILES`, `CHECK_FILE`),
    exporting them in a child process first when the cache has none.

    :raises ExportError: the child failed or timed out (its last lines of error output are in the message).
    """
    model_dir = model_dir.resolve()
    root = cache_root()
    target = root / cache_key(model_dir)
    if (target / CHECK_FILE).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one export at a time; the others then find its files
        if (target / CHECK_FILE).is_file():
            return target
        work = Path(tempfile.mkdtemp(prefix=".export-", dir=root))
        try:
            # The child imports this very package (`-P`: not one a working directory may hold).
            package_root = str(Path(__file__).resolve().parents[2])
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
            }
            command = [sys.executable, "-P", "-m", __name__, str(model_dir), str(work)]
            try:
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S, check=False, env=env
                )
            except subprocess.TimeoutExpired as e:
                msg = f"the export did not finish within {EXPORT_TIMEOUT_S:.0f} s"
                raise ExportError(msg) from e
            if done.returncode != 0 or not (work / CHECK_FILE).is_file():
                tail = " | ".join(done.stderr.strip().splitlines()[-3:])
                msg = f"the export failed (exit {done.returncode}): {tail}"
                raise ExportError(msg)
            work.rename(target)  # whole, or not at all
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def export_files(module: torch.nn.Module, tokenized: dict[str, Any], out: Path) -> None:
    """Write ``module`` as `FLOAT32_FILE`, `INT8_FILE` (every matrix product with int8 weights, one scale per
    output channel, and int8 activations), `INT8_CLS_FILE` (the same with the first token's activations quantized
    apart, `first_token_apart`) and `MIXED_FILE` (the same as `INT8_FILE` but the feed-forward outputs,
    `feed_forward_outputs`) into ``out``, with `CHECK_FILE`: the check batch (``tokenized``: the three inputs as
    lists, padded) and the module's own float32 vectors of it."""
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    example = tuple(torch.tensor(tokenized[name], dtype=torch.long) for name in INPUTS)
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript-based exporter's deprecation and tracer warnings; the files are checked when they load.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            example,
            str(out / FLOAT32_FILE),
            input_names=list(INPUTS),
            output_names=["embedding"],
            dynamic_axes={**{name: {0: "texts", 1: "tokens"} for name in INPUTS}, "embedding": {0: "texts"}},
            opset_version=OPSET,
            dynamo=False,
        )
        vectors = module(*example).tolist()
    apart = onnx.load(str(out / FLOAT32_FILE))
    keep = feed_forward_outputs([n.name for n in apart.graph.node if n.op_type == "MatMul"])  # before the split
    if not first_token_apart(apart):
        msg = "the exported graph has no matrix product of a hidden state by a weight to split"
        raise ExportError(msg)
    split_file = out / "model.first_token_apart.onnx"
    onnx.save(apart, str(split_file))
    with _quiet_quantizer():
        quantize_dynamic(out / FLOAT32_FILE, out / INT8_FILE, weight_type=QuantType.QInt8, per_channel=True)
        quantize_dynamic(
            out / FLOAT32_FILE, out / MIXED_FILE, weight_type=QuantType.QInt8, per_channel=True, nodes_to_exclude=keep
        )
        quantize_dynamic(split_file, out / INT8_CLS_FILE, weight_type=QuantType.QInt8, per_channel=True)
    split_file.unlink()
    (out / CHECK_FILE).write_text(json.dumps({**tokenized, "vectors": vectors}), encoding="utf-8")


class Deadlines:
    """Stops ONNX Runtime forward passes that run past their deadline, from one watchdog thread per process.

    A pass started with a deadline (`OnnxModel.run` with ``timeout``) carries its own ``RunOptions``; the watchdog
    looks at the passes in flight at least every `POLL_S` seconds, and at the earliest deadline when that comes
    sooner, and sets ``terminate`` on those past their deadline: ONNX Runtime then stops the pass at its next
    operator and the caller gets `EmbeddingTimeoutError`. A call's time budget is kept without handing the call to
    another thread (`GuardedTextEmbedder` did that for every query: a thread wake-up each way); with budgets of
    seconds the watchdog is woken by nothing but its own timer. It starts on first use in each process, so a forked
    worker starts its own.
    """

    #: Seconds between two looks at the passes in flight, at most.
    POLL_S = 0.05

    def __init__(self) -> None:
        self._forked()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # Also in a forked child: the parent's watchdog thread is not there, and may have held the lock at the fork.
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._runs: dict[int, tuple[float, Any]] = {}
        self._count = 0
        self._look_at = math.inf  # when the watchdog looks next
        self._started = False

    def watch(self, options: Any, timeout: float) -> int:
        """Stop the pass run with ``options`` (ONNX Runtime's ``RunOptions``) once ``timeout`` seconds have passed,
        unless `done` comes first; returns the pass's token for `done`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if not self._started:  # first use in this process (`_forked` resets it in a child)
                self._started = True
                threading.Thread(target=self._loop, name="osa-memory-deadlines", daemon=True).start()
            self._count += 1
            self._runs[self._count] = (deadline, options)
            if deadline < self._look_at:
                self._wake.set()  # it would look too late
            return self._count

    def done(self, token: int) -> None:
        """The pass of ``token`` ended (or failed): it is no longer watched."""
        with self._lock:
            self._runs.pop(token, None)

    def _loop(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                for token in [t for t, (deadline, _) in self._runs.items() if deadline <= now]:
                    self._runs.pop(token)[1].terminate = True
                wait = min([self.POLL_S, *(deadline - now for deadline, _ in self._runs.values())])
                self._look_at = now + wait
                self._wake.clear()
            self._wake.wait(wait)


#: The process's watchdog of forward passes with a deadline.
DEADLINES = Deadlines()


class OnnxModel:
    """An ONNX Runtime session of a module taking ``input_ids``, ``attention_mask`` and ``token_type_ids`` and
    returning one vector per text.

    Usage:
    ```python
    model = OnnxModel.load(exported(model_dir), "int8")
    vectors = model.run(ids, mask, types)  # lists of token ids (or int64 arrays) -> float32 array (texts, dim)
    ```
    """

    def __init__(self, session: Any, quantized: bool) -> None:
        self._session = session
        self._output = session.get_outputs()[0].name
        self.quantized = quantized

    @classmethod
    def load(cls, directory: Path, precision: str, *, threads: int = 1) -> OnnxModel:
        """The session of ``precision``'s file in ``directory`` (`FILES`) on ``threads`` threads, checked
        (`check`).

        :raises ExportError: the file does not load, or its vectors are not the exported module's.
        """
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Threads that spin between passes burn a CPU a server's other calls need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # errors only
        path = directory / FILES[precision]
        try:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as e:
            msg = f"{path.name} does not load: {type(e).__name__}: {str(e)[:200]}"
            raise ExportError(msg) from e
        model = cls(session, quantized=path.name != FLOAT32_FILE)
        model.check(json.loads((directory / CHECK_FILE).read_text(encoding="utf-8")))
        return model

    def check(self, stored: dict[str, Any]) -> None:
        """The session's vectors of the stored check batch against the module's own (`CHECK_FILE`): float32 within
        `FLOAT32_TOLERANCE`, int8 with a cosine of at least `INT8_MIN_COSINE`.

        :raises ExportError: they are not.
        """
        want = np.asarray(stored["vectors"], dtype=np.float32)
        got = self.run(*(stored[name] for name in INPUTS))
        if got.shape != want.shape:
            msg = f"its vectors have the shape {got.shape}, the exported module's {want.shape}"
            raise ExportError(msg)
        if self.quantized:
            cosine = float((got * want).sum(1).min())
            if not cosine >= INT8_MIN_COSINE:
                msg = f"its quantized vectors have a cosine of only {cosine:.5f} with the float32 ones"
                raise ExportError(msg)
        else:
            difference = float(np.abs(got - want).max())
            if not difference <= FLOAT32_TOLERANCE:
                msg = f"its vectors differ from the exported module's by {difference:.2e}"
                raise ExportError(msg)

    def run(
        self, input_ids: Any, attention_mask: Any, token_type_ids: Any, *, timeout: float | None = None
    ) -> npt.NDArray[np.float32]:
        """The vectors of one padded batch (lists of token ids, or int64 arrays), one row per text.

        :param timeout: seconds the pass may take; past them it stops (`Deadlines`).
        :raises EmbeddingTimeoutError: the pass ran past ``timeout``.
        """
        feeds = {
            name: np.asarray(value, dtype=np.int64)
            for name, value in zip(INPUTS, (input_ids, attention_mask, token_type_ids), strict=True)
        }
        if timeout is None:
            out: npt.NDArray[np.float32] = self._session.run([self._output], feeds)[0]
            return out
        import onnxruntime as ort

        options = ort.RunOptions()
        token = DEADLINES.watch(options, timeout)
        try:
            out = self._session.run([self._output], feeds, options)[0]
        except Exception as e:
            if options.terminate:
                msg = f"the forward pass ran past its {timeout:.2f} s budget"
                raise EmbeddingTimeoutError(msg) from e
            raise
        finally:
            DEADLINES.done(token)
        return out


def _main(argv: Sequence[str]) -> int:
    """The child process of `exported`: ``model_dir out_dir``."""
    from haystack_osa_memory.components.minilm_embedders import export_model

    model_dir, out = (Path(a) for a in argv)
    with contextlib.redirect_stdout(sys.stderr):
        export_model(model_dir, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
