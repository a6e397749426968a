"""Repair of data that an earlier lifecycle let into states the transition table (`tools.TRANSITIONS`) forbids.

Run by `osa-memory repair [--dry-run]` and by every `osa-memory init`; idempotent (a second run changes
nothing). In one transaction, for the whole knowledge base:

1. proposed and flagged facts that an agent superseded go back to the review queue in the status they
   were superseded from (no longer history);
2. facts an agent path approved without a person's review (the audit shows the path: a `review` row is
   the only way from proposed, flagged or rejected to approved) go back to the status they were held in
   (`proposed` for a fact forgotten while held and stored again);
3. retired rows are reduced to their tombstone (content hash and former status; title, topic, paths,
   personas and links removed);
4. a fact lists in `supersedes` only facts that are still superseded by it (forgotten ones and loops go);
5. the recall rows of facts that ever superseded others are recomputed from their own text and the
   predecessors they still list, so that no word of a forgotten predecessor stays;
6. an `expires_at` (or `valid_from` / `valid_to`) that is not a timestamp the tools accept (an earlier import
   stored such fields as given, secrets included) is removed from the fact; the audit row names the field,
   never its value.

It reads every scope: with row-level security on, run it as a role that bypasses it (the embedded
database's superuser does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.store.database import transaction
from haystack_osa_memory.store.facts import FACT_SOURCE, INHERIT_TERMS, INSERT_AUDIT, lexeme_stats, term_keys_of
from haystack_osa_memory.tools import APPROVED, HELD_STATUSES, PROPOSED
from haystack_osa_memory.validation import check_timestamp

# 1. Facts superseded while held for review, locked.
HELD_SUPERSEDED = sql.SQL(
    """SELECT g.id, g.org_id, g.metadata->>'assignment_id', g.metadata->>'superseded_from'
    FROM {schema}.{gov} g
    WHERE g.source = %(source)s AND g.status = 'superseded' AND g.metadata->>'superseded_from' = ANY(%(held)s::text[])
    ORDER BY g.org_id, g.id FOR UPDATE"""
)
BACK_TO_REVIEW = sql.SQL(
    """UPDATE {schema}.{gov} SET status = %(status)s, updated_at = now(),
    metadata = metadata - 'valid_to' - 'superseded_by' - 'superseded_from'
    WHERE id = %(document_id)s AND org_id = %(org_id)s AND status = 'superseded'"""
)
# 2. Each approved fact's audit trail, oldest first (what put it in and out of review).
APPROVED_TRAILS = sql.SQL(
    """SELECT g.id, g.org_id, g.metadata->>'assignment_id', a.action, a.details
    FROM {schema}.{gov} g JOIN {mem}.audit a ON a.document_id = g.id AND a.org_id = g.org_id
    WHERE g.source = %(source)s AND g.status = 'approved'
    ORDER BY g.org_id, g.id, a.id"""
)
SET_HELD = sql.SQL(
    """UPDATE {schema}.{gov} SET status = %(status)s, updated_at = now()
    WHERE id = %(document_id)s AND org_id = %(org_id)s AND status = 'approved'"""
)
# 3. Retired rows that still hold more than their tombstone; the former status read from the forget's
# audit row where the row lacks it (a fact superseded while held counts as held).
SCRUB_RETIRED = sql.SQL(
    """WITH r AS (
    SELECT g.id, g.org_id, coalesce(
        g.metadata->'retired'->>'previous_status',
        CASE WHEN g.metadata->>'superseded_from' = ANY(%(held)s::text[]) THEN g.metadata->>'superseded_from' END,
        (SELECT a.details->>'previous_status' FROM {mem}.audit a
         WHERE a.document_id = g.id AND a.org_id = g.org_id AND a.action = 'forget' ORDER BY a.id DESC LIMIT 1)
    ) AS previous
    FROM {schema}.{gov} g WHERE g.source = %(source)s AND g.status = 'retired'
)
UPDATE {schema}.{gov} g SET title = NULL,
    metadata = jsonb_build_object('assignment_id', g.metadata->>'assignment_id',
                                  'retired', coalesce(g.metadata->'retired', '{{}}'::jsonb)
                                             || jsonb_strip_nulls(jsonb_build_object('previous_status', r.previous)))
FROM r
WHERE g.id = r.id AND g.org_id = r.org_id
  AND (g.title IS NOT NULL OR g.metadata - 'assignment_id' - 'retired' <> '{{}}'::jsonb
       OR g.metadata->'retired'->>'previous_status' IS DISTINCT FROM r.previous)
RETURNING g.id"""
)
# 4. `supersedes` keeps the facts still superseded by the fact that lists them.
PRUNE_LINKS = sql.SQL(
    """WITH k AS (
    SELECT g.id, g.org_id,
           (SELECT jsonb_agg(e.id ORDER BY e.n) FROM jsonb_array_elements_text(g.metadata->'supersedes')
                WITH ORDINALITY e(id, n)
            WHERE EXISTS (SELECT 1 FROM {schema}.{gov} p
                          WHERE p.id = e.id AND p.org_id = g.org_id AND p.status = 'superseded'
                            AND p.metadata->>'superseded_by' = g.id)) AS kept
    FROM {schema}.{gov} g
    WHERE g.source = %(source)s AND g.status <> 'retired' AND g.metadata ? 'supersedes'
)
UPDATE {schema}.{gov} g
SET metadata = CASE WHEN k.kept IS NULL THEN g.metadata - 'supersedes'
                    ELSE jsonb_set(g.metadata, '{{supersedes}}', k.kept) END
FROM k
WHERE g.id = k.id AND g.org_id = k.org_id AND k.kept IS DISTINCT FROM g.metadata->'supersedes'
RETURNING g.id"""
)
# 5. Facts that list predecessors or ever superseded one (the audit's `supersede` rows).
SUCCESSORS = sql.SQL(
    """SELECT g.id, g.org_id, g.metadata->>'assignment_id' FROM {schema}.{gov} g
    WHERE g.source = %(source)s AND g.status <> 'retired'
      AND (g.metadata ? 'supersedes'
           OR g.id IN (SELECT a.details->>'superseded_by' FROM {mem}.audit a WHERE a.action = 'supersede'))
    ORDER BY g.org_id, g.id"""
)
RECALL_TERMS = sql.SQL("SELECT terms FROM {schema}.osa_fact_terms WHERE document_id = %s AND org_id = %s")
# 6. Facts with a time field, to check in Python with the tools' own rule; a field that fails it is dropped.
TIME_FIELDS = ("expires_at", "valid_from", "valid_to")
TIMED_FACTS = sql.SQL(
    """SELECT g.id, g.org_id, g.metadata->>'assignment_id', g.metadata->>'expires_at', g.metadata->>'valid_from',
    g.metadata->>'valid_to' FROM {schema}.{gov} g
    WHERE g.source = %(source)s AND g.status <> 'retired'
      AND (g.metadata ? 'expires_at' OR g.metadata ? 'valid_from' OR g.metadata ? 'valid_to')"""
)
DROP_FIELDS = sql.SQL(
    """UPDATE {schema}.{gov} SET metadata = metadata - %(fields)s::text[], updated_at = now()
    WHERE id = %(document_id)s AND org_id = %(org_id)s"""
)


@dataclass
class RepairReport:
    """What one repair changed (or, with ``dry_run``, would change)."""

    dry_run: bool
    back_to_review: list[str] = field(default_factory=list)
    approved_without_review: dict[str, str] = field(default_factory=dict)
    tombstones: list[str] = field(default_factory=list)
    links_pruned: list[str] = field(default_factory=list)
    recall_rows_recomputed: list[str] = field(default_factory=list)
    bad_time_fields: dict[str, list[str]] = field(default_factory=dict)
    #: Observations an earlier reflect made of facts that say different things (`reflect.repair_observations`).
    observations_repaired: int = 0

    @property
    def changed(self) -> bool:
        return bool(
            self.back_to_review
            or self.approved_without_review
            or self.tombstones
            or self.links_pruned
            or self.recall_rows_recomputed
            or self.bad_time_fields
            or self.observations_repaired
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "back_to_review": self.back_to_review,
            "approved_without_review": self.approved_without_review,
            "tombstones": self.tombstones,
            "links_pruned": self.links_pruned,
            "recall_rows_recomputed": self.recall_rows_recomputed,
            "bad_time_fields": self.bad_time_fields,
            "observations_repaired": self.observations_repaired,
            "changed": self.changed,
        }


def held_status(trail: list[tuple[str, dict[str, Any]]]) -> str | None:
    """The status an approved fact should be in after its audit ``trail`` (action, details), oldest first:
    the status it was held in when no `review` row approved it since, else ``None`` (rightly approved)."""
    held: str | None = None
    for action, details in trail:
        status = details.get("status")
        if action == "review":
            held = None if details.get("to") == APPROVED else str(details.get("to"))
        elif action == "repair":
            held = str(details["to"]) if details.get("to") in HELD_STATUSES else held
        elif action in ("supersede", "forget"):
            previous = details.get("previous_status")
            if previous in HELD_STATUSES:
                # Forgotten while held: its text stored again comes back proposed.
                held = PROPOSED if action == "forget" else str(previous)
            elif action == "forget":
                held = None  # forgotten while approved: stored again, it starts afresh
        elif status in HELD_STATUSES:
            held = str(status)
    return held


class Repairer:
    """The repair statements for one configuration (see the module docstring)."""

    def __init__(self, conn_str: str, config: MemoryConfig) -> None:
        self.conn_str = conn_str
        self.config = config
        names = config.sql_names()
        self._q = {
            name: statement.format(**names)
            for name, statement in {
                "HELD_SUPERSEDED": HELD_SUPERSEDED,
                "BACK_TO_REVIEW": BACK_TO_REVIEW,
                "APPROVED_TRAILS": APPROVED_TRAILS,
                "SET_HELD": SET_HELD,
                "SCRUB_RETIRED": SCRUB_RETIRED,
                "PRUNE_LINKS": PRUNE_LINKS,
                "SUCCESSORS": SUCCESSORS,
                "RECALL_TERMS": RECALL_TERMS,
                "TIMED_FACTS": TIMED_FACTS,
                "DROP_FIELDS": DROP_FIELDS,
                "INSERT_AUDIT": INSERT_AUDIT,
            }.items()
        }
        self._q["INHERIT_TERMS"] = INHERIT_TERMS.format(
            **names,
            lexeme_stats=lexeme_stats(sql.SQL("x.tsv")),
            term_keys=term_keys_of(sql.SQL("ls.terms"), sql.SQL("%(org_id)s"), sql.SQL("%(assignment_id)s")),
        )

    def run(self, *, actor: str, dry_run: bool = False) -> RepairReport:
        """Repair the whole knowledge base in one transaction; with ``dry_run`` it is rolled back."""
        report = RepairReport(dry_run)
        params = {"source": FACT_SOURCE, "held": list(HELD_STATUSES)}
        with transaction(self.conn_str, self.config) as conn, conn.transaction():
            self._back_to_review(conn, params, report, actor)
            self._approved_without_review(conn, params, report, actor)
            report.tombstones = [r[0] for r in conn.execute(self._q["SCRUB_RETIRED"], params).fetchall()]
            report.links_pruned = [r[0] for r in conn.execute(self._q["PRUNE_LINKS"], params).fetchall()]
            self._recompute_successors(conn, params, report)
            self._drop_bad_time_fields(conn, params, report, actor)
            if dry_run:
                raise psycopg.Rollback()
        return report

    def _audit(
        self, conn: psycopg.Connection[Any], actor: str, org_id: str, assignment_id: str, doc: str, details: Any
    ) -> None:
        row = {
            "actor": actor,
            "action": "repair",
            "org_id": org_id,
            "assignment_id": assignment_id,
            "document_id": doc,
            "details": json.dumps(details),
        }
        conn.execute(self._q["INSERT_AUDIT"], row)

    def _back_to_review(
        self, conn: psycopg.Connection[Any], params: dict[str, Any], report: RepairReport, actor: str
    ) -> None:
        for doc, org_id, assignment_id, status in conn.execute(self._q["HELD_SUPERSEDED"], params).fetchall():
            conn.execute(self._q["BACK_TO_REVIEW"], {"status": status, "document_id": doc, "org_id": org_id})
            why = "superseded while it waited for a person's review"
            self._audit(conn, actor, org_id, assignment_id, doc, {"from": "superseded", "to": status, "why": why})
            report.back_to_review.append(doc)

    def _approved_without_review(
        self, conn: psycopg.Connection[Any], params: dict[str, Any], report: RepairReport, actor: str
    ) -> None:
        trails: dict[tuple[str, str, str], list[tuple[str, dict[str, Any]]]] = {}
        for doc, org_id, assignment_id, action, details in conn.execute(self._q["APPROVED_TRAILS"], params):
            trails.setdefault((doc, org_id, assignment_id or ""), []).append((action, dict(details or {})))
        for (doc, org_id, assignment_id), trail in trails.items():
            held = held_status(trail)
            if held is None:
                continue
            status = held
            conn.execute(self._q["SET_HELD"], {"status": status, "document_id": doc, "org_id": org_id})
            why = "approved by an agent's tool without a person's review"
            self._audit(conn, actor, org_id, assignment_id, doc, {"from": APPROVED, "to": status, "why": why})
            report.approved_without_review[doc] = status

    def _recompute_successors(
        self, conn: psycopg.Connection[Any], params: dict[str, Any], report: RepairReport
    ) -> None:
        for doc, org_id, assignment_id in conn.execute(self._q["SUCCESSORS"], params).fetchall():
            before = conn.execute(self._q["RECALL_TERMS"], (doc, org_id)).fetchone()
            inherit = {
                "successor": doc,
                "org_id": org_id,
                "assignment_id": assignment_id,
                "language": self.config.language,
            }
            conn.execute(self._q["INHERIT_TERMS"], inherit)
            after = conn.execute(self._q["RECALL_TERMS"], (doc, org_id)).fetchone()
            if before != after:
                report.recall_rows_recomputed.append(doc)

    def _drop_bad_time_fields(
        self, conn: psycopg.Connection[Any], params: dict[str, Any], report: RepairReport, actor: str
    ) -> None:
        for doc, org_id, assignment_id, *values in conn.execute(self._q["TIMED_FACTS"], params).fetchall():
            bad = []
            for name, value in zip(TIME_FIELDS, values, strict=True):
                if value is None:
                    continue
                try:
                    check_timestamp(value, name)
                except InvalidInputError:
                    bad.append(name)
            if not bad:
                continue
            conn.execute(self._q["DROP_FIELDS"], {"fields": bad, "document_id": doc, "org_id": org_id})
            why = "not a timestamp the tools accept (stored as given by an earlier import)"
            self._audit(conn, actor, org_id, assignment_id or "", doc, {"dropped": bad, "why": why})
            report.bad_time_fields[doc] = bad


def repair(conn_str: str, config: MemoryConfig, *, actor: str, dry_run: bool = False) -> RepairReport:
    """Repair the knowledge base (see the module docstring): `Repairer(conn_str, config).run(...)`."""
    return Repairer(conn_str, config).run(actor=actor, dry_run=dry_run)
