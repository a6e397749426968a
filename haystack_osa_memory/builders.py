"""The only place components are connected: indexing (store), recall and customer search pipelines.

Each component takes a `MemoryStore` built from the config; its connection string is the
``PG_CONN_STR`` secret unless a ``connection_string`` secret is given (`Memory` passes the one it
resolved, so a `MemoryConfig` with its own `pg_conn_str` is honoured even when `PG_CONN_STR` points
elsewhere).
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
from haystack_osa_memory.privacy.redaction import CLASSES as REDACTION_CLASSES
from haystack_osa_memory.store.facts import FACT_AUDIENCE
from haystack_osa_memory.store.memory_store import MemoryStore

#: Module patterns to pass to `Pipeline.loads(..., allowed_modules=...)` for our YAML pipelines.
ALLOWED_MODULES = ["haystack_osa_memory.*"]


def _store(config: MemoryConfig, connection_string: Secret | None, store: MemoryStore | None = None) -> MemoryStore:
    return store or MemoryStore.from_config(config, connection_string or Secret.from_env_var("PG_CONN_STR"))


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
    pipe = Pipeline()
    redactor = PrivacyRedactor(enabled_classes=[c for c in REDACTION_CLASSES if c not in cfg.redaction_off])
    pipe.add_component("redact", redactor)
    if document_embedder is not None:
        pipe.add_component("embed", document_embedder)
    pipe.add_component("mark", ScopeMarkerWriter(dataset=cfg.dataset, status=cfg.admitted_statuses[0]))
    pipe.add_component("write", GovernedFactWriter(store=_store(cfg, connection_string, store)))
    if document_embedder is not None:
        pipe.connect("redact.documents", "embed.documents")
        pipe.connect("embed.documents", "mark.documents")
    else:
        pipe.connect("redact.documents", "mark.documents")
    pipe.connect("mark.documents", "write.documents")
    pipe.connect("mark.governing_rows", "write.governing_rows")
    return pipe


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
    pipe = Pipeline()
    if text_embedder is not None:
        embedder = (
            text_embedder
            if isinstance(text_embedder, GuardedTextEmbedder)
            else GuardedTextEmbedder(embedder=text_embedder, timeout=cfg.embedder_timeout)
        )
        pipe.add_component("embed", embedder)
    pipe.add_component(
        "retrieve",
        ScopedMemoryRetriever(
            top_k=top_k,
            admitted_statuses=list(cfg.admitted_statuses),
            **(retriever_params or {}),
            store=_store(cfg, connection_string, store),
        ),
    )
    pipe.add_component(
        "acl",
        GoverningRowAclFilter(
            audiences=[FACT_AUDIENCE],
            admitted_statuses=list(cfg.admitted_statuses),
            store=_store(cfg, connection_string, store),
        ),
    )
    pipe.add_component("strip", ScopeMarkerStripper())
    if text_embedder is not None:
        pipe.connect("embed.embedding", "retrieve.query_embedding")
    pipe.connect("retrieve.documents", "acl.documents")
    pipe.connect("acl.documents", "strip.documents")
    return pipe


def build_customer_search_pipeline(
    config: MemoryConfig | None = None,
    *,
    top_k: int = 10,
    connection_string: Secret | None = None,
    store: MemoryStore | None = None,
) -> Pipeline:
    """Customer-facing search: pgvector-haystack keyword retriever -> GoverningRowAclFilter(customer).

    Run it with ``{"retriever": {"query": ...}, "acl": {"org_id": ...}}``. Facts (audience
    `ai_internal`) and chunks without a governing row never pass the filter.
    """
    from haystack_integrations.components.retrievers.pgvector import PgvectorKeywordRetriever
    from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore

    cfg = config or MemoryConfig()
    kb = _store(cfg, connection_string, store)
    documents = PgvectorDocumentStore(
        connection_string=kb.connection_string,
        schema_name=cfg.kb_schema,
        table_name=cfg.chunk_table,
        embedding_dimension=cfg.embedding_dimension,
        language=cfg.language,
        keyword_index_name=f"{cfg.chunk_table}_keyword_index",
        hnsw_index_name=f"{cfg.chunk_table}_hnsw_index",
    )
    pipe = Pipeline()
    pipe.add_component("retriever", PgvectorKeywordRetriever(document_store=documents, top_k=top_k))
    pipe.add_component("acl", GoverningRowAclFilter(audiences=["customer"], store=kb))
    pipe.connect("retriever.documents", "acl.documents")
    return pipe
