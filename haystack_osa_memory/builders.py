"""The only place components are connected: indexing (store), recall and customer search pipelines.

Each component takes a `MemoryStore` built from the config (`MemoryStore.from_config`): a
`MemoryConfig` with its own `pg_conn_str` connects there and is saved as the ``PG_CONN_STR`` variable,
never as the value; a ``connection_string`` secret, when given, decides instead.

Every pipeline saves with `dumps()` and loads back with `Pipeline.loads(text,
allowed_modules=ALLOWED_MODULES)` as an equal pipeline: components are added in name order, the order
a saved pipeline lists them in, so the connections serialise in the same order too.
"""

from __future__ import annotations

from typing import Any

from haystack import Pipeline
from haystack.utils import Secret

from haystack_osa_memory.components import (
    GovernedFactWriter,
    GoverningRowAclFilter,
    GuardedTextEmbedder,
    PrivacyRedactor,
    ScopedMemoryRetriever,
    ScopeMarkerStripper,
    ScopeMarkerWriter,
)
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.store.facts import FACT_AUDIENCE
from haystack_osa_memory.store.memory_store import MemoryStore

#: Module patterns to pass to `Pipeline.loads(..., allowed_modules=...)` for our YAML pipelines.
ALLOWED_MODULES = ["haystack_osa_memory.*"]


def _store(config: MemoryConfig, connection_string: Secret | None, store: MemoryStore | None = None) -> MemoryStore:
    return store or MemoryStore.from_config(config, connection_string)


def _assemble(components: dict[str, Any], connections: list[tuple[str, str]]) -> Pipeline:
    """A pipeline of ``components`` added in name order (as `Pipeline.loads` adds them), then connected."""
    pipe = Pipeline()
    for name in sorted(components):
        pipe.add_component(name, components[name])
    for sender, receiver in connections:
        pipe.connect(sender, receiver)
    return pipe


def build_store_pipeline(
    config: MemoryConfig | None = None,
    document_embedder: Any | None = None,
    *,
    connection_string: Secret | None = None,
    store: MemoryStore | None = None,
) -> Pipeline:
    """Indexing: PrivacyRedactor -> [document embedder on the plain fact] -> ScopeMarkerWriter -> GovernedFactWriter.

    Run it with ``{"redact": {"documents": [...]}, "mark": {"org_id": ..., "assignment_id": ...}}``.
    """
    cfg = config or MemoryConfig()
    components: dict[str, Any] = {
        "redact": PrivacyRedactor(enabled_classes=cfg.enabled_redaction_classes),
        "mark": ScopeMarkerWriter(dataset=cfg.dataset, status=cfg.admitted_statuses[0]),
        "write": GovernedFactWriter(store=_store(cfg, connection_string, store)),
    }
    connections = [("mark.documents", "write.documents"), ("mark.governing_rows", "write.governing_rows")]
    if document_embedder is not None:
        components["embed"] = document_embedder
        connections += [("redact.documents", "embed.documents"), ("embed.documents", "mark.documents")]
    else:
        connections.append(("redact.documents", "mark.documents"))
    return _assemble(components, connections)


def build_recall_pipeline(
    config: MemoryConfig | None = None,
    text_embedder: Any | None = None,
    *,
    top_k: int = 8,
    retriever_params: dict[str, Any] | None = None,
    connection_string: Secret | None = None,
    store: MemoryStore | None = None,
) -> Pipeline:
    """Recall: [guarded text embedder] -> ScopedMemoryRetriever -> GoverningRowAclFilter -> ScopeMarkerStripper.

    The retriever applies the scope in SQL; the ACL filter re-checks every governing row (defence in
    depth, fail closed); the stripper removes the marker line.
    """
    cfg = config or MemoryConfig()
    kb = _store(cfg, connection_string, store)
    components: dict[str, Any] = {
        "retrieve": ScopedMemoryRetriever(
            top_k=top_k, admitted_statuses=list(cfg.admitted_statuses), **(retriever_params or {}), store=kb
        ),
        "acl": GoverningRowAclFilter(
            audiences=[FACT_AUDIENCE], admitted_statuses=list(cfg.admitted_statuses), store=kb
        ),
        "strip": ScopeMarkerStripper(),
    }
    connections = [("retrieve.documents", "acl.documents"), ("acl.documents", "strip.documents")]
    if text_embedder is not None:
        components["embed"] = (
            text_embedder
            if isinstance(text_embedder, GuardedTextEmbedder)
            else GuardedTextEmbedder(embedder=text_embedder, timeout=cfg.embedder_timeout)
        )
        connections.append(("embed.embedding", "retrieve.query_embedding"))
    return _assemble(components, connections)


def build_customer_search_pipeline(
    config: MemoryConfig | None = None,
    *,
    top_k: int = 10,
    connection_string: Secret | None = None,
    store: MemoryStore | None = None,
) -> Pipeline:
    """Customer-facing search: pgvector-haystack keyword retriever -> GoverningRowAclFilter(customer).

    Run it with ``{"retriever": {"query": ..., "top_k": ...}, "acl": {"org_id": ...}}`` (``top_k`` is
    optional there: the one given here by default). Facts (audience `ai_internal`) and chunks without a
    governing row never pass the filter. The retriever's document store searches on the knowledge base's
    pooled connections (`PooledPgvectorDocumentStore`), so one pipeline serves every call and thread.
    """
    from haystack_integrations.components.retrievers.pgvector import PgvectorKeywordRetriever

    from haystack_osa_memory.store.pooled_documents import PooledPgvectorDocumentStore

    cfg = config or MemoryConfig()
    kb = _store(cfg, connection_string, store)
    return _assemble(
        {
            "retriever": PgvectorKeywordRetriever(document_store=PooledPgvectorDocumentStore(store=kb), top_k=top_k),
            "acl": GoverningRowAclFilter(audiences=["customer"], store=kb),
        },
        [("retriever.documents", "acl.documents")],
    )
