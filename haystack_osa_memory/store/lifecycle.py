"""SQL of the governed lifecycle: read, feedback and trust, forget, list, review, kill switches, audit.

Every change and its audit row are written in one transaction. Every statement that touches a fact
is scoped by its governing row (org, source `agent_fact`, `metadata.assignment_id`), so a fact of
another scope behaves exactly like a fact that does not exist.
"""

from __future__ import annotations

import base64
import functools
import inspect
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.markers import strip_marker
from haystack_osa_memory.privacy.gate import redact_optional
from haystack_osa_memory.store.database import fact_scope, read, rendered, transaction
from haystack_osa_memory.store.facts import FACT_SOURCE, INHERIT_TERMS, INSERT_AUDIT, lexeme_stats, term_keys_of
from haystack_osa_memory.tools import (
    APPROVED,
    DOCUMENT_ID_LENGTH,
    FLAGGABLE_STATUSES,
    FLAGGED,
    HELD_STATUSES,
    PAGE_SIZE,
    REJECTED,
    REVIEWABLE_STATUSES,
)
from haystack_osa_memory.tools import LISTABLE_STATUSES as LISTABLE_STATUSES  # statuses: declared in tools.py
from haystack_osa_memory.tools import PROPOSED as PROPOSED

WILDCARD = "*"

_SCOPED = sql.SQL(
    """g.id = %(document_id)s AND g.org_id = %(org_id)s AND g.source = %(source)s
    AND g.metadata->>'assignment_id' = %(assignment_id)s AND g.status <> 'retired'"""
)

SELECT_FACT = sql.SQL(
    "SELECT g.id, g.status, g.title, g.metadata, g.specialist_id, g.created_at, g.updated_at, c.content "
    "FROM {schema}.{gov} g LEFT JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id "
    "WHERE {scoped}"
)
LOCK_FACT = sql.SQL("SELECT g.status FROM {schema}.{gov} g WHERE {scoped} FOR UPDATE")
RECORD_READ = sql.SQL(
    "INSERT INTO {mem}.reads (document_id, run_id) VALUES (%s, %s) ON CONFLICT (document_id, run_id) DO NOTHING"
)
COUNT_VOTES = sql.SQL(
    """SELECT count(*) FILTER (WHERE verdict = 'confirm'), count(*) FILTER (WHERE verdict = 'flag'),
    (SELECT count(*) FROM {mem}.reads r WHERE r.document_id = %(document_id)s)
    FROM {mem}.feedback WHERE document_id = %(document_id)s"""
)
# Upserts take the time from the proposed row (its column default, now()) rather than calling now()
# in DO UPDATE SET: the same value, and Citus accepts only immutable expressions there (docs/scaling.md).
UPSERT_VOTE = sql.SQL(
    """INSERT INTO {mem}.feedback (document_id, run_id, verdict, note) VALUES (%s, %s, %s, %s)
    ON CONFLICT (document_id, run_id) DO UPDATE SET verdict = EXCLUDED.verdict, note = EXCLUDED.note,
    updated_at = EXCLUDED.updated_at"""
)
# Statements on one fact by id name its org too: a knowledge base distributed by org (docs/scaling.md)
# routes them to the org's shard instead of every shard.
SET_STATUS = sql.SQL("UPDATE {schema}.{gov} SET status = %s, updated_at = now() WHERE id = %s AND org_id = %s")
# Forgotten means gone: the retired row keeps its id, scope, content hash (a column) and a tombstone, the
# status it had (a fact superseded while held counts as held), so that its text stored again comes back
# `proposed` when a person had not approved it (facts/UPSERT_GOVERNING_ROW). Its title, topic, paths,
# personas, links and validity go.
RETIRE = sql.SQL(
    """UPDATE {schema}.{gov} SET status = 'retired', updated_at = now(), title = NULL,
    metadata = jsonb_build_object(
        'assignment_id', metadata->>'assignment_id',
        'retired', jsonb_build_object(
            'reason', %(reason)s::text, 'by', %(actor)s::text, 'at', now(),
            'previous_status', CASE WHEN status = 'superseded' AND metadata->>'superseded_from' = ANY(%(held)s::text[])
                                    THEN metadata->>'superseded_from' ELSE status END))
    WHERE id = %(document_id)s AND org_id = %(org_id)s"""
)
# Observations of the scope that a forgotten fact is evidence of (their text or summary holds its words),
# locked: they are forgotten with it.
OBSERVATIONS_OF = sql.SQL(
    """SELECT g.id FROM {schema}.{gov} g
    WHERE g.org_id = %(org_id)s AND g.source = %(source)s AND g.metadata->>'assignment_id' = %(assignment_id)s
      AND g.status <> 'retired' AND g.metadata->'evidence' ? %(document_id)s
    ORDER BY g.id FOR UPDATE"""
)
# The raw facts an observation consolidated come back to recall when the observation is forgotten (reflect
# read them approved; the next reflect groups them again).
RELEASE_EVIDENCE = sql.SQL(
    """UPDATE {schema}.{gov} g SET status = 'approved', updated_at = now(), metadata = g.metadata - 'consolidated_into'
    WHERE g.org_id = %(org_id)s AND g.source = %(source)s AND g.metadata->>'assignment_id' = %(assignment_id)s
      AND g.status = 'consolidated' AND g.metadata->>'consolidated_into' = %(document_id)s
    RETURNING g.id"""
)
# Votes are counted anew after a person's decision (review accept): the votes that flagged it were weighed.
RESET_VOTES = sql.SQL(
    """WITH d AS (DELETE FROM {mem}.feedback WHERE document_id = %s RETURNING verdict)
    SELECT count(*) FILTER (WHERE verdict = 'confirm'), count(*) FILTER (WHERE verdict = 'flag') FROM d"""
)
# A fact's links in its chain (`supersedes`, `superseded_by`; facts/SUPERSEDE): the fact itself, the facts it
# superseded and its successor, locked, so that forgetting it can keep the chain whole.
LOCK_LINKED = sql.SQL(
    """SELECT g.id, g.status, g.metadata FROM {schema}.{gov} g
    WHERE g.org_id = %(org_id)s AND g.source = %(source)s AND g.metadata->>'assignment_id' = %(assignment_id)s
      AND g.status <> 'retired'
      AND (g.id = %(document_id)s OR g.metadata->>'superseded_by' = %(document_id)s
           OR g.id = (SELECT f.metadata->>'superseded_by' FROM {schema}.{gov} f
                      WHERE f.id = %(document_id)s AND f.org_id = %(org_id)s))
    ORDER BY g.id FOR UPDATE"""
)
SET_LINKS = sql.SQL(
    "UPDATE {schema}.{gov} SET status = %s, metadata = %s::jsonb, updated_at = now() WHERE id = %s AND org_id = %s"
)
# Versions of a chain, read step by step from a fact along its links (same scope, not retired).
CHAIN_ROWS = sql.SQL(
    """SELECT g.id, g.status, g.metadata, g.created_at, c.content
    FROM {schema}.{gov} g LEFT JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
    WHERE g.id = ANY(%(ids)s) AND g.org_id = %(org_id)s AND g.source = %(source)s
      AND g.metadata->>'assignment_id' = %(assignment_id)s AND g.status <> 'retired'"""
)
FIND_FACT = sql.SQL(
    "SELECT org_id, metadata->>'assignment_id' FROM {schema}.{gov} "
    "WHERE id = %s AND source = %s AND status <> 'retired'"
)
DELETE_CHUNKS = sql.SQL("DELETE FROM {schema}.{chunk} WHERE meta->>'document_id' = %s")
DELETE_VOTES = sql.SQL("DELETE FROM {mem}.feedback WHERE document_id = %s")
DELETE_READS = sql.SQL("DELETE FROM {mem}.reads WHERE document_id = %s")
DELETE_TERMS = sql.SQL("DELETE FROM {schema}.osa_fact_terms WHERE document_id = %s AND org_id = %s")
LIST_FACTS = sql.SQL(
    """SELECT g.id, g.status, g.title, g.metadata, g.created_at, g.updated_at, c.content
    FROM {schema}.{gov} g LEFT JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
    WHERE g.org_id = %(org_id)s AND g.source = %(source)s AND g.metadata->>'assignment_id' = %(assignment_id)s
      AND g.status = ANY(%(statuses)s)
      AND (%(topic)s::text IS NULL OR g.metadata->>'topic' = %(topic)s::text)
      AND (g.created_at, g.id) > (%(after_at)s::timestamptz, %(after_id)s::text)
    ORDER BY g.created_at, g.id LIMIT %(limit)s"""
)
SCOPE_CONTENTS = sql.SQL(
    """SELECT g.id, c.content FROM {schema}.{gov} g JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
    WHERE g.org_id = %s AND g.source = %s AND g.metadata->>'assignment_id' = %s AND g.status <> 'retired'"""
)
REVIEW_LIST = sql.SQL(
    """SELECT g.id, g.org_id, g.metadata->>'assignment_id', g.status, g.title, g.metadata->>'kind', c.content,
    g.updated_at FROM {schema}.{gov} g LEFT JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
    WHERE g.source = %(source)s AND g.status IN ('proposed', 'flagged')
      AND (%(org_id)s::text IS NULL OR g.org_id = %(org_id)s::text)
      AND (%(assignment_id)s::text IS NULL OR g.metadata->>'assignment_id' = %(assignment_id)s::text)
    ORDER BY g.updated_at"""
)
# A reviewer names a fact by id alone: its org is looked up first (no lock), then the row is locked
# by id and org, which a distributed knowledge base can route to one shard (it refuses a FOR UPDATE
# that spans shards).
FIND_FOR_REVIEW = sql.SQL("SELECT org_id FROM {schema}.{gov} WHERE id = %s AND source = %s")
LOCK_FOR_REVIEW = sql.SQL(
    """SELECT org_id, metadata->>'assignment_id', status FROM {schema}.{gov}
    WHERE id = %s AND org_id = %s AND source = %s FOR UPDATE"""
)
SWITCH_OFF = sql.SQL(
    """INSERT INTO {mem}.switches (org_id, assignment_id, enabled, reason) VALUES (%s, %s, false, %s)
    ON CONFLICT (org_id, assignment_id) DO UPDATE SET enabled = false, reason = EXCLUDED.reason,
    updated_at = EXCLUDED.updated_at"""
)
SWITCH_ON = sql.SQL("DELETE FROM {mem}.switches WHERE org_id = %s AND assignment_id = %s")
# Whether a kill switch has turned the scope ({org}, {assignment}) off: a switch naming it, its org (assignment
# '*') or every org ('*'). `IS_OFF` asks it of one scope; an agent's token check asks it of its token's scope in
# the same statement (`tokens.SELECT_TOKEN_AND_SWITCH`), so a served call needs no round trip for it.
SWITCHED_OFF = sql.SQL(
    """EXISTS (SELECT 1 FROM {mem}.switches s WHERE NOT s.enabled
    AND (s.org_id = {org} OR s.org_id = '*') AND (s.assignment_id = {assignment} OR s.assignment_id = '*'))"""
)
IS_OFF = sql.SQL("SELECT {switched_off}")
LIST_SWITCHES = sql.SQL("SELECT org_id, assignment_id, reason, updated_at FROM {mem}.switches ORDER BY 1, 2")
AUDIT_ROWS = sql.SQL(
    """SELECT id, at, actor, action, org_id, assignment_id, document_id, details FROM {mem}.audit
    WHERE (%(org_id)s::text IS NULL OR org_id = %(org_id)s::text)
      AND (%(assignment_id)s::text IS NULL OR assignment_id = %(assignment_id)s::text)
    ORDER BY id LIMIT %(limit)s"""
)

COUNT_SCOPE = sql.SQL(
    """SELECT count(*) FROM {schema}.{gov} g WHERE g.org_id = %(org_id)s AND g.source = %(source)s
    AND g.metadata->>'assignment_id' = %(assignment_id)s AND g.status = 'approved'"""
)


def count_scope_statement(config: MemoryConfig) -> sql.Composed:
    """The count of approved facts in one scope (used by the status probe)."""
    return COUNT_SCOPE.format(**config.sql_names())


REFLECT_CANDIDATES = sql.SQL(
    """SELECT g.id, c.content, c.embedding::text, g.metadata, g.created_at
    FROM {schema}.{gov} g JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
    WHERE g.org_id = %s AND g.source = %s AND g.metadata->>'assignment_id' = %s AND g.status = 'approved'
    ORDER BY g.created_at, g.id"""
)
MARK_CONSOLIDATED = sql.SQL(
    """UPDATE {schema}.{gov} SET status = 'consolidated', updated_at = now(),
    metadata = metadata || jsonb_build_object('consolidated_into', %s::text)
    WHERE id = %s AND org_id = %s AND status = 'approved'"""
)
# The observation's evidence and what it holds for (`reflect.validity_of`: valid_from, and valid_to and
# expires_at only when set: an open period or no expiry removes the key).
SET_EVIDENCE = sql.SQL(
    """UPDATE {schema}.{gov} SET updated_at = now(),
    metadata = (metadata - 'valid_to' - 'expires_at')
               || jsonb_build_object('evidence', %(evidence)s::jsonb, 'count', %(count)s::int)
               || jsonb_strip_nulls(%(validity)s::jsonb)
    WHERE id = %(observation)s AND org_id = %(org_id)s"""
)
# An observation answers questions worded like any of its evidence: its recall row's lexemes are its own
# text's and, counted once each (`strip`: no positions), its live evidence's (as a successor's take its
# predecessors', facts.INHERIT_TERMS), so that words its members share do not rank it above what they
# ranked. Its vector, its length and the text recall returns stay its own.
OBSERVATION_TERMS = sql.SQL(
    """UPDATE {schema}.osa_fact_terms t SET terms = ls.terms, term_keys = {term_keys}
    FROM (SELECT to_tsvector(%(language)s::regconfig,
                             regexp_replace(c.content, '^<!-- osa-memory:scope [^\n]* -->\n', ''))
                 || strip(to_tsvector(%(language)s::regconfig, coalesce((
                     SELECT string_agg(regexp_replace(p.content, '^<!-- osa-memory:scope [^\n]* -->\n', ''),
                                       E'\n' ORDER BY p.id)
                     FROM {schema}.{chunk} p JOIN {schema}.{gov} e ON e.id = p.id
                     WHERE e.org_id = %(org_id)s AND e.source = %(source)s
                       AND e.metadata->>'assignment_id' = %(assignment_id)s AND e.status <> 'retired'
                       AND e.id IN (SELECT jsonb_array_elements_text(o.metadata->'evidence')
                                    FROM {schema}.{gov} o
                                    WHERE o.id = %(observation)s AND o.org_id = %(org_id)s)), ''))) AS tsv
          FROM {schema}.{chunk} c WHERE c.id = %(observation)s
          OFFSET 0) x,  -- tokenised once (see facts.SCOPE_ROWS)
         LATERAL ({lexeme_stats}) ls
    WHERE t.document_id = %(observation)s AND t.org_id = %(org_id)s"""
)
# An observation takes the place of its earliest evidence in the scope's storing order (`seq`, on its
# governing and recall rows), so that recall's context window sees it among the facts stored around its
# evidence, as it saw the evidence, rather than after the scope's latest facts.
PLACE_OBSERVATION = sql.SQL(
    """WITH p AS (
    SELECT min(e.seq) AS seq FROM {schema}.{gov} e
    WHERE e.org_id = %(org_id)s AND e.source = %(source)s AND e.metadata->>'assignment_id' = %(assignment_id)s
      AND e.id IN (SELECT jsonb_array_elements_text(o.metadata->'evidence') FROM {schema}.{gov} o
                   WHERE o.id = %(observation)s AND o.org_id = %(org_id)s)
),
g AS (
    UPDATE {schema}.{gov} SET seq = p.seq FROM p
    WHERE id = %(observation)s AND org_id = %(org_id)s AND p.seq IS NOT NULL
    RETURNING {schema}.{gov}.seq
)
UPDATE {schema}.osa_fact_terms t SET seq = g.seq FROM g
WHERE t.document_id = %(observation)s AND t.org_id = %(org_id)s"""
)
# Every live observation with evidence, for `reflect.repair_observations` (an operator's pass over all scopes).
REPAIR_OBSERVATIONS = sql.SQL(
    """SELECT g.id, g.org_id, g.metadata->>'assignment_id', g.status, g.metadata, g.created_at, c.content
    FROM {schema}.{gov} g LEFT JOIN {schema}.{chunk} c ON c.id = g.id
    WHERE g.source = %(source)s AND g.metadata->>'kind' = 'observation' AND g.metadata ? 'evidence'
      AND g.status <> 'retired'
    ORDER BY g.org_id, g.metadata->>'assignment_id', g.id"""
)
EVIDENCE_ROWS = sql.SQL(
    """SELECT g.id, g.status, g.metadata, g.created_at, c.content
    FROM {schema}.{gov} g LEFT JOIN {schema}.{chunk} c ON c.id = g.id
    WHERE g.id = ANY(%(ids)s) AND g.org_id = %(org_id)s AND g.source = %(source)s
      AND g.metadata->>'assignment_id' = %(assignment_id)s"""
)
# A fact an observation should never have absorbed is recalled again as it was before (only `approved`
# facts are consolidated).
RESTORE_EVIDENCE = sql.SQL(
    """UPDATE {schema}.{gov} SET status = 'approved', updated_at = now(), metadata = metadata - 'consolidated_into'
    WHERE id = %s AND org_id = %s AND status = 'consolidated' AND metadata->>'consolidated_into' = %s"""
)
REFLECT_SCOPES = sql.SQL(
    """SELECT DISTINCT org_id, metadata->>'assignment_id' FROM {schema}.{gov}
    WHERE source = %s AND status = 'approved' ORDER BY 1, 2"""
)

LIVE_IDS = sql.SQL(
    """SELECT id FROM {schema}.{gov} WHERE id = ANY(%(ids)s) AND status <> 'retired'
      AND (%(org_id)s::text IS NULL OR org_id = %(org_id)s::text)"""
)
EXPORT_ROWS = sql.SQL(
    """SELECT g.id, g.status, g.metadata, g.created_at, c.content
    FROM {schema}.{gov} g JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
    WHERE g.org_id = %s AND g.source = %s AND g.metadata->>'assignment_id' = %s
      AND g.status IN ('approved', 'proposed', 'flagged', 'rejected', 'superseded')
    ORDER BY g.created_at, g.id"""
)

_STATEMENTS: dict[str, sql.SQL] = {
    "LIVE_IDS": LIVE_IDS,
    "EXPORT_ROWS": EXPORT_ROWS,
    "REFLECT_CANDIDATES": REFLECT_CANDIDATES,
    "MARK_CONSOLIDATED": MARK_CONSOLIDATED,
    "SET_EVIDENCE": SET_EVIDENCE,
    "REPAIR_OBSERVATIONS": REPAIR_OBSERVATIONS,
    "EVIDENCE_ROWS": EVIDENCE_ROWS,
    "RESTORE_EVIDENCE": RESTORE_EVIDENCE,
    "PLACE_OBSERVATION": PLACE_OBSERVATION,
    "REFLECT_SCOPES": REFLECT_SCOPES,
    "COUNT_SCOPE": COUNT_SCOPE,
    "SELECT_FACT": SELECT_FACT,
    "LOCK_FACT": LOCK_FACT,
    "RECORD_READ": RECORD_READ,
    "COUNT_VOTES": COUNT_VOTES,
    "UPSERT_VOTE": UPSERT_VOTE,
    "SET_STATUS": SET_STATUS,
    "RETIRE": RETIRE,
    "OBSERVATIONS_OF": OBSERVATIONS_OF,
    "RELEASE_EVIDENCE": RELEASE_EVIDENCE,
    "RESET_VOTES": RESET_VOTES,
    "DELETE_CHUNKS": DELETE_CHUNKS,
    "LOCK_LINKED": LOCK_LINKED,
    "SET_LINKS": SET_LINKS,
    "CHAIN_ROWS": CHAIN_ROWS,
    "FIND_FACT": FIND_FACT,
    "DELETE_VOTES": DELETE_VOTES,
    "DELETE_READS": DELETE_READS,
    "DELETE_TERMS": DELETE_TERMS,
    "LIST_FACTS": LIST_FACTS,
    "SCOPE_CONTENTS": SCOPE_CONTENTS,
    "REVIEW_LIST": REVIEW_LIST,
    "FIND_FOR_REVIEW": FIND_FOR_REVIEW,
    "LOCK_FOR_REVIEW": LOCK_FOR_REVIEW,
    "SWITCH_OFF": SWITCH_OFF,
    "SWITCH_ON": SWITCH_ON,
    "LIST_SWITCHES": LIST_SWITCHES,
    "AUDIT_ROWS": AUDIT_ROWS,
    "INSERT_AUDIT": INSERT_AUDIT,
}

_EPOCH = "1970-01-01T00:00:00+00:00"


def valid_from_text(metadata: dict[str, Any], created_at: datetime) -> str:
    """When a fact holds from (ISO 8601): its ``valid_from``, else (stored before validity times) its creation."""
    return str(metadata.get("valid_from") or created_at.isoformat())


def trust_of(confirms: int, flags: int) -> float:
    """Trust = (confirms + 1) / (confirms + flags + 2): 0.5 with no votes."""
    return (confirms + 1) / (confirms + flags + 2)


def encode_cursor(created_at: datetime, document_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), document_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


_INVALID_CURSOR = "cursor is not valid: pass the next_cursor value of a previous kb_memory_list answer"
_HEX = frozenset("0123456789abcdef")


def decode_cursor(cursor: str) -> tuple[str, str]:
    """The ``(created_at, document_id)`` a cursor of :func:`encode_cursor` holds, checked so that a forged
    cursor is refused here and never reaches the database: the time is re-serialised in UTC (PostgreSQL
    reads every form Python writes), the id is a fact id (64 hexadecimal characters).

    :raises InvalidInputError: the cursor is not one this server wrote.
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        decoded = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        if not isinstance(decoded, list) or len(decoded) != 2:
            raise TypeError(decoded)
        at, doc_id = decoded
        if not isinstance(at, str) or not isinstance(doc_id, str):
            raise TypeError(decoded)
        moment = datetime.fromisoformat(at)
        if moment.tzinfo is None:
            raise TypeError(at)
        at = moment.astimezone(UTC).isoformat()
        if len(doc_id) != DOCUMENT_ID_LENGTH or not _HEX.issuperset(doc_id):
            raise TypeError(doc_id)
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        raise InvalidInputError(_INVALID_CURSOR) from e
    return at, doc_id


@dataclass(frozen=True)
class Scope:
    org_id: str
    assignment_id: str


_M = TypeVar("_M", bound=Callable[..., Any])


def _scoped(method: _M) -> _M:
    """Run a repository method whose first argument is a `Scope` with the database sessions set to that
    scope (`haystack_osa_memory.store.database.fact_scope`: row-level security, when on, shows its facts only)."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(self: Any, scope: Scope, *args: Any, **kwargs: Any) -> Iterator[Any]:
            with fact_scope(scope.org_id, scope.assignment_id):
                yield from method(self, scope, *args, **kwargs)

        return cast(_M, generator)

    @functools.wraps(method)
    def wrapper(self: Any, scope: Scope, *args: Any, **kwargs: Any) -> Any:
        with fact_scope(scope.org_id, scope.assignment_id):
            return method(self, scope, *args, **kwargs)

    return cast(_M, wrapper)


class LifecycleRepository:
    """All lifecycle SQL for one configuration."""

    def __init__(self, conn_str: str, config: MemoryConfig) -> None:
        self.conn_str = conn_str
        self.config = config
        names = {**config.sql_names(), "scoped": _SCOPED}
        # Rendered once (`database.rendered`): the kill-switch check runs on every call.
        self._q = {name: rendered(statement.format(**names)) for name, statement in _STATEMENTS.items()}
        scope = {"org": sql.Placeholder("org_id"), "assignment": sql.Placeholder("assignment_id")}
        self._q["IS_OFF"] = rendered(IS_OFF.format(switched_off=SWITCHED_OFF.format(mem=names["mem"], **scope)))
        self._q["INHERIT_TERMS"] = rendered(
            INHERIT_TERMS.format(
                **config.sql_names(),
                lexeme_stats=lexeme_stats(sql.SQL("x.tsv")),
                term_keys=term_keys_of(sql.SQL("ls.terms"), sql.SQL("%(org_id)s"), sql.SQL("%(assignment_id)s")),
            )
        )

    # -- helpers ---------------------------------------------------------------------------------
    def _params(self, scope: Scope, document_id: str) -> dict[str, Any]:
        return {
            "document_id": document_id,
            "org_id": scope.org_id,
            "assignment_id": scope.assignment_id,
            "source": FACT_SOURCE,
        }

    def _audit(
        self,
        conn: psycopg.Connection[Any],
        *,
        actor: str,
        action: str,
        org_id: str | None,
        assignment_id: str | None,
        document_id: str | None,
        details: dict[str, Any],
    ) -> None:
        conn.execute(
            self._q["INSERT_AUDIT"],
            {
                "actor": actor,
                "action": action,
                "org_id": org_id,
                "assignment_id": assignment_id,
                "document_id": document_id,
                "details": json.dumps(details, default=str),
            },
        )

    def _redact(self, text: str | None) -> str | None:
        """A free-text field (reason, note) redacted like facts before it is kept anywhere: the audit,
        a governing row's metadata, the feedback and switches tables are read by people and tools that
        never see the unredacted fact."""
        return redact_optional(text, self.config.redaction_off)

    def _votes(self, conn: psycopg.Connection[Any], document_id: str) -> tuple[int, int, int]:
        row = conn.execute(self._q["COUNT_VOTES"], {"document_id": document_id}).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    # -- read ------------------------------------------------------------------------------------
    @_scoped
    def read(self, scope: Scope, document_id: str, run_id: str) -> dict[str, Any] | None:
        """The fact with provenance, recording one read per (run, fact); ``None`` when not in scope."""
        with transaction(self.conn_str, self.config) as conn:
            row = conn.execute(self._q["SELECT_FACT"], self._params(scope, document_id)).fetchone()
            if row is None:
                return None
            conn.execute(self._q["RECORD_READ"], (document_id, run_id))
            confirms, flags, reads = self._votes(conn, document_id)
        doc_id, status, title, metadata, specialist_id, created_at, updated_at, content = row
        return {
            "document_id": doc_id,
            "content": strip_marker(content) if content is not None else None,
            "kind": metadata.get("kind", "fact"),
            "topic": metadata.get("topic"),
            "title": title,
            "paths": metadata.get("paths", []),
            "personas": metadata.get("personas", []),
            "stored_by": {"token_id": metadata.get("stored_by"), "specialist_id": specialist_id},
            "stored_at": updated_at.isoformat(),
            "created_at": created_at.isoformat(),
            "expires_at": metadata.get("expires_at"),
            "status": status,
            "trust": round(trust_of(confirms, flags), 6),
            "confirms": confirms,
            "flags": flags,
            "reads": reads,
            "valid_from": valid_from_text(metadata, created_at),
            **{key: metadata[key] for key in ("valid_to", "superseded_by", "supersedes") if metadata.get(key)},
            **({"evidence": metadata["evidence"], "count": metadata.get("count")} if "evidence" in metadata else {}),
        }

    # -- feedback --------------------------------------------------------------------------------
    @_scoped
    def feedback(
        self,
        scope: Scope,
        document_id: str,
        *,
        run_id: str,
        verdict: str,
        note: str | None,
        floor: float,
        actor: str,
    ) -> dict[str, Any] | None:
        """Record (or replace) this run's vote; recompute trust and the flagged status."""
        note = self._redact(note)
        with transaction(self.conn_str, self.config) as conn:
            row = conn.execute(self._q["LOCK_FACT"], self._params(scope, document_id)).fetchone()
            if row is None:
                return None
            status = str(row[0])
            conn.execute(self._q["UPSERT_VOTE"], (document_id, run_id, verdict, note))
            confirms, flags, _ = self._votes(conn, document_id)
            trust = trust_of(confirms, flags)
            new_status = status
            # Flags may take a fact out of recall; only a person's review brings it back (confirmations
            # never lift a flag).
            if status in FLAGGABLE_STATUSES and trust < floor:
                new_status = FLAGGED
            if new_status != status:
                conn.execute(self._q["SET_STATUS"], (new_status, document_id, scope.org_id))
            self._audit(
                conn,
                actor=actor,
                action="feedback",
                org_id=scope.org_id,
                assignment_id=scope.assignment_id,
                document_id=document_id,
                details={"verdict": verdict, "trust": trust, "status": new_status, "note": note},
            )
        return {
            "document_id": document_id,
            "trust": round(trust, 6),
            "status": new_status,
            "confirms": confirms,
            "flags": flags,
        }

    # -- forget ----------------------------------------------------------------------------------
    @_scoped
    def forget(self, scope: Scope, document_id: str, *, reason: str, actor: str) -> bool:
        """Retire the governing row down to its tombstone (reason kept, redacted), delete its chunk, recall
        row, votes and reads; its successor's recall row loses its words, and the observations it is
        evidence of are forgotten with it (their raw facts come back to recall)."""
        reason = self._redact(reason) or ""
        with transaction(self.conn_str, self.config) as conn:
            row = conn.execute(self._q["LOCK_FACT"], self._params(scope, document_id)).fetchone()
            if row is None:
                return False
            details: dict[str, Any] = {"reason": reason, "previous_status": row[0]}
            details.update(self._retire(conn, scope, document_id, reason=reason, actor=actor))
            observations = [
                r[0] for r in conn.execute(self._q["OBSERVATIONS_OF"], self._params(scope, document_id)).fetchall()
            ]
            for observation in observations:
                self._retire(conn, scope, observation, reason=reason, actor=actor)
            if observations:
                details["observations_forgotten"] = observations
            self._audit(
                conn,
                actor=actor,
                action="forget",
                org_id=scope.org_id,
                assignment_id=scope.assignment_id,
                document_id=document_id,
                details=details,
            )
        return True

    def _retire(
        self, conn: psycopg.Connection[Any], scope: Scope, document_id: str, *, reason: str, actor: str
    ) -> dict[str, Any]:
        """One fact forgotten (in the caller's transaction): unlinked from its chain, reduced to its
        tombstone, everything computed from its words deleted. Returns what changed, for the audit."""
        params = self._params(scope, document_id)
        changes = self._unlink(conn, scope, document_id)
        retire = {**params, "reason": reason, "actor": actor, "held": list(HELD_STATUSES)}
        conn.execute(self._q["RETIRE"], retire)
        conn.execute(self._q["DELETE_CHUNKS"], (document_id,))
        conn.execute(self._q["DELETE_VOTES"], (document_id,))
        conn.execute(self._q["DELETE_READS"], (document_id,))
        conn.execute(self._q["DELETE_TERMS"], (document_id, scope.org_id))
        if changes.get("to"):
            # The successor's recall row held the forgotten fact's lexemes (facts/INHERIT_TERMS): recomputed
            # from its own text and the predecessors it still lists.
            inherit = {**params, "successor": changes["to"], "language": self.config.language}
            conn.execute(self._q["INHERIT_TERMS"], inherit)
        released = [r[0] for r in conn.execute(self._q["RELEASE_EVIDENCE"], params).fetchall()]
        if released:
            changes["released"] = released
        return changes

    def _unlink(self, conn: psycopg.Connection[Any], scope: Scope, document_id: str) -> dict[str, Any]:
        """Take a fact about to be forgotten out of its chain. The facts it superseded link to its successor
        instead (holding until the successor's valid_from); without a successor, they hold again (a
        retraction says the newer value was never true). Returns what changed, for the audit."""
        params = self._params(scope, document_id)
        rows = {r[0]: (r[1], dict(r[2])) for r in conn.execute(self._q["LOCK_LINKED"], params).fetchall()}
        successor = rows.get(document_id, ("", {}))[1].get("superseded_by")
        predecessors = sorted(i for i, (_, m) in rows.items() if m.get("superseded_by") == document_id)
        if not predecessors and not successor:
            return {}
        changes: list[tuple[str, str, dict[str, Any]]] = []
        if successor and successor in rows:
            status, meta = rows[successor]
            kept = [i for i in meta.get("supersedes", []) if i != document_id]
            meta["supersedes"] = list(dict.fromkeys([*kept, *predecessors]))
            if not meta["supersedes"]:
                del meta["supersedes"]
            changes.append((successor, status, meta))
            until = rows[document_id][1].get("valid_to")
            for pred in predecessors:
                status, meta = rows[pred]
                meta["superseded_by"] = successor
                if until:
                    meta["valid_to"] = until
                changes.append((pred, status, meta))
            summary: dict[str, Any] = {"relinked": predecessors, "to": successor}
        else:
            for pred in predecessors:
                _, meta = rows[pred]
                status = str(meta.pop("superseded_from", APPROVED))
                for key in ("superseded_by", "valid_to"):
                    meta.pop(key, None)
                changes.append((pred, status, meta))
            summary = {"restored": predecessors}
        for doc_id, status, meta in changes:
            conn.execute(self._q["SET_LINKS"], (status, json.dumps(meta), doc_id, scope.org_id))
        return summary

    @_scoped
    def chain(self, scope: Scope, document_id: str, *, limit: int = 200) -> list[dict[str, Any]]:
        """Every version linked to the fact by supersession (itself included), oldest validity first;
        empty when the fact is not in the scope."""
        found: dict[str, dict[str, Any]] = {}
        frontier = {document_id}
        with transaction(self.conn_str, self.config) as conn:
            while frontier and len(found) < limit:
                params = {**self._params(scope, document_id), "ids": sorted(frontier)}
                rows = conn.execute(self._q["CHAIN_ROWS"], params).fetchall()
                frontier = set()
                for doc_id, status, meta, created_at, content in rows:
                    found[doc_id] = {
                        "document_id": doc_id,
                        "status": status,
                        "valid_from": valid_from_text(meta, created_at),
                        "valid_to": meta.get("valid_to"),
                        "content": strip_marker(content) if content is not None else None,
                        "supersedes": list(meta.get("supersedes", [])),
                        "superseded_by": meta.get("superseded_by"),
                    }
                    frontier.update(meta.get("supersedes", []))
                    if meta.get("superseded_by"):
                        frontier.add(meta["superseded_by"])
                frontier -= set(found)
        return sorted(found.values(), key=lambda v: (datetime.fromisoformat(v["valid_from"]), v["document_id"]))

    def find_scope(self, document_id: str) -> Scope | None:
        """The scope of a live fact, for operators naming it by id alone (`osa-memory history`)."""
        with transaction(self.conn_str, self.config) as conn:
            row = conn.execute(self._q["FIND_FACT"], (document_id, FACT_SOURCE)).fetchone()
        return Scope(row[0], row[1]) if row is not None and row[1] else None

    # -- list ------------------------------------------------------------------------------------
    @_scoped
    def list_facts(self, scope: Scope, *, status: str | None, topic: str | None, cursor: str | None) -> dict[str, Any]:
        after_at, after_id = decode_cursor(cursor) if cursor else (_EPOCH, "")
        statuses = [status] if status else list(LISTABLE_STATUSES)
        params = {
            "org_id": scope.org_id,
            "assignment_id": scope.assignment_id,
            "source": FACT_SOURCE,
            "statuses": statuses,
            "topic": topic,
            "after_at": after_at,
            "after_id": after_id,
            "limit": PAGE_SIZE + 1,
        }
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._q["LIST_FACTS"], params).fetchall()
        page, more = rows[:PAGE_SIZE], len(rows) > PAGE_SIZE
        facts = [
            {
                "document_id": r[0],
                "status": r[1],
                "title": r[2],
                "kind": r[3].get("kind", "fact"),
                "topic": r[3].get("topic"),
                "content": strip_marker(r[6]) if r[6] is not None else None,
                "created_at": r[4].isoformat(),
                "stored_at": r[5].isoformat(),
            }
            for r in page
        ]
        next_cursor = encode_cursor(page[-1][4], page[-1][0]) if more and page else None
        return {"assignment_id": scope.assignment_id, "facts": facts, "next_cursor": next_cursor}

    @_scoped
    def scope_contents(self, scope: Scope) -> dict[str, str]:
        """document id -> stored text (marker stripped) of every live fact of the scope."""
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._q["SCOPE_CONTENTS"], (scope.org_id, FACT_SOURCE, scope.assignment_id)).fetchall()
        return {r[0]: strip_marker(r[1] or "") for r in rows}

    @_scoped
    def count_scope(self, scope: Scope) -> int:
        """Approved facts in the scope."""
        params = {"org_id": scope.org_id, "assignment_id": scope.assignment_id, "source": FACT_SOURCE}
        with transaction(self.conn_str, self.config) as conn:
            row = conn.execute(self._q["COUNT_SCOPE"], params).fetchone()
        return int(row[0]) if row else 0

    # -- reflect ---------------------------------------------------------------------------------
    @_scoped
    def reflect_candidates(self, scope: Scope) -> list[dict[str, Any]]:
        """Approved facts of the scope with text (marker stripped), embedding, metadata and age."""
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(
                self._q["REFLECT_CANDIDATES"], (scope.org_id, FACT_SOURCE, scope.assignment_id)
            ).fetchall()
        return [
            {
                "document_id": r[0],
                "content": strip_marker(r[1] or ""),
                "embedding": json.loads(r[2]) if r[2] else None,
                "metadata": r[3],
                "created_at": r[4],
            }
            for r in rows
        ]

    @_scoped
    def consolidate(
        self,
        scope: Scope,
        observation_id: str,
        evidence: list[str],
        merged: list[str],
        *,
        actor: str,
        validity: dict[str, str | None] | None = None,
    ) -> int:
        """Link ``evidence`` to the observation, set what it holds for (``validity``: `reflect.validity_of`),
        let its recall row answer its evidence's words, and take the ``merged`` raw facts out of recall;
        one transaction."""
        with transaction(self.conn_str, self.config) as conn:
            self._set_evidence(conn, scope, observation_id, evidence, validity)
            retired = 0
            for doc_id in merged:
                retired += conn.execute(self._q["MARK_CONSOLIDATED"], (observation_id, doc_id, scope.org_id)).rowcount
            self._audit(
                conn,
                actor=actor,
                action="reflect",
                org_id=scope.org_id,
                assignment_id=scope.assignment_id,
                document_id=observation_id,
                details={"evidence": evidence, "merged": merged, **({"validity": validity} if validity else {})},
            )
        return retired

    def _set_evidence(
        self,
        conn: psycopg.Connection[Any],
        scope: Scope,
        observation_id: str,
        evidence: list[str],
        validity: dict[str, str | None] | None,
    ) -> None:
        params = {**self._params(scope, observation_id), "observation": observation_id}
        linked = {"evidence": json.dumps(evidence), "count": len(evidence), "validity": json.dumps(validity or {})}
        conn.execute(self._q["SET_EVIDENCE"], {**params, **linked})
        conn.execute(self._q["PLACE_OBSERVATION"], params)
        terms = OBSERVATION_TERMS.format(
            **self.config.sql_names(),
            lexeme_stats=lexeme_stats(sql.SQL("x.tsv")),
            term_keys=term_keys_of(sql.SQL("ls.terms"), sql.SQL("%(org_id)s"), sql.SQL("%(assignment_id)s")),
        )
        conn.execute(terms, {**params, "language": self.config.language})

    def observations(self) -> list[dict[str, Any]]:
        """Every live observation with evidence, of every scope (for an operator's repair)."""
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._q["REPAIR_OBSERVATIONS"], {"source": FACT_SOURCE}).fetchall()
        keys = ("document_id", "org_id", "assignment_id", "status", "metadata", "created_at", "content")
        out = [dict(zip(keys, r, strict=True)) for r in rows]
        for item in out:
            item["content"] = strip_marker(item["content"] or "")
        return [o for o in out if o["assignment_id"]]

    @_scoped
    def evidence_rows(self, scope: Scope, document_ids: list[str]) -> list[dict[str, Any]]:
        """The facts of the scope with these ids, any status, with text (marker stripped), metadata and age."""
        params = {**self._params(scope, ""), "ids": document_ids}
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._q["EVIDENCE_ROWS"], params).fetchall()
        keys = ("document_id", "status", "metadata", "created_at", "content")
        out = [dict(zip(keys, r, strict=True)) for r in rows]
        for item in out:
            item["content"] = strip_marker(item["content"] or "")
        return out

    @_scoped
    def repair_observation(
        self,
        scope: Scope,
        observation_id: str,
        *,
        evidence: list[str],
        restore: list[str],
        validity: dict[str, str | None] | None,
        actor: str,
    ) -> int:
        """Put the ``restore`` facts back in recall (`approved`) and keep ``evidence`` with ``validity`` on the
        observation, or, when ``evidence`` is empty, retire the observation (its other facts come back too);
        one transaction with a `repair` audit row. Returns the facts put back."""
        with transaction(self.conn_str, self.config) as conn:
            row = conn.execute(self._q["LOCK_FACT"], self._params(scope, observation_id)).fetchone()
            if row is None:
                return 0
            restored = [
                doc_id
                for doc_id in restore
                if conn.execute(self._q["RESTORE_EVIDENCE"], (doc_id, scope.org_id, observation_id)).rowcount
            ]
            details: dict[str, Any] = {"restored": restored, "evidence": evidence, "validity": validity}
            if evidence:
                self._set_evidence(conn, scope, observation_id, evidence, validity)
            else:
                reason = "repair: its evidence did not all say the same thing"
                released = self._retire(conn, scope, observation_id, reason=reason, actor=actor).get("released", [])
                restored.extend(released)
                details.update(restored=restored, retired=True)
            self._audit(
                conn,
                actor=actor,
                action="repair",
                org_id=scope.org_id,
                assignment_id=scope.assignment_id,
                document_id=observation_id,
                details=details,
            )
        return len(restored)

    def reflect_scopes(self) -> list[Scope]:
        """Every scope that has approved facts."""
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._q["REFLECT_SCOPES"], (FACT_SOURCE,)).fetchall()
        return [Scope(r[0], r[1]) for r in rows if r[1]]

    # -- import / export --------------------------------------------------------------------------
    def live_ids(self, document_ids: list[str], org_id: str | None = None) -> set[str]:
        """Which of these ids already exist (and are not retired); only in ``org_id`` when given (ids
        derive from the org, so the answer is the same, but a distributed knowledge base then reads
        one shard instead of all)."""
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._q["LIVE_IDS"], {"ids": document_ids, "org_id": org_id}).fetchall()
        return {r[0] for r in rows}

    @_scoped
    def export_rows(self, scope: Scope) -> Iterator[dict[str, Any]]:
        """Every live fact of the scope, oldest first, as `transfer.export_line` expects."""
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._q["EXPORT_ROWS"], (scope.org_id, FACT_SOURCE, scope.assignment_id)).fetchall()
        for doc_id, status, metadata, created_at, content in rows:
            yield {
                "fact": strip_marker(content or ""),
                "topic": metadata.get("topic"),
                "kind": metadata.get("kind", "fact"),
                "status": status,
                "expires_at": metadata.get("expires_at"),
                "document_id": doc_id,
                "created_at": created_at.isoformat(),
                "valid_from": valid_from_text(metadata, created_at),
                "valid_to": metadata.get("valid_to"),
                "supersedes": list(metadata.get("supersedes", [])),
            }

    # -- review ----------------------------------------------------------------------------------
    def review_list(self, org_id: str | None = None, assignment_id: str | None = None) -> list[dict[str, Any]]:
        params = {"source": FACT_SOURCE, "org_id": org_id, "assignment_id": assignment_id}
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._q["REVIEW_LIST"], params).fetchall()
        keys = ("document_id", "org_id", "assignment_id", "status", "title", "kind", "content", "updated_at")
        out = [dict(zip(keys, r, strict=True)) for r in rows]
        for item in out:
            item["content"] = strip_marker(item["content"] or "")
        return out

    def review(self, document_id: str, *, accept: bool, actor: str, note: str | None) -> dict[str, Any]:
        """Accept (-> approved) or reject (-> rejected) a proposed or flagged fact; the note is redacted."""
        note = self._redact(note)
        with transaction(self.conn_str, self.config) as conn:
            found = conn.execute(self._q["FIND_FOR_REVIEW"], (document_id, FACT_SOURCE)).fetchone()
            row = None
            if found is not None:
                row = conn.execute(self._q["LOCK_FOR_REVIEW"], (document_id, found[0], FACT_SOURCE)).fetchone()
            if row is None or row[2] not in REVIEWABLE_STATUSES:
                msg = f"no proposed or flagged fact with id {document_id}: see `osa-memory review list`"
                raise InvalidInputError(msg)
            org_id, assignment_id, status = row
            new_status = APPROVED if accept else REJECTED
            conn.execute(self._q["SET_STATUS"], (new_status, document_id, org_id))
            details: dict[str, Any] = {"from": status, "to": new_status, "note": note}
            if accept:
                # A person's decision stands: the votes it weighed no longer count against it.
                reset = conn.execute(self._q["RESET_VOTES"], (document_id,)).fetchone()
                assert reset is not None
                details["votes_reset"] = {"confirms": int(reset[0]), "flags": int(reset[1])}
            self._audit(
                conn,
                actor=actor,
                action="review",
                org_id=org_id,
                assignment_id=assignment_id,
                document_id=document_id,
                details=details,
            )
        return {"document_id": document_id, "status": new_status, "previous_status": status}

    # -- switches --------------------------------------------------------------------------------
    def set_switch(self, org_id: str, assignment_id: str, *, enabled: bool, actor: str, reason: str | None) -> None:
        """Turn memory off (or back on) for an org/assignment (``*`` for all); the reason is redacted."""
        reason = self._redact(reason)
        with transaction(self.conn_str, self.config) as conn:
            if enabled:
                conn.execute(self._q["SWITCH_ON"], (org_id, assignment_id))
            else:
                conn.execute(self._q["SWITCH_OFF"], (org_id, assignment_id, reason))
            self._audit(
                conn,
                actor=actor,
                action="switch",
                org_id=org_id,
                assignment_id=assignment_id,
                document_id=None,
                details={"enabled": enabled, "reason": reason},
            )

    def is_off(self, org_id: str, assignment_id: str) -> bool:
        with read(self.conn_str, self.config) as conn:
            row = conn.execute(self._q["IS_OFF"], {"org_id": org_id, "assignment_id": assignment_id}).fetchone()
        return bool(row and row[0])

    def switches(self) -> list[dict[str, Any]]:
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._q["LIST_SWITCHES"]).fetchall()
        return [dict(zip(("org_id", "assignment_id", "reason", "updated_at"), r, strict=True)) for r in rows]

    # -- audit -----------------------------------------------------------------------------------
    def audit(
        self, *, org_id: str | None = None, assignment_id: str | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        params = {"org_id": org_id, "assignment_id": assignment_id, "limit": limit}
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._q["AUDIT_ROWS"], params).fetchall()
        keys = ("id", "at", "actor", "action", "org_id", "assignment_id", "document_id", "details")
        return [dict(zip(keys, r, strict=True)) for r in rows]
