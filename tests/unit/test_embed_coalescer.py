"""Concurrent stores share the document embedder's forward passes (`minilm_embedders._Coalescer`)."""

from __future__ import annotations

import threading
import time

import pytest

from haystack_osa_memory.components.minilm_embedders import _Coalescer


class SlowEmbedder:
    """Embeds each text as [len(text), position in its batch]; records the batches it was given."""

    def __init__(self, delay: float = 0.05, fail_on: str | None = None) -> None:
        self.delay = delay
        self.fail_on = fail_on
        self.batches: list[list[str]] = []

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.batches.append(list(texts))
        time.sleep(self.delay)
        if self.fail_on is not None and self.fail_on in texts:
            raise RuntimeError("model failed")
        return [[float(len(t)), float(i)] for i, t in enumerate(texts)]


def _run_concurrently(coalescer: _Coalescer, requests: list[list[str]]) -> list[list[list[float]] | BaseException]:
    results: list[list[list[float]] | BaseException] = [[] for _ in requests]
    start = threading.Barrier(len(requests))

    def call(i: int) -> None:
        start.wait()
        try:
            results[i] = coalescer.embed(requests[i])
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    return results


def test_a_caller_alone_is_embedded_at_once() -> None:
    model = SlowEmbedder(delay=0)
    sizes: list[int] = []
    coalescer = _Coalescer(model, sizes.append)
    assert coalescer.embed(["abc", "de"]) == [[3.0, 0.0], [2.0, 1.0]]
    assert model.batches == [["abc", "de"]]
    assert sizes == [2]


def test_concurrent_callers_share_forward_passes_and_each_gets_its_own_vectors() -> None:
    model = SlowEmbedder()
    sizes: list[int] = []
    coalescer = _Coalescer(model, sizes.append)
    requests = [["x" * (i + 1)] for i in range(12)] + [["two", "texts!"]]
    results = _run_concurrently(coalescer, requests)
    for request, result in zip(requests, results, strict=True):
        assert isinstance(result, list)
        assert [v[0] for v in result] == [float(len(t)) for t in request]  # its own texts, in its order
    # Far fewer passes than callers: those waiting while one ran went together into the next.
    assert len(model.batches) < len(requests) / 2
    assert sorted(t for b in model.batches for t in b) == sorted(t for r in requests for t in r)
    assert sum(sizes) == 14
    assert max(sizes) > 1


def test_a_failure_reaches_every_caller_of_its_batch_and_the_next_batch_runs() -> None:
    model = SlowEmbedder(fail_on="bad")
    coalescer = _Coalescer(model, lambda size: None)
    results = _run_concurrently(coalescer, [["bad"], ["ok 1"], ["ok 2"], ["ok 3"]])
    failed = [r for r in results if isinstance(r, BaseException)]
    assert failed
    assert all(isinstance(r, RuntimeError) for r in failed)
    # The coalescer is not stuck after a failure.
    assert coalescer.embed(["later"]) == [[5.0, 0.0]]


@pytest.mark.embeddings
def test_a_fact_vector_does_not_depend_on_what_it_was_batched_with() -> None:
    from haystack_osa_memory.components.minilm_embedders import BUNDLED_MODEL, _backend

    backend = _backend(BUNDLED_MODEL)
    alone = backend.embed(["Staging uses the VPN profile stg-eu"], batch_size=8)[0]
    together = backend.embed(
        ["a much longer fact that pads the batch: the nightly job rotates the staging database credentials",
         "Staging uses the VPN profile stg-eu", "short"],
        batch_size=8,
    )[1]  # fmt: skip
    assert together == pytest.approx(alone, abs=1e-6)
