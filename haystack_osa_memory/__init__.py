"""haystack-osa-memory: assignment-scoped, governed agent memory in a Haystack + pgvector knowledge base.

The public API is imported lazily (PEP 562), so light entry points — the stdio bridge, `mcp-config`,
`--help` — start without importing Haystack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Importing the package changes nothing in the host process's environment: whether Haystack's usage
# telemetry runs is the host's choice (`osa-memory`, our own process, turns it off unless it is set).

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "Caller": "haystack_osa_memory.caller",
    "caller_scope": "haystack_osa_memory.caller",
    "current_caller": "haystack_osa_memory.caller",
    "GovernedFactWriter": "haystack_osa_memory.components",
    "GoverningRowAclFilter": "haystack_osa_memory.components",
    "GuardedTextEmbedder": "haystack_osa_memory.components",
    "MiniLMDocumentEmbedder": "haystack_osa_memory.components",
    "MiniLMTextEmbedder": "haystack_osa_memory.components",
    "PrivacyRedactor": "haystack_osa_memory.components",
    "ScopedMemoryRetriever": "haystack_osa_memory.components",
    "ScopeMarkerStripper": "haystack_osa_memory.components",
    "ScopeMarkerWriter": "haystack_osa_memory.components",
    "SupersessionJudge": "haystack_osa_memory.components",
    "MemoryConfig": "haystack_osa_memory.config",
    "MemoryStore": "haystack_osa_memory.store.memory_store",
    "AclLookupError": "haystack_osa_memory.errors",
    "AuthenticationError": "haystack_osa_memory.errors",
    "ConfigurationError": "haystack_osa_memory.errors",
    "DatabaseError": "haystack_osa_memory.errors",
    "EmbeddingTimeoutError": "haystack_osa_memory.errors",
    "InvalidInputError": "haystack_osa_memory.errors",
    "MemoryOffError": "haystack_osa_memory.errors",
    "NotFoundError": "haystack_osa_memory.errors",
    "OsaMemoryError": "haystack_osa_memory.errors",
    "SchemaError": "haystack_osa_memory.errors",
    "ScopeError": "haystack_osa_memory.errors",
    "Memory": "haystack_osa_memory.memory",
    "shared_memory": "haystack_osa_memory.memory",
    "ALLOWED_MODULES": "haystack_osa_memory.builders",
    "build_customer_search_pipeline": "haystack_osa_memory.builders",
    "build_recall_pipeline": "haystack_osa_memory.builders",
    "build_store_pipeline": "haystack_osa_memory.builders",
    "use_lean_input_copies": "haystack_osa_memory.pipeline_inputs",
    "use_lean_component_spans": "haystack_osa_memory.pipeline_spans",
    "use_lean_scheduling": "haystack_osa_memory.pipeline_scheduling",
}

__all__ = [
    "ALLOWED_MODULES",
    "AclLookupError",
    "AuthenticationError",
    "Caller",
    "ConfigurationError",
    "DatabaseError",
    "EmbeddingTimeoutError",
    "GovernedFactWriter",
    "GoverningRowAclFilter",
    "GuardedTextEmbedder",
    "InvalidInputError",
    "Memory",
    "MemoryConfig",
    "MemoryOffError",
    "MemoryStore",
    "MiniLMDocumentEmbedder",
    "MiniLMTextEmbedder",
    "NotFoundError",
    "OsaMemoryError",
    "PrivacyRedactor",
    "SchemaError",
    "ScopeError",
    "ScopeMarkerStripper",
    "ScopeMarkerWriter",
    "ScopedMemoryRetriever",
    "SupersessionJudge",
    "__version__",
    "build_customer_search_pipeline",
    "build_recall_pipeline",
    "build_store_pipeline",
    "caller_scope",
    "current_caller",
    "shared_memory",
    "use_lean_component_spans",
    "use_lean_input_copies",
    "use_lean_scheduling",
]

if TYPE_CHECKING:
    from haystack_osa_memory.builders import (
        ALLOWED_MODULES,
        build_customer_search_pipeline,
        build_recall_pipeline,
        build_store_pipeline,
    )
    from haystack_osa_memory.caller import Caller, caller_scope, current_caller
    from haystack_osa_memory.components import (
        GovernedFactWriter,
        GoverningRowAclFilter,
        GuardedTextEmbedder,
        MiniLMDocumentEmbedder,
        MiniLMTextEmbedder,
        PrivacyRedactor,
        ScopedMemoryRetriever,
        ScopeMarkerStripper,
        ScopeMarkerWriter,
        SupersessionJudge,
    )
    from haystack_osa_memory.config import MemoryConfig
    from haystack_osa_memory.errors import (
        AclLookupError,
        AuthenticationError,
        ConfigurationError,
        DatabaseError,
        InvalidInputError,
        MemoryOffError,
        NotFoundError,
        OsaMemoryError,
        SchemaError,
        ScopeError,
    )
    from haystack_osa_memory.memory import Memory, shared_memory
    from haystack_osa_memory.pipeline_inputs import use_lean_input_copies
    from haystack_osa_memory.pipeline_scheduling import use_lean_scheduling
    from haystack_osa_memory.pipeline_spans import use_lean_component_spans
    from haystack_osa_memory.store.memory_store import MemoryStore


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'haystack_osa_memory' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
