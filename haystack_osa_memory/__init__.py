"""haystack-osa-memory: assignment-scoped, governed agent memory in a Haystack + pgvector knowledge base."""

import os as _os

# Nothing leaves the machine unless asked: Haystack's usage telemetry is off unless the environment
# turns it on explicitly (HAYSTACK_TELEMETRY_ENABLED=True). Set before Haystack is imported.
_os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack_osa_memory.caller import Caller, caller_scope, current_caller, require_caller, scoped_caller
from haystack_osa_memory.components import (
    GovernedFactWriter,
    GoverningRowAclFilter,
    GuardedTextEmbedder,
    ScopedMemoryRetriever,
    ScopeMarkerStripper,
    ScopeMarkerWriter,
)
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import (
    AclLookupError,
    AuthenticationError,
    ConfigurationError,
    DatabaseError,
    EmbedderError,
    InvalidInputError,
    OsaMemoryError,
    SchemaError,
    ScopeError,
)
from haystack_osa_memory.memory import Memory, shared_memory
from haystack_osa_memory.pipelines import (
    ALLOWED_MODULES,
    build_customer_search_pipeline,
    build_recall_pipeline,
    build_store_pipeline,
)

__version__ = "0.1.0"

__all__ = [
    "ALLOWED_MODULES",
    "AclLookupError",
    "AuthenticationError",
    "Caller",
    "ConfigurationError",
    "DatabaseError",
    "EmbedderError",
    "GovernedFactWriter",
    "GoverningRowAclFilter",
    "GuardedTextEmbedder",
    "InvalidInputError",
    "Memory",
    "MemoryConfig",
    "OsaMemoryError",
    "SchemaError",
    "ScopeError",
    "ScopeMarkerStripper",
    "ScopeMarkerWriter",
    "ScopedMemoryRetriever",
    "__version__",
    "build_customer_search_pipeline",
    "build_recall_pipeline",
    "build_store_pipeline",
    "caller_scope",
    "current_caller",
    "require_caller",
    "scoped_caller",
    "shared_memory",
]
