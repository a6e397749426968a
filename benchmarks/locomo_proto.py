"""Prototypes measured by ``locomo.py`` (changes the package does not have yet)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from haystack import Document, Pipeline

from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.embedders import build_embedders as package_embedders

if TYPE_CHECKING:
    from locomo import Conversation, Turn


@dataclass(frozen=True)
class ProtoOptions:
    """Prototype switches; the defaults are the product as it is."""

    @property
    def store_key(self) -> tuple[Any, ...]:
        return ()


def describe(options: ProtoOptions) -> dict[str, Any]:
    return asdict(options)


def build_embedders(config: MemoryConfig, options: ProtoOptions) -> tuple[Any | None, Any | None]:
    return package_embedders(config)


def turn_document(turns: Sequence[Turn], turn: Turn, options: ProtoOptions) -> Document:
    return Document(content=turn.fact)


def after_store(
    conn_str: str,
    config: MemoryConfig,
    conversations: Sequence[Conversation],
    dia_ids: dict[str, dict[str, frozenset[str]]],
    options: ProtoOptions,
) -> None:
    return None


def customise_recall_pipeline(
    pipe: Pipeline, config: MemoryConfig, options: ProtoOptions, retriever: dict[str, Any], top_k: int
) -> Pipeline:
    return pipe


def recall_inputs(data: dict[str, Any], question: str, options: ProtoOptions) -> dict[str, Any]:
    return data
