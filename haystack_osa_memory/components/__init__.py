"""Haystack components of haystack-osa-memory, one per module."""

from haystack_osa_memory.components.governed_fact_writer import GovernedFactWriter
from haystack_osa_memory.components.governing_row_acl_filter import GoverningRowAclFilter
from haystack_osa_memory.components.guarded_text_embedder import GuardedTextEmbedder
from haystack_osa_memory.components.minilm_embedders import MiniLMDocumentEmbedder, MiniLMTextEmbedder
from haystack_osa_memory.components.privacy_redactor import PrivacyRedactor
from haystack_osa_memory.components.scope_marker_stripper import ScopeMarkerStripper
from haystack_osa_memory.components.scope_marker_writer import ScopeMarkerWriter
from haystack_osa_memory.components.scoped_memory_retriever import ScopedMemoryRetriever
from haystack_osa_memory.components.supersession_judge import SupersessionJudge

__all__ = [
    "GovernedFactWriter",
    "GoverningRowAclFilter",
    "GuardedTextEmbedder",
    "MiniLMDocumentEmbedder",
    "MiniLMTextEmbedder",
    "PrivacyRedactor",
    "ScopeMarkerStripper",
    "ScopeMarkerWriter",
    "ScopedMemoryRetriever",
    "SupersessionJudge",
]
