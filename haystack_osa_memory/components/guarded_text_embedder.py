from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np
import numpy.typing as npt
from haystack import component, default_to_dict
from haystack.core.serialization import component_from_dict, component_to_dict, import_class_by_name

from haystack_osa_memory.errors import EmbeddingTimeoutError
from haystack_osa_memory.instruments import observe_embed_batch

logger = logging.getLogger(__name__)


def stops_itself(embedder: Any) -> bool:
    """Whether ``embedder`` stops its own work at a budget (``bounded`` true, with ``run_bounded(text, timeout)``:
    `MiniLMTextEmbedder` on ONNX Runtime): `GuardedTextEmbedder` then calls it in the calling thread."""
    return getattr(embedder, "bounded", False) is True


@component
class GuardedTextEmbedder:
    """Wraps any Haystack text embedder with a time budget; on failure it degrades instead of failing.

    Returns `embedding=None` and a `degraded` reason when the inner embedder cannot be warmed up,
    raises, or takes longer than `timeout` seconds, so a recall pipeline can still answer from its
    lexical side and say that it degraded. An embedder that stops its own work at a budget (``bounded``
    true and ``run_bounded(text, timeout)``: `MiniLMTextEmbedder` on ONNX Runtime) runs in the calling
    thread; any other runs in a thread of this guard's, which it stops waiting for at the budget.

    The embedding is returned as a float32 numpy array, not a list: a Haystack pipeline deep-copies
    every component input element by element, and a list of floats costs far more to copy there than
    an array (docs/traps.md). `ScopedMemoryRetriever` accepts both.

    Usage example:
    ```python
    from haystack.components.embedders import MockTextEmbedder
    from haystack_osa_memory import GuardedTextEmbedder

    embedder = GuardedTextEmbedder(embedder=MockTextEmbedder(dimension=384), timeout=2.0)
    out = embedder.run(text="where is the staging VPN config?")
    out["embedding"], out["degraded"]   # (array([...384 float32...]), None)
    ```
    """

    def __init__(self, embedder: Any, timeout: float = 5.0) -> None:
        """
        :param embedder: Any Haystack component with `run(text=...) -> {"embedding": [...]}`.
        :param timeout: Seconds the embedder may take per query.
        """
        if not hasattr(embedder, "run"):
            msg = f"embedder must be a Haystack text embedder component, got {type(embedder).__name__}"
            raise ValueError(msg)
        if timeout <= 0:
            msg = f"timeout must be positive seconds, got {timeout}"
            raise ValueError(msg)
        self.embedder = embedder
        self.timeout = timeout
        self._warm_error: str | None = None
        self._warmed = False
        self._lock = threading.Lock()
        # Each instance has its own workers: calls stuck past their budget occupy this embedder's
        # threads only, never those of a healthy embedder elsewhere in the process.
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="osa-memory-embed")

    def warm_up(self) -> None:
        """Warm up the inner embedder once; a failure is remembered as the degraded reason."""
        with self._lock:
            if self._warmed:
                return
            self._warmed = True
            if hasattr(self.embedder, "warm_up"):
                try:
                    self.embedder.warm_up()
                except Exception as e:
                    self._warm_error = f"embedder unavailable: {type(e).__name__}: {e}"
                    logger.warning("text embedder could not be warmed up; recall will be lexical: %s", e)

    @property
    def available(self) -> bool:
        """False when warm-up failed."""
        return self._warm_error is None

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, embedder=component_to_dict(self.embedder, "embedder"), timeout=self.timeout)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GuardedTextEmbedder:
        params = dict(data["init_parameters"])
        inner = params["embedder"]
        params["embedder"] = component_from_dict(import_class_by_name(inner["type"]), inner, "embedder")
        return cls(**params)

    @component.output_types(embedding=npt.NDArray[np.float32] | None, degraded=str | None)
    def run(self, text: str) -> dict[str, Any]:
        """
        :param text: The query text.
        :returns: `embedding` (or `None`) and `degraded` (why there is no embedding, else `None`).
        """
        self.warm_up()
        if self._warm_error:
            return {"embedding": None, "degraded": self._warm_error}
        observe_embed_batch(1)  # one query per call; a batching embedder reports its batch size
        try:
            if stops_itself(self.embedder):
                # It stops its own forward pass at the budget: run here, without a thread hand-off each way.
                result = self.embedder.run_bounded(text, self.timeout)
            else:
                future = self._executor.submit(self.embedder.run, text=text)
                try:
                    result = future.result(timeout=self.timeout)
                except FutureTimeout:
                    future.cancel()
                    raise
        except (FutureTimeout, EmbeddingTimeoutError):
            logger.warning("text embedder exceeded its %.2f s budget; answering lexically", self.timeout)
            return {"embedding": None, "degraded": f"embedder exceeded its {self.timeout:.2f} s budget"}
        except Exception as e:
            logger.warning("text embedder failed; answering lexically: %s", e)
            return {"embedding": None, "degraded": f"embedder failed: {type(e).__name__}: {e}"}
        embedding = result.get("embedding") if isinstance(result, dict) else None
        try:
            vector = np.asarray(embedding if embedding is not None else [], dtype=np.float32)
        except (TypeError, ValueError) as e:
            return {"embedding": None, "degraded": f"embedder returned no usable embedding: {e}"}
        if vector.ndim != 1 or vector.size == 0 or not np.isfinite(vector).all():
            return {"embedding": None, "degraded": "embedder returned no usable embedding"}
        return {"embedding": vector, "degraded": None}
