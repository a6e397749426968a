"""`Memory`: the store / recall API that the MCP tools, the CLI and notebooks share."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from haystack import Document, Pipeline
from haystack.core.errors import PipelineRuntimeError

from haystack_osa_memory.builders import build_customer_search_pipeline, build_recall_pipeline, build_store_pipeline
from haystack_osa_memory.caller import Caller, switch_read_for
from haystack_osa_memory.components.supersession_judge import SupersessionJudge
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.embedders import build_embedders
from haystack_osa_memory.errors import DatabaseError, InvalidInputError, MemoryOffError, NotFoundError, OsaMemoryError
from haystack_osa_memory.markers import marked_fact
from haystack_osa_memory.offline import OfflineBuffer
from haystack_osa_memory.privacy.gate import redact_field, secret_classes
from haystack_osa_memory.privacy.redaction import redact
from haystack_osa_memory.reflect import ReflectReport, ReflectSettings, consolidate_scope
from haystack_osa_memory.store.database import classify, fact_scope, resolve_connection_string
from haystack_osa_memory.store.facts import FACT_SOURCE
from haystack_osa_memory.store.lifecycle import (
    LISTABLE_STATUSES,
    PROPOSED,
    LifecycleRepository,
    Scope,
    count_scope_statement,
)
from haystack_osa_memory.store.memory_store import MemoryStore
from haystack_osa_memory.store.schema import InitReport, SchemaState, ensure_schema

# Re-exported: `memory` defined them before `supersession_suggestions` did.
from haystack_osa_memory.supersession_suggestions import SUGGESTION_COSINE_MIN as SUGGESTION_COSINE_MIN
from haystack_osa_memory.supersession_suggestions import SUGGESTION_SHARED_SHARE as SUGGESTION_SHARED_SHARE
from haystack_osa_memory.supersession_suggestions import SUGGESTION_SIMILARITY_MIN as SUGGESTION_SIMILARITY_MIN
from haystack_osa_memory.supersession_suggestions import SUGGESTIONS_MAX as SUGGESTIONS_MAX
from haystack_osa_memory.supersession_suggestions import SUGGESTIONS_SEARCHED as SUGGESTIONS_SEARCHED
from haystack_osa_memory.supersession_suggestions import (
    as_judge,
    judge_predecessors,
    possible_predecessors,
    warm_up_judge,
)
from haystack_osa_memory.tools import HELD_STATUSES, SUPERSEDES_MAX, RecallArguments, StoreArguments
from haystack_osa_memory.transfer import ImportItem, ImportReport, import_facts
from haystack_osa_memory.validation import (
    CURSOR_MAX,
    KINDS,
    NOTE_MAX,
    PATH_MAX,
    PATHS_MAX,
    PERSONA_MAX,
    PERSONAS_MAX,
    REASON_MAX,
    TITLE_MAX,
    VERDICTS,
    check_choice,
    check_document_id,
    check_document_ids,
    check_fact,
    check_limit,
    check_query,
    check_string_list,
    check_text,
    check_timestamp,
    check_topic,
    check_ttl_days,
    check_validity,
    normalise,
)
from haystack_osa_memory.yaml_pipelines import EMBED, JUDGE, PipelineDefinitions, judge_of, load_pipeline

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
            raise cause from cause.__cause__  # keep the database error underneath (offline detection)
        raise


def _scope_params(caller: Caller) -> dict[str, Any]:
    return {"org_id": caller.org_id, "assignment_id": caller.assignment_id, "source": FACT_SOURCE}


def _not_found(document_id: str) -> str:
    return f"no fact {document_id} in this assignment"


def _link(version: dict[str, Any]) -> dict[str, Any]:
    """One version of a chain as `kb_memory_read` shows it."""
    return {k: version[k] for k in ("document_id", "status", "valid_from", "valid_to", "content")}


_CONNECTION_DETAIL = re.compile(r"connection to server|socket|host=|\bport\b|\buser\b", re.IGNORECASE)


def _public_detail(state: str, detail: str | None) -> str | None:
    """A probe failure as callers may see it: never the socket path, host, port or role of the connection."""
    if state == "ok" or detail is None:
        return None
    if state == "unreachable":
        return "the database cannot be reached"
    if _CONNECTION_DETAIL.search(detail):
        if state == "unauthorised":
            return "the database refused the server's connection (credentials or permissions)"
        return "the database connection failed"
    return detail


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
        init_schema: bool = False,
        definitions: PipelineDefinitions | None = None,
        judge: Any | None = None,
    ) -> None:
        """
        :param config: Settings; `MemoryConfig.from_env()` by default.
        :param document_embedder: Any Haystack document embedder for the store side.
        :param text_embedder: Any Haystack text embedder for the recall side (same model as the document one).
        :param use_default_embedders: With no embedders given, build the configured default (`OSA_MEMORY_EMBEDDER`).
        :param init_schema: Apply the migrations on first use, as `osa-memory init` does. Off by default:
            on a team's database (`PG_CONN_STR`) memory only checks the schema version and runs no DDL;
            the embedded default database is brought up to date automatically.
        :param judge: Any Haystack chat generator (``run(messages=[ChatMessage])`` answering ``replies``), or a
            `SupersessionJudge` wrapping one with its budget, that decides whether a stored fact replaces the
            facts `possibly_supersedes` would offer; those it confirms are superseded at once, and when it
            fails or runs out of time they are offered as suggestions. Off by default (no LLM is needed);
            with ``definitions``, the store YAML may name one instead (component `judge`).
        :param definitions: Run these YAML store and recall pipelines (`yaml_pipelines`) instead of the
            built-in ones; their embedder is the one used, and the embedder arguments are then not allowed.
        """
        self.config = config or MemoryConfig.from_env()
        self.definitions = definitions
        self.judge: SupersessionJudge | None = as_judge(judge)
        self._judge_given = self.judge
        if definitions is not None:
            if document_embedder is not None or text_embedder is not None:
                msg = "the pipeline definitions name their embedder: give embedders or definitions, not both"
                raise ValueError(msg)
            use_default_embedders = False
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
        self.schema: SchemaState | None = None
        self.store_pipeline: Pipeline | None = None
        self.recall_pipeline: Pipeline | None = None
        self.customer_search_pipeline: Pipeline | None = None
        self.lifecycle: LifecycleRepository | None = None
        #: The knowledge base, once warmed up: the one object that owns the connection and the SQL.
        self.kb: MemoryStore | None = None
        self.offline = OfflineBuffer(self.config.offline_buffer_path, self.config.dataset)
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
            # The resolved string is used in this process; saved pipelines name PG_CONN_STR instead.
            kb = MemoryStore.from_config(self.config.model_copy(update={"pg_conn_str": self.conn_str}))
            self.schema, report = kb.prepare_schema(embedded=self.config.pg_conn_str is None)
            self.init_report = self.init_report or report
            self.kb = kb
            if self.definitions is not None:
                origin = self.definitions.origin
                store = load_pipeline(self.definitions.store, config=self.config, store=self.kb, origin=origin)
                recall = load_pipeline(self.definitions.recall, config=self.config, store=self.kb, origin=origin)
                # The YAML's embedder is the one in use (status, degraded answers, import).
                names = {n for n, _ in store.walk()}, {n for n, _ in recall.walk()}
                if JUDGE in names[0]:
                    # It runs after the store pipeline, on what the store found, never inside the pipeline.
                    self.judge = judge_of(store.remove_component(JUDGE), self._judge_given, origin)
                self.document_embedder = store.get_component(EMBED) if EMBED in names[0] else None
                self.text_embedder = recall.get_component(EMBED) if EMBED in names[1] else None
            else:
                store = build_store_pipeline(self.config, self.document_embedder, store=self.kb)
                recall = build_recall_pipeline(self.config, self.text_embedder, store=self.kb)
            store.warm_up()
            recall.warm_up()
            warm_up_judge(self.judge)
            self.lifecycle = self.kb.lifecycle
            self.store_pipeline, self.recall_pipeline = store, recall

    def close(self) -> None:
        """Let go of the knowledge base's connection pool (`MemoryStore.close`) and of the pipelines built on
        it. Idempotent; a later call warms up again."""
        with self._lock:
            kb, self.kb = self.kb, None
            self.store_pipeline = self.recall_pipeline = self.customer_search_pipeline = None
            self.lifecycle = None
        if kb is not None:
            kb.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- guards --------------------------------------------------------------------------------
    def _lifecycle(self, caller: Caller) -> LifecycleRepository:
        """Warm up, then refuse (writing nothing) when a kill switch turned memory off."""
        if not self.config.enabled:
            raise MemoryOffError()
        self.warm_up()
        assert self.lifecycle is not None
        # Read with this request's token when served (`caller.switch_read_for`), else asked here.
        off = switch_read_for(caller)
        if off is None:
            try:
                off = self.lifecycle.is_off(caller.org_id, caller.assignment_id)
            except DatabaseError as e:
                self._refuse_if_known_off(caller, e)
                raise
        self.offline.switches.note(caller, off)
        if off:
            raise MemoryOffError()
        if self.offline.switches.list_due():
            switches = self.lifecycle.switches()
            self.offline.switches.note_all((s["org_id"], s["assignment_id"]) for s in switches)
        self.flush()
        return self.lifecycle

    def _refuse_if_known_off(self, caller: Caller, error: DatabaseError) -> None:
        """While the database is unreachable, a scope last seen switched off is refused at once, as it
        would be with the database up: nothing is buffered that the replay would have to hold back."""
        if classify(error) == "unreachable" and self.offline.switches.known_off(caller):
            raise MemoryOffError() from None

    def _write(
        self,
        docs: list[Document],
        caller: Caller,
        *,
        status: str | None = None,
        action: str = "store",
        vectors: list[Any] | None = None,
        statuses: list[str] | None = None,
    ) -> tuple[list[str], int]:
        """Run the store pipeline; returns the document ids and how many values were redacted. With
        ``vectors``, the documents' embeddings (or ``None``) are appended to it; with ``statuses``, the
        status each fact has after the write."""
        assert self.store_pipeline is not None
        scope = {
            "org_id": caller.org_id,
            "assignment_id": caller.assignment_id,
            "specialist_id": caller.specialist_id,
            "status": status,
            "stored_by": caller.run_id,
        }
        data: dict[str, Any] = {
            "redact": {"documents": docs},
            "mark": scope,
            "write": {"actor": caller.run_id, "action": action},
        }
        result = _run(self.store_pipeline, data, include={"redact", "mark"} if vectors is not None else {"redact"})
        if vectors is not None:
            vectors.extend(doc.embedding for doc in result.get("mark", {}).get("documents", []))
        if statuses is not None:
            statuses.extend(result["write"].get("statuses", []))
        return list(result["write"]["document_ids"]), int(result["redact"]["redactions"])

    # -- tools ---------------------------------------------------------------------------------
    def store(
        self,
        fact: str,
        topic: str | None = None,
        *,
        caller: Caller,
        kind: str = "fact",
        ttl_days: int | None = None,
        supersedes: list[str] | None = None,
        valid_from: str | datetime | date | None = None,
        valid_to: str | datetime | date | None = None,
    ) -> dict[str, Any]:
        """Store one fact in the caller's assignment (idempotent per assignment).

        :param kind: one of `fact`, `procedure`, `pitfall`, `preference`, `reference`.
        :param ttl_days: after this many days the fact is returned marked `stale`, ranked below fresh ones.
        :param supersedes: ids of facts of the caller's scope this one replaces: in the same transaction they
            become `superseded` (kept as history), hold until this fact's `valid_from`, and link to it.
        :param valid_from: from when the fact holds (ISO 8601, `datetime` or `date`; default: now, or the
            time it was first stored when the same fact is stored again).
        :param valid_to: until when it holds (default: until superseded).
        :returns: `{"stored": True, "assignment_id", "document_id", "redactions",
            "possibly_supersedes": [{document_id, content}], "superseded": [ids]}`; `possibly_supersedes`
            lists facts of the scope this one probably replaces (near-duplicate wording, another value),
            unchanged: store again with `supersedes` to confirm (with a `judge`, the judge decides instead).
        :raises InvalidInputError: an argument is not allowed; nothing is written.
        :raises SupersessionError: an id in `supersedes` cannot be superseded; nothing is written.
        :raises MemoryOffError: a kill switch is off; nothing is written.
        :raises DatabaseError: the database failed; nothing is written.
        """
        text = check_fact(fact)
        topic = check_topic(topic)
        kind = check_choice(kind, "kind", KINDS)
        ttl = check_ttl_days(ttl_days)
        replaced = check_document_ids(supersedes, "supersedes", max_items=SUPERSEDES_MAX)
        since = check_timestamp(valid_from, "valid_from")
        until = check_timestamp(valid_to, "valid_to")
        check_validity(since, until)
        if until is not None and since is None and until <= datetime.now(UTC):
            msg = f"valid_to ({until.isoformat()}) is in the past: give valid_from too for a fact that held before"
            raise InvalidInputError(msg)
        topic, topic_redactions = self._redact_short(topic)
        meta: dict[str, Any] = {"kind": kind}
        if topic is not None:
            meta["topic"] = topic
        if ttl is not None:
            meta["expires_at"] = (datetime.now(UTC) + timedelta(days=ttl)).isoformat()
        if since is not None:
            meta["valid_from"] = since.isoformat()
        if until is not None:
            meta["valid_to"] = until.isoformat()
        if replaced:
            meta["supersedes"] = replaced
        try:
            self._lifecycle(caller)
            vectors: list[Any] = []
            statuses: list[str] = []
            (doc_id,), redactions = self._write(
                [Document(content=text, meta=meta)], caller, vectors=vectors, statuses=statuses
            )
        except DatabaseError as e:
            if classify(e) != "unreachable":
                raise
            # Queued facts hold from when they were sent, not from when the buffer is replayed.
            return self._queue(text, {"valid_from": datetime.now(UTC).isoformat(), **meta}, caller, e)
        answer: dict[str, Any] = {
            "stored": True,
            "assignment_id": caller.assignment_id,
            "document_id": doc_id,
            "redactions": redactions + topic_redactions,
        }
        if statuses and statuses[0] in HELD_STATUSES:
            # The same text as a fact waiting for (or refused by) a person's review: it stays so.
            answer["status"] = statuses[0]
        if replaced:
            answer["superseded"] = replaced
        if not self.config.suggest_supersedes:
            return answer
        # The fact is stored: what follows only adds to the answer, and its failure must not turn the
        # store into an error (the agent would store it again).
        vector = vectors[0] if vectors else None
        try:
            possible = self._possible_predecessors(text, doc_id, set(replaced), caller, vector)
        except OsaMemoryError as e:
            logger.warning("store %s: the search for the facts it may replace failed: %s", doc_id, type(e).__name__)
            return answer
        if self.judge is not None and possible:
            # It sees what was stored (redacted), never the caller's raw text: it may be a remote LLM.
            confirmed, possible = judge_predecessors(
                self.judge,
                self._redact_short(text)[0] or text,
                possible,
                lambda ids: self._write(
                    [Document(content=text, meta={**meta, "supersedes": ids})], caller, action="store-judged"
                ),
                document_id=doc_id,
            )
            if confirmed:
                answer["superseded"] = [*replaced, *confirmed]
        answer["possibly_supersedes"] = possible
        return answer

    def store_arguments(self, args: StoreArguments, *, caller: Caller) -> dict[str, Any]:
        """`store` with the `kb_memory_store` tool's arguments (the MCP wrapper and the Agent tool)."""
        return self.store(
            args.fact,
            args.topic,
            kind=args.kind,
            ttl_days=args.ttl_days,
            supersedes=args.supersedes,
            valid_from=args.valid_from,
            valid_to=args.valid_to,
            caller=caller,
        )

    def recall_arguments(self, args: RecallArguments, *, caller: Caller) -> dict[str, Any]:
        """`recall` with the `kb_memory_recall` tool's arguments (the MCP wrapper and the Agent tool)."""
        return self.recall(
            args.query, args.limit, as_of=args.as_of, include_superseded=args.include_superseded, caller=caller
        )

    def _possible_predecessors(
        self, text: str, document_id: str, named: set[str], caller: Caller, embedding: Any | None
    ) -> list[dict[str, str]]:
        """Facts of the caller's scope that ``text`` probably restates with another value
        (`supersession_suggestions.possible_predecessors`)."""
        assert self.recall_pipeline is not None
        return possible_predecessors(self.recall_pipeline, self.kb, text, document_id, named, caller, embedding)

    def _redact_short(self, text: str | None) -> tuple[str | None, int]:
        """Redact a short field (topic) with the configured classes."""
        if text is None:
            return None, 0
        classes = self.config.enabled_redaction_classes
        result = redact(text, enabled_classes=classes)
        return result.text, result.total

    # -- offline buffer (haystack_osa_memory.offline) ------------------------------------------
    def _queue(self, text: str, meta: dict[str, Any], caller: Caller, error: BaseException) -> dict[str, Any]:
        """Hold a fact (redacted first) while the database is unreachable."""
        redacted, redactions = self._redact_short(text)
        return self.offline.hold(redacted or text, meta, caller, redactions=redactions, error=error)

    def flush(self) -> int:
        """Store the facts held while the database was unreachable (`OfflineBuffer.replay`): each in its
        own scope, in order within it, only while its token is still active (else set aside in the rejected
        file) and its scope switched on (else kept for a later replay). Called automatically by the first
        successful database call. Returns how many were stored."""
        if not self.offline.queue.path.exists():
            return 0
        lifecycle = self.lifecycle
        assert lifecycle is not None
        assert self.kb is not None
        tokens = self.kb.tokens
        return self.offline.replay(
            lambda doc, caller: self._write([doc], caller, action="store-replay"),
            is_off=lambda caller: not self.config.enabled or lifecycle.is_off(caller.org_id, caller.assignment_id),
            token_active=tokens.is_active,
        )

    def propose(
        self,
        kind: str,
        title: str,
        body: str,
        paths: list[str] | None = None,
        personas: list[str] | None = None,
        *,
        caller: Caller,
    ) -> dict[str, Any]:
        """Propose a fact for review through the curation gate; it is not recalled until accepted.

        :returns: `{"document_id": ..., "status": "proposed"}` or `{"rejected": reason}`.
        """
        if kind == "decision":
            msg = f"kind 'decision' is not allowed; use one of {list(KINDS)}"
            raise InvalidInputError(msg)
        kind = check_choice(kind, "kind", KINDS)
        title = check_text(title, "title", min_len=1, max_len=TITLE_MAX)
        body = check_fact(body)
        paths = check_string_list(paths, "paths", max_items=PATHS_MAX, max_len=PATH_MAX)
        personas = check_string_list(personas, "personas", max_items=PERSONAS_MAX, max_len=PERSONA_MAX)
        lifecycle = self._lifecycle(caller)
        secret = secret_classes("\n".join([title, body, *paths, *personas]))
        if secret:
            return {"rejected": f"contains a secret ({', '.join(secret)}); remove it and propose again"}
        # The title (governing row's title column and metadata), paths and personas (metadata) are
        # stored beside the content, where the pipeline's redactor does not reach: redact them here.
        fields = [redact_field(text, self.config.redaction_off) for text in (title, *paths, *personas)]
        field_redactions = sum(result.total for result in fields)
        title = fields[0].text
        paths = [result.text for result in fields[1 : 1 + len(paths)]]
        personas = [result.text for result in fields[1 + len(paths) :]]
        content = f"{title}\n\n{body}"
        wanted = {normalise(body), normalise(content)}
        for doc_id, text in lifecycle.scope_contents(Scope(caller.org_id, caller.assignment_id)).items():
            if wanted & {normalise(text), normalise(text.split("\n\n", 1)[-1])}:
                return {"rejected": f"duplicate of fact {doc_id} in this assignment"}
        meta: dict[str, Any] = {"kind": kind, "title": title, "paths": paths, "personas": personas}
        docs = [Document(content=content, meta=meta)]
        (doc_id,), redactions = self._write(docs, caller, status=PROPOSED, action="propose")
        return {"document_id": doc_id, "status": PROPOSED, "redactions": redactions + field_redactions}

    def read(self, document_id: str, *, caller: Caller) -> dict[str, Any]:
        """The whole fact with provenance; records one read per (caller run, fact).

        :raises NotFoundError: no such fact in the caller's assignment (the same for other scopes' facts).
        """
        document_id = check_document_id(document_id)
        scope = Scope(caller.org_id, caller.assignment_id)
        lifecycle = self._lifecycle(caller)
        found = lifecycle.read(scope, document_id, caller.run_id)
        if found is None:
            raise NotFoundError(_not_found(document_id))
        if found.get("supersedes") or found.get("superseded_by"):
            found["chain"] = [_link(v) for v in lifecycle.chain(scope, document_id)]
        return found

    def history(self, document_id: str, *, caller: Caller) -> list[dict[str, Any]]:
        """Every version of a fact (its supersession chain, itself included), oldest validity first: each
        `{document_id, status, valid_from, valid_to, content, supersedes, superseded_by}`.

        :raises NotFoundError: no such fact in the caller's assignment (the same for other scopes' facts).
        """
        document_id = check_document_id(document_id)
        versions = self._lifecycle(caller).chain(Scope(caller.org_id, caller.assignment_id), document_id)
        if not versions:
            raise NotFoundError(_not_found(document_id))
        return versions

    def feedback(self, document_id: str, verdict: str, note: str | None = None, *, caller: Caller) -> dict[str, Any]:
        """Confirm or flag a fact; one vote per (caller run, fact), a changed verdict replaces the old one.

        A note with a secret is refused; its private addresses and user paths are redacted (configured
        classes) by the repository before the note is kept in the feedback and audit tables.

        :returns: `{"document_id", "trust", "status", "confirms", "flags"}`
        """
        document_id = check_document_id(document_id)
        verdict = check_choice(verdict, "verdict", VERDICTS)
        if note is not None:
            note = check_text(note, "note", min_len=1, max_len=NOTE_MAX)
            secret = secret_classes(note)
            if secret:
                msg = f"note must not contain secrets (found {', '.join(secret)}); remove them"
                raise InvalidInputError(msg)
        result = self._lifecycle(caller).feedback(
            Scope(caller.org_id, caller.assignment_id),
            document_id,
            run_id=caller.run_id,
            verdict=verdict,
            note=note,
            floor=self.config.trust_floor,
            actor=caller.run_id,
        )
        if result is None:
            raise NotFoundError(_not_found(document_id))
        return result

    def forget(self, document_id: str, reason: str, *, caller: Caller) -> dict[str, Any]:
        """Retract a fact: never recalled, read or counted again; storing its text later creates it afresh.

        The reason is redacted like a fact (configured classes, secrets included) by the repository
        before it is kept in the audit and the retired governing row's metadata.
        """
        document_id = check_document_id(document_id)
        reason = check_text(reason, "reason", min_len=1, max_len=REASON_MAX)
        scope = Scope(caller.org_id, caller.assignment_id)
        if not self._lifecycle(caller).forget(scope, document_id, reason=reason, actor=caller.run_id):
            raise NotFoundError(_not_found(document_id))
        return {"forgotten": True, "document_id": document_id}

    def list_facts(
        self,
        status: str | None = None,
        topic: str | None = None,
        cursor: str | None = None,
        *,
        caller: Caller,
    ) -> dict[str, Any]:
        """Page (20 at a time, oldest first) through the caller's facts; pass `next_cursor` back for more."""
        if status is not None:
            status = check_choice(status, "status", LISTABLE_STATUSES)
        topic = check_topic(topic)
        if cursor is not None:
            cursor = check_text(cursor, "cursor", min_len=1, max_len=CURSOR_MAX)
        scope = Scope(caller.org_id, caller.assignment_id)
        return self._lifecycle(caller).list_facts(scope, status=status, topic=topic, cursor=cursor)

    def recall(
        self,
        query: str,
        limit: int = 8,
        *,
        caller: Caller,
        as_of: str | datetime | date | None = None,
        include_superseded: bool = False,
    ) -> dict[str, Any]:
        """The caller's facts that best match ``query``, best first, without the scope marker.

        :param as_of: recall the facts that held at this time (ISO 8601, `datetime` or `date`); default now.
        :param include_superseded: also the facts that no longer hold (superseded or past `valid_to`), each
            with `valid_to` and `superseded_by` (with `as_of`: every fact that held at some time up to it).
        :returns: `{"assignment_id": ..., "facts": [{document_id, content, topic, score, stored_at, kind, stale,
            valid_from, valid_to, superseded_by?, conflicts_with?}]}` plus `"degraded": reason` when the
            embedder failed and only the lexical side answered. Among facts that restate each other with
            another value (`conflicts_with`), the one valid from later ranks first.
        """
        query = check_query(query)
        limit = check_limit(limit)
        at = check_timestamp(as_of, "as_of")
        if not isinstance(include_superseded, bool):
            msg = f"include_superseded must be true or false, got {include_superseded!r}"
            raise InvalidInputError(msg)
        try:
            return self._recall(query, limit, caller, as_of=at, include_superseded=include_superseded)
        except DatabaseError as e:
            if classify(e) != "unreachable":
                raise
            return self.offline.recall(query, limit, caller)

    def _recall(
        self,
        query: str,
        limit: int,
        caller: Caller,
        *,
        as_of: datetime | None = None,
        include_superseded: bool = False,
    ) -> dict[str, Any]:
        self._lifecycle(caller)
        assert self.recall_pipeline is not None
        scope = {"org_id": caller.org_id, "assignment_id": caller.assignment_id}
        data: dict[str, Any] = {"retrieve": {**scope, "query": query, "top_k": limit}, "acl": dict(scope)}
        if as_of is not None:
            data["retrieve"]["as_of"] = as_of.isoformat()
        if include_superseded:
            data["retrieve"]["include_superseded"] = True
        if as_of is not None or include_superseded:
            data["acl"]["include_superseded"] = True
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
                "kind": doc.meta.get("kind", "fact"),
                "stale": bool(doc.meta.get("stale")),
                "valid_from": doc.meta.get("valid_from"),
                "valid_to": doc.meta.get("valid_to"),
                **{key: doc.meta[key] for key in ("superseded_by", "conflicts_with") if doc.meta.get(key)},
            }
            for doc in result["strip"]["documents"]
        ]
        answer: dict[str, Any] = {"assignment_id": caller.assignment_id, "facts": facts}
        degraded = result.get("embed", {}).get("degraded")
        if degraded:
            answer["degraded"] = degraded
        return answer

    def reflect(
        self,
        *,
        caller: Caller,
        summariser: Callable[[list[str]], str] | None = None,
        settings: ReflectSettings | None = None,
    ) -> dict[str, Any]:
        """Consolidate near-duplicate and repeated facts of the caller's scope into observations.

        Deterministic without a summariser (see `haystack_osa_memory.reflect`); idempotent.
        :returns: what changed (`groups`, `observations_created`, `observations_updated`, `facts_consolidated`).
        """
        lifecycle = self._lifecycle(caller)
        scope = Scope(caller.org_id, caller.assignment_id)

        def write_observation(text: str, meta: dict[str, Any]) -> str:
            (observation_id,), _ = self._write([Document(content=text, meta=meta)], caller, action="reflect")
            return observation_id

        report = consolidate_scope(
            ReflectReport(caller.org_id, caller.assignment_id),
            lifecycle.reflect_candidates(scope),
            settings=settings or ReflectSettings(),
            summariser=summariser,
            write_observation=write_observation,
            consolidate=lambda observation_id, evidence, raw_ids, validity: lifecycle.consolidate(
                scope, observation_id, evidence, raw_ids, actor=caller.run_id, validity=validity
            ),
        )
        return report.as_dict()

    def import_items(
        self,
        items: Iterable[ImportItem],
        *,
        caller: Caller,
        batch_size: int = 64,
        on_batch: Callable[[int], None] | None = None,
    ) -> ImportReport:
        """Store many facts in batches; facts already there (same bytes, same scope) are skipped.

        An operator's action (`osa-memory import`): the statuses the items give are restored as they are.
        Facts the tools would refuse are reported in ``invalid`` and the rest stored; facts that supersede
        others of the items are written after them; the planner's statistics are refreshed as the facts
        arrive (`transfer.import_facts`). Idempotent and resumable: re-running an import stores nothing new.
        """
        lifecycle = self._lifecycle(caller)
        assert self.store_pipeline is not None
        assert self.kb is not None
        redactor = self.store_pipeline.get_component("redact")

        def redact_batch(docs: list[Document]) -> tuple[list[Document], int]:
            out = redactor.run(documents=docs)
            return list(out["documents"]), int(out["redactions"])

        # In the caller's scope: with row-level security on, `live_ids` sees only this scope's facts.
        with fact_scope(caller.org_id, caller.assignment_id):
            return import_facts(
                items,
                redact=redact_batch,
                redact_topic=self._redact_short,
                document_id=lambda text: marked_fact(text, caller.org_id, caller.assignment_id, self.config.dataset)[2],
                live_ids=lambda ids: lifecycle.live_ids(ids, caller.org_id),
                write=lambda docs, status: self._write(docs, caller, status=status, action="import"),
                batch_size=batch_size,
                on_batch=on_batch,
                analyze=self.kb.facts.analyze,
            )

    def export(self, *, caller: Caller) -> Iterator[dict[str, Any]]:
        """Every live fact of the caller's scope, oldest first (see `transfer.export_line`)."""
        return self._lifecycle(caller).export_rows(Scope(caller.org_id, caller.assignment_id))

    def status(self, *, caller: Caller) -> dict[str, Any]:
        """Health for ``caller``: database state (`ok`, `unreachable`, `unauthorised`, `erroring`), pending
        buffered facts, embedder, scope and its fact count, version. Refuses when a kill switch is off."""
        from haystack_osa_memory import __version__

        if not self.config.enabled:
            raise MemoryOffError()
        # Before warm-up (the database may be away), a store of its own: a probe holds no pool.
        kb = self.kb or MemoryStore.from_config(
            self.config.model_copy(update={"pg_conn_str": self.conn_str or resolve_connection_string(self.config)})
        )
        state, detail = kb.probe(count_scope_statement(self.config), _scope_params(caller))
        facts: int | None = None
        if state == "unreachable" and self.offline.switches.known_off(caller):
            raise MemoryOffError()
        if state == "ok":
            lifecycle = self._lifecycle(caller)
            facts = lifecycle.count_scope(Scope(caller.org_id, caller.assignment_id))
        if self.text_embedder is None:
            embedder: dict[str, Any] = {"state": "none", "mode": "lexical"}
        else:
            guard = self.recall_pipeline.get_component("embed") if self.recall_pipeline is not None else None
            ready = guard is None or getattr(guard, "available", True)
            embedder = {"state": "ready" if ready else "unavailable", "mode": "hybrid" if ready else "lexical"}
        if detail is not None:
            logger.info("status probe: database %s: %s", state, detail)
        pending, rejected = self.offline.counts(caller)
        # Only the caller's scope is counted, and the probe's detail is shown without connection details.
        return {
            "version": __version__,
            "database": state,
            "database_detail": _public_detail(state, detail),
            "pending": pending,
            "rejected": rejected,
            "embedder": embedder,
            "scope": {"org_id": caller.org_id, "assignment_id": caller.assignment_id},
            "facts": facts,
        }

    def scopes(self, *, caller: Caller) -> dict[str, Any]:
        """The assignments the caller's token grants: `{"org_id", "default_assignment", "assignments"}`.

        :raises MemoryOffError: a kill switch (server, org or the caller's default assignment) is off, as
            for every tool. While the database is unreachable, a scope last seen off is refused the same
            way; any other is answered from the token the server verified (nothing is read or written).
        """
        try:
            self._lifecycle(caller)
        except DatabaseError as e:
            if classify(e) != "unreachable":
                raise
        return {"org_id": caller.org_id, "default_assignment": caller.assignment_id, "assignments": list(caller.grants)}

    def pending(self) -> int:
        """Facts waiting in the offline buffer (every scope)."""
        return self.offline.counts()[0]

    def customer_search(self, query: str, *, org_id: str, top_k: int = 10) -> list[Document]:
        """Customer-facing search over the same knowledge base; never returns a fact."""
        query = check_query(query)
        self.warm_up()
        result = _run(
            self._customer_search(), {"retriever": {"query": query, "top_k": top_k}, "acl": {"org_id": org_id}}
        )
        return list(result["acl"]["documents"])

    def _customer_search(self) -> Pipeline:
        """The customer-search pipeline, built on first use and shared by every later call and thread (its
        queries run on the knowledge base's pooled connections)."""
        with self._lock:
            if self.customer_search_pipeline is None:
                self.customer_search_pipeline = build_customer_search_pipeline(self.config, store=self.kb)
            return self.customer_search_pipeline


_shared: Memory | None = None
_shared_lock = threading.Lock()


def shared_memory(pipelines_dir: Path | None = None) -> Memory:
    """The process-wide `Memory` built from the environment (used by the Hayhooks wrappers), running the
    YAML pipelines of ``pipelines_dir`` when it holds them (`yaml_pipelines.PipelineDefinitions.find`)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            definitions = PipelineDefinitions.find(pipelines_dir) if pipelines_dir is not None else None
            _shared = Memory(definitions=definitions)
        return _shared
