"""Measurement hooks that lower layers call without knowing who measures.

Components sit below the server, so they cannot import its metrics module; they report here instead,
and `osa-memory serve --metrics-port` plugs its Prometheus histograms in (`haystack_osa_memory.mcp.metrics`).
With no sink set (the default, and every use of `Memory` outside the server) a call costs one attribute read.

Only sizes and counts pass through here: never text, queries, tokens or scope ids.
"""

from __future__ import annotations

from collections.abc import Callable

#: Receives the number of query texts one embedder call embeds (1 today; a batch when queries are batched).
EmbedBatchSink = Callable[[int], None]

_embed_batch_sink: EmbedBatchSink | None = None


def set_embed_batch_sink(sink: EmbedBatchSink | None) -> EmbedBatchSink | None:
    """Install ``sink`` (None removes it); returns the one it replaces."""
    global _embed_batch_sink
    previous, _embed_batch_sink = _embed_batch_sink, sink
    return previous


def observe_embed_batch(size: int) -> None:
    """Report that the query embedder is about to embed ``size`` texts in one call."""
    sink = _embed_batch_sink
    if sink is not None:
        sink(size)


_document_batch_sink: EmbedBatchSink | None = None


def set_document_batch_sink(sink: EmbedBatchSink | None) -> EmbedBatchSink | None:
    """Install ``sink`` for document batch sizes (None removes it); returns the one it replaces."""
    global _document_batch_sink
    previous, _document_batch_sink = _document_batch_sink, sink
    return previous


def observe_document_batch(size: int) -> None:
    """Report that the document embedder embeds ``size`` texts in one forward pass set (the facts of
    concurrent stores embedded together)."""
    sink = _document_batch_sink
    if sink is not None:
        sink(size)
