"""The MiniLM embedders' forward pass in ONNX Runtime (`MiniLMTextEmbedder(runtime="onnx")`).

The torch module the embedders build (encoder, mean pooling, L2 normalisation) is exported to ONNX in memory
when the model is loaded, and run by an ONNX Runtime session: no model file is downloaded or written beside the
model. In float32 its vectors are torch's within float rounding; in int8 the export is quantized dynamically
(int8 weights with one scale per output channel, activations quantized per forward pass, like torch's int8), and
its vectors are closer to the float32 ones than torch's int8 (median cosine ~0.995 against ~0.98), at about 0.7
of torch's int8 CPU per query and 0.8 of torch's float16 per stored fact on a CPU thread (benchmarks/README.md,
"ONNX Runtime").

The session runs its operators one after the other on as many threads as torch uses in the process
(`torch.get_num_threads()`: one under `osa-memory serve`), without spinning between passes, and is safe to
call from several threads at once. It holds no thread of its own on one thread, so `serve` can build it before
forking its workers, which then share its weights' pages.

onnxruntime and onnx (for the quantization) come with the `embeddings` extra.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17


class _QuantizerNoise(logging.Filter):
    """ONNX Runtime's quantizer logs on the root logger at every load: advice to pre-process models quantized once
    and shipped, and a line per tensor it leaves in float. Noise in a server's log."""

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


class OnnxModel:
    """An ONNX Runtime session of a module taking ``input_ids``, ``attention_mask`` and ``token_type_ids`` and
    returning one vector per text.

    Usage:
    ```python
    model = OnnxModel.export(pooled_module, example_tensors, quantized=True)
    vectors = model.run(ids, mask, types)  # lists of token ids (or int64 arrays) -> float32 array (texts, dim)
    ```
    """

    def __init__(self, session: Any) -> None:
        self._session = session
        self._output = session.get_outputs()[0].name

    @classmethod
    def export(cls, module: torch.nn.Module, example: Sequence[torch.Tensor], *, quantized: bool) -> OnnxModel:
        """``module`` exported with dynamic batch and token axes (``example``: one batch of its three inputs),
        int8-quantized when ``quantized``, in a session of `threads` threads."""
        import onnxruntime as ort
        import torch

        with tempfile.TemporaryDirectory(prefix="osa-memory-onnx-") as tmp:
            exported = Path(tmp) / "model.onnx"
            with warnings.catch_warnings(), torch.no_grad():
                # The TorchScript-based exporter's deprecation and tracer warnings; the result is checked against
                # the eager module by the caller.
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    module,
                    tuple(example),
                    str(exported),
                    input_names=list(INPUTS),
                    output_names=["embedding"],
                    dynamic_axes={**{name: {0: "texts", 1: "tokens"} for name in INPUTS}, "embedding": {0: "texts"}},
                    opset_version=OPSET,
                    dynamo=False,
                )
            if quantized:
                from onnxruntime.quantization import QuantType, quantize_dynamic

                int8 = Path(tmp) / "model.int8.onnx"
                with _quiet_quantizer():
                    quantize_dynamic(exported, int8, weight_type=QuantType.QInt8, per_channel=True)
                exported = int8
            model = exported.read_bytes()
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, torch.get_num_threads())
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Threads that spin between passes burn a CPU a server's other calls need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # errors only
        return cls(ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]))

    def run(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> npt.NDArray[np.float32]:
        """The vectors of one padded batch (lists of token ids, or int64 arrays), one row per text."""
        feeds = {
            name: np.asarray(value, dtype=np.int64)
            for name, value in zip(INPUTS, (input_ids, attention_mask, token_type_ids), strict=True)
        }
        out: npt.NDArray[np.float32] = self._session.run([self._output], feeds)[0]
        return out
