from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict

from haystack_osa_memory.errors import AclLookupError, OsaMemoryError
from haystack_osa_memory.store.database import fact_scope
from haystack_osa_memory.store.facts import FactRepository
from haystack_osa_memory.store.memory_store import MemoryStore, store_from_environment
from haystack_osa_memory.tools import SUPERSEDED

logger = logging.getLogger(__name__)


@component
class GoverningRowAclFilter:
    """Admits retrieved documents only if their governing row allows it. Fails closed.

    A document is admitted when `meta["document_id"]` names a governing row whose org is the
    caller's, whose audience is one of `audiences`, whose status is admitted and, when an
    `assignment_id` is given, whose `metadata.assignment_id` equals it. A document without a
    governing row is never admitted. If the governing rows cannot be read, nothing is admitted
    and `AclLookupError` is raised.

    Add it after any retriever of the team's existing customer search:
    ```python
    from haystack import Pipeline
    from haystack_integrations.components.retrievers.pgvector import PgvectorKeywordRetriever
    from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore
    from haystack_osa_memory import GoverningRowAclFilter, MemoryStore

    store = PgvectorDocumentStore(table_name="haystack_documents", embedding_dimension=384)
    search = Pipeline()
    search.add_component("retriever", PgvectorKeywordRetriever(document_store=store, top_k=20))
    search.add_component("acl", GoverningRowAclFilter(audiences=["customer"], store=MemoryStore()))  # PG_CONN_STR
    search.connect("retriever.documents", "acl.documents")
    search.run({"retriever": {"query": "refund policy"}, "acl": {"org_id": "acme"}})
    ```
    """

    def __init__(
        self,
        audiences: list[str] | None = None,
        admitted_statuses: list[str] | None = None,
        store: MemoryStore | None = None,
    ) -> None:
        """
        :param audiences: Audiences admitted (default `["customer"]`).
        :param admitted_statuses: Statuses admitted (default `["approved"]`).
        :param store: The knowledge base (`MemoryStore`: connection, table names, timeouts). Required:
            without it the component still falls back to `MemoryStore()` (the `PG_CONN_STR` secret, read on
            first use) and warns (`DeprecationWarning`); from 0.2.0 it will not load.
        """
        self.audiences = list(audiences) if audiences is not None else ["customer"]
        self.admitted_statuses = list(admitted_statuses) if admitted_statuses is not None else ["approved"]
        if not self.audiences or not self.admitted_statuses:
            msg = "audiences and admitted_statuses must each name at least one value (an empty list admits nothing)"
            raise ValueError(msg)
        self.store = store if store is not None else store_from_environment("GoverningRowAclFilter")
        self._repo: FactRepository | None = None

    def warm_up(self) -> None:
        """Resolve the connection string (safe to call twice)."""
        if self._repo is None:
            self._repo = self.store.facts

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self, audiences=self.audiences, admitted_statuses=self.admitted_statuses, store=self.store.to_dict()
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GoverningRowAclFilter:
        params = data["init_parameters"]
        if isinstance(params.get("store"), dict):
            params["store"] = MemoryStore.from_dict(params["store"])
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document], rejected=int)
    def run(
        self,
        documents: list[Document],
        org_id: str,
        assignment_id: str | None = None,
        audiences: list[str] | None = None,
        include_superseded: bool = False,
    ) -> dict[str, Any]:
        """
        :param documents: Retrieved documents; each must carry `meta["document_id"]`.
        :param org_id: The caller's org (from trusted context).
        :param assignment_id: When given, only this assignment's documents are admitted.
        :param audiences: Narrow the audiences for this run (must be a subset of the configured ones).
        :param include_superseded: Admit facts with status `superseded` too (recall of history, `as_of`).
        :returns: `documents` admitted (order kept) and the count `rejected`.
        :raises AclLookupError: governing rows could not be read; nothing is admitted.
        """
        allowed = set(self.audiences)
        if audiences is not None:
            allowed &= set(audiences)
        ids = sorted({str(d.meta.get("document_id")) for d in documents if d.meta.get("document_id")})
        try:
            self.warm_up()
            assert self._repo is not None
            # Read inside the caller's scope when it names one (row-level security shows its facts);
            # without one, facts stay invisible and only other documents can be admitted.
            with fact_scope(org_id, assignment_id) if assignment_id is not None else nullcontext():
                rows = self._repo.governing_rows(ids, org_id)
        except OsaMemoryError as e:
            msg = f"governing rows could not be read, no document admitted: {e}"
            raise AclLookupError(msg) from e
        admitted = []
        for doc in documents:
            row = rows.get(str(doc.meta.get("document_id")))
            if (
                row is not None
                and row.org_id == org_id
                and row.audience in allowed
                and (row.status in self.admitted_statuses or (include_superseded and row.status == SUPERSEDED))
                and (assignment_id is None or row.assignment_id == assignment_id)
            ):
                admitted.append(doc)
        rejected = len(documents) - len(admitted)
        if rejected:
            logger.debug("governing-row ACL rejected %d of %d documents", rejected, len(documents))
        return {"documents": admitted, "rejected": rejected}
