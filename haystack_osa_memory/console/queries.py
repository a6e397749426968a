"""Read-only SQL of the review console: the org's review queue, a fact with its votes and audit, the audit
log with filters, counts for the health page. Every statement names the reviewer's org.

Transitions (review, forget, switches, token revocation) are never written here: the console calls the
same `LifecycleRepository` and `TokenStore` methods as the CLI.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.markers import strip_marker
from haystack_osa_memory.store.database import fact_scope, transaction
from haystack_osa_memory.store.facts import FACT_SOURCE
from haystack_osa_memory.store.lifecycle import trust_of, valid_from_text

QUEUE_PAGE = 50
AUDIT_PAGE = 100
REVIEWABLE = ("proposed", "flagged")
# Enough of the chunk to show a line of the fact after the scope marker.
PREVIEW_CHARS = 400

_QUEUE_FILTER = sql.SQL(
    """g.org_id = %(org_id)s AND g.source = %(source)s AND g.status = ANY(%(statuses)s)
    AND (%(assignment_id)s::text IS NULL OR g.metadata->>'assignment_id' = %(assignment_id)s::text)
    AND (%(kind)s::text IS NULL OR coalesce(g.metadata->>'kind', 'fact') = %(kind)s::text)
    AND (%(created_before)s::timestamptz IS NULL OR g.created_at <= %(created_before)s::timestamptz)"""
)
QUEUE_PAGE_ROWS = sql.SQL(
    """SELECT g.id, g.metadata->>'assignment_id', g.status, g.title, coalesce(g.metadata->>'kind', 'fact'),
    g.created_at, g.updated_at, left(c.content, {preview})
    FROM {schema}.{gov} g LEFT JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
    WHERE {filter} AND (g.created_at, g.id) > (%(after_at)s::timestamptz, %(after_id)s::text)
    ORDER BY g.created_at, g.id LIMIT %(limit)s"""
)
QUEUE_COUNTS = sql.SQL(
    """SELECT g.status, count(*), min(g.created_at) FROM {schema}.{gov} g WHERE {filter} GROUP BY g.status"""
)
ORG_ASSIGNMENTS = sql.SQL(
    """SELECT g.metadata->>'assignment_id', g.status, count(*) FROM {schema}.{gov} g
    WHERE g.org_id = %(org_id)s AND g.source = %(source)s AND g.status <> 'retired'
    GROUP BY 1, 2 ORDER BY 1, 2"""
)
FACT_IN_ORG = sql.SQL(
    """SELECT g.id, g.status, g.title, g.metadata, g.specialist_id, g.created_at, g.updated_at, c.content
    FROM {schema}.{gov} g LEFT JOIN {schema}.{chunk} c ON c.meta->>'document_id' = g.id
    WHERE g.id = %(document_id)s AND g.org_id = %(org_id)s AND g.source = %(source)s AND g.status <> 'retired'"""
)
FACT_VOTES = sql.SQL(
    """SELECT verdict, note, run_id, updated_at FROM {mem}.feedback WHERE document_id = %(document_id)s
    ORDER BY updated_at, run_id"""
)
FACT_READS = sql.SQL("SELECT count(*) FROM {mem}.reads WHERE document_id = %(document_id)s")
FACT_AUDIT = sql.SQL(
    """SELECT id, at, actor, action, details FROM {mem}.audit
    WHERE document_id = %(document_id)s AND org_id = %(org_id)s ORDER BY id LIMIT 500"""
)
AUDIT_PAGE_ROWS = sql.SQL(
    """SELECT id, at, actor, action, assignment_id, document_id, details FROM {mem}.audit
    WHERE org_id = %(org_id)s
      AND (%(actor)s::text IS NULL OR actor = %(actor)s::text)
      AND (%(action)s::text IS NULL OR action = %(action)s::text)
      AND (%(document_id)s::text IS NULL OR document_id = %(document_id)s::text)
      AND (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz)
      AND (%(until)s::timestamptz IS NULL OR at < %(until)s::timestamptz)
      AND id < %(before_id)s
    ORDER BY id DESC LIMIT %(limit)s"""
)
# Per day, from what the tables already hold: facts created, reviews done, and the age in days of the
# oldest proposal still waiting at the end of the day (waiting now, or reviewed only after that day).
DAILY_ACTIVITY = sql.SQL(
    """SELECT d::date,
      (SELECT count(*) FROM {schema}.{gov} g WHERE g.org_id = %(org_id)s AND g.source = %(source)s
         AND g.created_at >= d AND g.created_at < d + interval '1 day'),
      (SELECT count(*) FROM {mem}.audit a WHERE a.org_id = %(org_id)s AND a.action = 'review'
         AND a.at >= d AND a.at < d + interval '1 day'),
      (SELECT extract(epoch FROM least(now(), d + interval '1 day') - min(w.created_at)) / 86400 FROM (
         SELECT g.created_at FROM {schema}.{gov} g
         WHERE g.org_id = %(org_id)s AND g.source = %(source)s AND g.status = 'proposed'
           AND g.created_at < d + interval '1 day'
         UNION ALL
         SELECT g.created_at FROM {mem}.audit a JOIN {schema}.{gov} g ON g.id = a.document_id AND g.org_id = a.org_id
         WHERE a.org_id = %(org_id)s AND a.action = 'review' AND a.details->>'from' = 'proposed'
           AND a.at >= d + interval '1 day' AND g.created_at < d + interval '1 day') w)
    FROM generate_series(date_trunc('day', now()) - (%(days)s - 1) * interval '1 day', date_trunc('day', now()),
                         interval '1 day') AS d ORDER BY 1"""
)


def encode_after(at: datetime, document_id: str) -> str:
    raw = json.dumps([at.isoformat(), document_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_after(cursor: str) -> tuple[str, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        at, doc_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        datetime.fromisoformat(at)
        if not isinstance(doc_id, str):
            raise TypeError(doc_id)
    except (ValueError, TypeError) as e:
        msg = "page cursor is not valid: follow the 'next page' link of the queue"
        raise InvalidInputError(msg) from e
    return at, doc_id


@dataclass(frozen=True)
class QueueFilter:
    """What the review queue shows: statuses, and optionally one assignment, one kind, a minimum age."""

    statuses: tuple[str, ...] = REVIEWABLE
    assignment_id: str | None = None
    kind: str | None = None
    created_before: datetime | None = None


class ConsoleQueries:
    """The console's reads, always inside one org (row-level security, when on, sees only that org)."""

    def __init__(self, conn_str: str, config: MemoryConfig) -> None:
        self.conn_str = conn_str
        self.config = config
        names = config.sql_names()
        self._page = QUEUE_PAGE_ROWS.format(filter=_QUEUE_FILTER, preview=sql.Literal(PREVIEW_CHARS), **names)
        self._counts = QUEUE_COUNTS.format(filter=_QUEUE_FILTER, **names)
        self._assignments = ORG_ASSIGNMENTS.format(**names)
        self._fact = FACT_IN_ORG.format(**names)
        self._votes = FACT_VOTES.format(**names)
        self._reads = FACT_READS.format(**names)
        self._fact_audit = FACT_AUDIT.format(**names)
        self._audit = AUDIT_PAGE_ROWS.format(**names)
        self._daily = DAILY_ACTIVITY.format(**names)

    def queue(self, org_id: str, flt: QueueFilter, after: str | None) -> dict[str, Any]:
        """One page of the queue, oldest first, the next page's cursor, and counts per status."""
        after_at, after_id = decode_after(after) if after else ("-infinity", "")
        params: dict[str, Any] = {
            "org_id": org_id,
            "source": FACT_SOURCE,
            "statuses": list(flt.statuses),
            "assignment_id": flt.assignment_id,
            "kind": flt.kind,
            "created_before": flt.created_before,
            "after_at": after_at,
            "after_id": after_id,
            "limit": QUEUE_PAGE + 1,
        }
        with fact_scope(org_id, ""), transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._page, params).fetchall()
            counts = conn.execute(self._counts, params).fetchall()
        page, more = rows[:QUEUE_PAGE], len(rows) > QUEUE_PAGE
        items = [
            {
                "document_id": r[0],
                "assignment_id": r[1],
                "status": r[2],
                "title": r[3],
                "kind": r[4],
                "created_at": r[5],
                "stored_at": r[6],
                "preview": strip_marker(r[7]) if r[7] is not None else "",
            }
            for r in page
        ]
        return {
            "items": items,
            "next": encode_after(page[-1][5], page[-1][0]) if more and page else None,
            "counts": {status: int(n) for status, n, _ in counts},
            "oldest": min((oldest for _, _, oldest in counts if oldest is not None), default=None),
        }

    def assignments(self, org_id: str) -> dict[str, dict[str, int]]:
        """assignment -> status -> facts, for the org."""
        out: dict[str, dict[str, int]] = {}
        with fact_scope(org_id, ""), transaction(self.conn_str, self.config) as conn:
            for assignment, status, n in conn.execute(
                self._assignments, {"org_id": org_id, "source": FACT_SOURCE}
            ).fetchall():
                out.setdefault(assignment or "", {})[status] = int(n)
        return out

    def fact(self, org_id: str, document_id: str) -> dict[str, Any] | None:
        """A fact of the org with provenance, votes and notes, reads and its audit entries; ``None`` when the
        id is unknown, retired or of another org (the same answer for all three)."""
        params = {"org_id": org_id, "document_id": document_id, "source": FACT_SOURCE}
        with fact_scope(org_id, ""), transaction(self.conn_str, self.config) as conn:
            row = conn.execute(self._fact, params).fetchone()
            if row is None:
                return None
            votes = conn.execute(self._votes, params).fetchall()
            reads_row = conn.execute(self._reads, params).fetchone()
            audit = conn.execute(self._fact_audit, params).fetchall()
        doc_id, status, title, metadata, specialist_id, created_at, updated_at, content = row
        confirms = sum(1 for v in votes if v[0] == "confirm")
        flags = sum(1 for v in votes if v[0] == "flag")
        return {
            "document_id": doc_id,
            "assignment_id": metadata.get("assignment_id"),
            "content": strip_marker(content) if content is not None else "",
            "kind": metadata.get("kind", "fact"),
            "topic": metadata.get("topic"),
            "title": title,
            "paths": list(metadata.get("paths", []) or []),
            "personas": list(metadata.get("personas", []) or []),
            "stored_by": metadata.get("stored_by"),
            "specialist_id": specialist_id,
            "created_at": created_at,
            "stored_at": updated_at,
            "status": status,
            "trust": round(trust_of(confirms, flags), 3),
            "confirms": confirms,
            "flags": flags,
            "votes": [{"verdict": v[0], "note": v[1], "run_id": v[2], "at": v[3]} for v in votes],
            "reads": int(reads_row[0]) if reads_row else 0,
            "valid_from": valid_from_text(metadata, created_at),
            "valid_to": metadata.get("valid_to"),
            "expires_at": metadata.get("expires_at"),
            "supersedes": list(metadata.get("supersedes", []) or []),
            "superseded_by": metadata.get("superseded_by"),
            "evidence": list(metadata.get("evidence", []) or []),
            "audit": [{"id": a[0], "at": a[1], "actor": a[2], "action": a[3], "details": a[4] or {}} for a in audit],
        }

    def audit(
        self,
        org_id: str,
        *,
        actor: str | None = None,
        action: str | None = None,
        document_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        before_id: int | None = None,
        limit: int = AUDIT_PAGE,
    ) -> list[dict[str, Any]]:
        """The org's audit rows, newest first, filtered; ``before_id`` pages back."""
        params = {
            "org_id": org_id,
            "actor": actor,
            "action": action,
            "document_id": document_id,
            "since": since,
            "until": until,
            "before_id": before_id if before_id is not None else 2**62,
            "limit": limit,
        }
        with transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._audit, params).fetchall()
        keys = ("id", "at", "actor", "action", "assignment_id", "document_id", "details")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def daily(self, org_id: str, days: int = 14) -> list[dict[str, Any]]:
        """Facts stored, reviews done and the oldest waiting proposal's age (days) per day, the last ``days``."""
        with fact_scope(org_id, ""), transaction(self.conn_str, self.config) as conn:
            rows = conn.execute(self._daily, {"org_id": org_id, "source": FACT_SOURCE, "days": days}).fetchall()
        return [
            {"day": r[0], "stored": int(r[1]), "reviews": int(r[2]), "queue_age": float(r[3]) if r[3] else 0.0}
            for r in rows
        ]
