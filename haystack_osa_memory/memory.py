"""`Memory`: the store / recall API that the MCP tools, the CLI and notebooks share."""

from __future__ import annotations

import logging
import threading
from typing import Any

from haystack import Document, Pipeline
from haystack.core.errors import PipelineRuntimeError

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.database import resolve_connection_string
from haystack_osa_memory.embedders import build_embedders
from haystack_osa_memory.errors import OsaMemoryError
from haystack_osa_memory.pipelines import build_customer_search_pipeline, build_recall_pipeline, build_store_pipeline
from haystack_osa_memory.store.schema import InitReport, ensure_schema
from haystack_osa_memory.validation import check_fact, check_limit, check_query, check_topic

logger = logging.getLogger(__name__)


def _unwrap(error: PipelineRuntimeError) -> BaseException:
    """The original error inside a pipeline failure (our typed errors pass through unchanged)."""
    cause: BaseException = error
    while isinstance(cause, PipelineRuntimeError) and cause.__cause__ is not None:
        cause = cause.__cause__
    return cause


def _run(pipe: Pipeline, data: dict[str, Any], include: set[str] | None = None) -> dict[str, Any]:
    try:
        return pipe.run(data, include_outputs_from=include)
    except PipelineRuntimeError as e:
        cause = _unwrap(e)
        if isinstance(cause, OsaMemoryError):
            raise cause from None
        raise


class Memory:
    """Assignment-scoped memory on the knowledge base: store and recall facts for a trusted caller.

    Usage:
    ```python
    from haystack_osa_memory import Caller, Memory

    memory = Memory()                              # PG_CONN_STR, else the embedded default
    me = Caller(org_id="acme", assignment_id="asg-1")
    memory.store("Staging deploys need the VPN", topic="deploy", caller=me)
    memory.recall("how do I deploy to staging?", caller=me)["facts"][0]["content"]
    ```
    """

    def __init__(
        self,
        config: MemoryConfig | None = None,
        *,
        document_embedder: Any | None = None,
        text_embedder: Any | None = None,
        use_default_embedders: bool = True,
        init_schema: bool = True,
    ) -> None:
        """
        :param config: Settings; `MemoryConfig.from_env()` by default.
        :param document_embedder: Any Haystack document embedder for the store side.
        :param text_embedder: Any Haystack text embedder for the recall side (same model as the document one).
        :param use_default_embedders: With no embedders given, build the configured default (`OSA_MEMORY_EMBEDDER`).
        :param init_schema: Create or upgrade the tables on first use.
        """
        self.config = config or MemoryConfig.from_env()
        if document_embedder is None and text_embedder is None and use_default_embedders:
            document_embedder, text_embedder = build_embedders(self.config)
        if (document_embedder is None) != (text_embedder is None):
            msg = "give both a document embedder and a text embedder (same model), or neither"
            raise ValueError(msg)
        self.document_embedder = document_embedder
        self.text_embedder = text_embedder
        self.init_schema = init_schema
        self.conn_str: str | None = None
        self.init_report: InitReport | None = None
        self.store_pipeline: Pipeline | None = None
        self.recall_pipeline: Pipeline | None = None
        self._lock = threading.Lock()

    @property
    def hybrid(self) -> bool:
        """True when an embedder is configured (lexical + vector recall)."""
        return self.text_embedder is not None

    def warm_up(self) -> None:
        """Connect (starting the embedded database if needed), create the schema, build the pipelines."""
        with self._lock:
            if self.store_pipeline is not None:
                return
            self.conn_str = resolve_connection_string(self.config)
            if self.init_schema:
                self.init_report = ensure_schema(self.conn_str, self.config)
            store = build_store_pipeline(self.config, self.document_embedder)
            recall = build_recall_pipeline(self.config, self.text_embedder)
            store.warm_up()
            recall.warm_up()
            self.store_pipeline, self.recall_pipeline = store, recall

    def store(self, fact: str, topic: str | None = None, *, caller: Caller) -> dict[str, Any]:
        """Store one fact in the caller's assignment (idempotent per assignment).

        :returns: `{"stored": True, "assignment_id": ..., "document_id": ...}`
        :raises InvalidInputError: the fact or topic is not allowed; nothing is written.
        :raises DatabaseError: the database failed; nothing is written.
        """
        text = check_fact(fact)
        topic = check_topic(topic)
        self.warm_up()
        assert self.store_pipeline is not None
        meta = {"topic": topic} if topic is not None else {}
        docs = [Document(content=text, meta=meta)]
        scope = {"org_id": caller.org_id, "assignment_id": caller.assignment_id, "specialist_id": caller.specialist_id}
        data: dict[str, Any] = {"mark": scope}
        if self.document_embedder is not None:
            data["embed"] = {"documents": docs}
        else:
            data["mark"] = {**scope, "documents": docs}
        result = _run(self.store_pipeline, data)
        return {
            "stored": True,
            "assignment_id": caller.assignment_id,
            "document_id": result["write"]["document_ids"][0],
        }

    def recall(self, query: str, limit: int = 8, *, caller: Caller) -> dict[str, Any]:
        """The caller's facts that best match ``query``, best first, without the scope marker.

        :returns: `{"assignment_id": ..., "facts": [{document_id, content, topic, score, stored_at}]}` plus
            `"degraded": reason` when the embedder failed and only the lexical side answered.
        """
        query = check_query(query)
        limit = check_limit(limit)
        self.warm_up()
        assert self.recall_pipeline is not None
        scope = {"org_id": caller.org_id, "assignment_id": caller.assignment_id}
        data: dict[str, Any] = {"retrieve": {**scope, "query": query, "top_k": limit}, "acl": scope}
        if self.text_embedder is not None:
            data["embed"] = {"text": query}
        result = _run(self.recall_pipeline, data, include={"embed"} if self.text_embedder is not None else None)
        facts = [
            {
                "document_id": doc.meta["document_id"],
                "content": doc.content,
                "topic": doc.meta.get("topic"),
                "score": round(float(doc.score or 0.0), 6),
                "stored_at": doc.meta.get("stored_at"),
            }
            for doc in result["strip"]["documents"]
        ]
        answer: dict[str, Any] = {"assignment_id": caller.assignment_id, "facts": facts}
        degraded = result.get("embed", {}).get("degraded")
        if degraded:
            answer["degraded"] = degraded
        return answer

    def customer_search(self, query: str, *, org_id: str, top_k: int = 10) -> list[Document]:
        """Customer-facing search over the same knowledge base; never returns a fact."""
        query = check_query(query)
        self.warm_up()
        pipe = build_customer_search_pipeline(self.config, top_k=top_k)
        result = _run(pipe, {"retriever": {"query": query}, "acl": {"org_id": org_id}})
        return list(result["acl"]["documents"])


_shared: Memory | None = None
_shared_lock = threading.Lock()


def shared_memory() -> Memory:
    """The process-wide `Memory` built from the environment (used by the Hayhooks wrappers)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Memory()
        return _shared
