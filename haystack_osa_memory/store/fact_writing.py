"""Writing facts: the governing row, chunk and recall row of each fact in one statement, a batch in one
transaction, and supersession in the transaction that wrote the successor (`FactWriting`, the writing
half of `haystack_osa_memory.store.facts.FactRepository`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import DatabaseError, SupersessionError
from haystack_osa_memory.store.database import fact_scope, rendered, statement, transaction
from haystack_osa_memory.store.parameters import vector_parameter
from haystack_osa_memory.store.recall_rows import lexeme_stats, term_keys_of
from haystack_osa_memory.store.scope_query import VALID_FROM
from haystack_osa_memory.tools import (
    APPROVED,
    HELD_STATUSES,
    REVIEWABLE_STATUSES,
    SUPERSEDABLE_STATUSES,
    SUPERSEDED,
)

logger = logging.getLogger(__name__)

#: A fact's recall row goes into the vector index (HNSW) of osa_fact_terms once its scope holds this many recall
#: rows when it is written; the rows written before stay out (`ddl.ADD_TERMS_VECTOR_FLAG`) and the big-scope path
#: ranks them exactly beside the index's candidates (`big_scope.BIG_SCOPE_VECTOR`). Only scopes past
#: `big_scope.EXACT_SCOPE_MAX` facts that the process does not hold in memory read the index, and its insert was
#: most of what a hybrid store cost PostgreSQL beyond a lexical one; at most this many rows per scope are ranked
#: exactly there. (A row without a vector has no entry either way: it is written as indexed, without counting.)
VECTOR_INDEX_FROM = 500

# Upsert by deterministic id. Only a person's review moves a fact out of a held status
# (`tools.HELD_STATUSES`: proposed, flagged, rejected) into recall, so storing the same text keeps the
# status a review or feedback gave it, and so does its valid_from unless the store names one. A retired
# (forgotten) fact stored again starts afresh, except that one forgotten while held comes back `proposed`
# (its tombstone keeps the former status). A superseded one stored again holds again (from the new
# valid_from, its successor link dropped), in the status it was superseded from when that was held; that
# write alone returns the former successor (``held_again_after``, dropped again by the next store of the
# same text), which `FactRepository.write` then detaches. The WHERE refuses to touch a row of another scope.
# ``alone``: empty, or `_ALONE` for a fact written by its statement alone, outside a transaction.
UPSERT_GOVERNING_ROW = sql.SQL(
    """INSERT INTO {schema}.{gov} AS d
    (id, org_id, specialist_id, dataset, source, audience, status, content_hash, title, metadata)
    VALUES (%(id)s, %(org_id)s, %(specialist_id)s, %(dataset)s, %(source)s, %(audience)s, %(status)s,
            %(content_hash)s, %(title)s, %(metadata)s)
    ON CONFLICT (id) DO UPDATE SET
        specialist_id = EXCLUDED.specialist_id,
        title = coalesce(EXCLUDED.title, d.title),
        status = CASE
            WHEN d.status = 'retired'
                 AND d.metadata->'retired'->>'previous_status' = ANY(%(held)s::text[])
                 AND NOT EXCLUDED.status = ANY(%(held)s::text[]) THEN 'proposed'
            WHEN d.status = 'retired' THEN EXCLUDED.status
            WHEN d.status = 'superseded'
                 AND d.metadata->>'superseded_from' = ANY(%(held)s::text[])
            THEN d.metadata->>'superseded_from'
            WHEN d.status = 'superseded' THEN EXCLUDED.status
            ELSE d.status END,
        metadata = CASE WHEN d.status = 'retired' THEN EXCLUDED.metadata
                        WHEN d.status = 'superseded'
                        THEN (d.metadata - 'valid_from' - 'valid_to' - 'superseded_by' - 'superseded_from')
                             || EXCLUDED.metadata
                             || jsonb_build_object('held_again_after', d.metadata->'superseded_by')
                        ELSE (d.metadata - 'held_again_after')
                             || (EXCLUDED.metadata
                                 - CASE WHEN %(valid_from_given)s::boolean THEN '' ELSE 'valid_from' END)
                   END,
        created_at = CASE WHEN d.status = 'retired' THEN now() ELSE d.created_at END,
        updated_at = now()
    WHERE d.org_id = EXCLUDED.org_id
      AND d.source = EXCLUDED.source
      AND d.content_hash = EXCLUDED.content_hash
      AND d.metadata->>'assignment_id' = EXCLUDED.metadata->>'assignment_id'{alone}
    RETURNING id, status, seq, metadata, created_at, updated_at,
        hashtextextended(id || '/' || xmin::text, 0) AS version"""
)
# A fact written alone (one fact, superseding none) is one statement, run outside a transaction: it commits by
# itself, without a BEGIN and a COMMIT round trip (docs/traps.md). Holding a superseded fact again takes more
# statements (`DETACH_SUCCESSOR`, `INHERIT_TERMS`) in the same transaction, so that statement refuses such a fact
# (nothing written, as for another scope's) and the transaction writes it.
_ALONE = sql.SQL("\n      AND d.status <> 'superseded'")
INSERT_AUDIT = sql.SQL(
    """INSERT INTO {mem}.audit (actor, action, org_id, assignment_id, document_id, details)
    VALUES (%(actor)s, %(action)s, %(org_id)s, %(assignment_id)s, %(document_id)s, %(details)s)"""
)

# One fact in one statement (one round trip; a batch goes through pipeline mode): governing row,
# chunk, lexical statistics and, when asked, an audit row. Everything after the governing-row upsert
# selects FROM it, so when that upsert refuses (the id belongs to another scope) nothing is written.
# The lexical statistics (same expression the recall query falls back to) spare recall re-tokenising
# every fact of the scope on every query; they are used only while the chunk's content still has the
# same md5 (a chunk changed by other tools is re-tokenised at query time). Each row written returns its
# version's hash (`WrittenRow`): with the recall row's columns, the scope's kept rows take the fact in memory.
# The text is tokenised once (``OFFSET 0``, see SCOPE_ROWS). Comments stay out of the statement: psycopg parses
# one longer than 4,096 bytes again on every execute (docs/traps.md).

WRITE_FACT = sql.SQL(
    """WITH g AS ({upsert_row}),
a AS (
    INSERT INTO {mem}.audit (actor, action, org_id, assignment_id, document_id, details)
    SELECT %(actor)s, %(action)s, %(org_id)s, %(assignment_id)s, g.id,
           jsonb_build_object('status', g.status, 'kind', %(kind)s::text)
           || CASE WHEN g.metadata->>'held_again_after' IS NULL THEN '{{}}'
                   ELSE jsonb_build_object('held_again_after', g.metadata->'held_again_after') END
    FROM g WHERE %(audit)s::boolean
),
c AS (
    INSERT INTO {schema}.{chunk} (id, embedding, content, meta)
    SELECT %(chunk_id)s, %(embedding)s::vector, %(content)s, %(meta)s FROM g
    ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, content = EXCLUDED.content, meta = EXCLUDED.meta
),
t AS (
    INSERT INTO {schema}.osa_fact_terms
        (document_id, language, content_md5, terms, dl, content_hash, embedding, org_id, assignment_id, seq, term_keys,
         vector_indexed)
    SELECT %(chunk_id)s, %(language)s, md5(%(content)s), ls.terms, ls.dl, %(content_hash)s, %(embedding)s::vector,
           %(org_id)s, %(assignment_id)s, g.seq, {term_keys},
           %(embedding)s IS NULL OR (SELECT count(*) FROM (SELECT FROM {schema}.osa_fact_terms x
               WHERE x.org_id = %(org_id)s AND x.assignment_id = %(assignment_id)s LIMIT %(vector_index_from)s) n)
               >= %(vector_index_from)s
    FROM g, (SELECT to_tsvector(%(language)s::regconfig,
                    regexp_replace(%(content)s, '^<!-- osa-memory:scope [^\n]* -->\n', '')) AS tsv
             OFFSET 0) x,
         LATERAL ({lexeme_stats}) ls
    ON CONFLICT (document_id) DO UPDATE SET
        language = EXCLUDED.language, content_md5 = EXCLUDED.content_md5, terms = EXCLUDED.terms, dl = EXCLUDED.dl,
        content_hash = EXCLUDED.content_hash, embedding = EXCLUDED.embedding,
        org_id = EXCLUDED.org_id, assignment_id = EXCLUDED.assignment_id, seq = EXCLUDED.seq,
        term_keys = EXCLUDED.term_keys, vector_indexed = EXCLUDED.vector_indexed
    RETURNING vector_send(embedding) AS vector, dl, terms
)
SELECT g.*, t.* FROM g LEFT JOIN t ON true"""
)


class WrittenRow(NamedTuple):
    """`WRITE_FACT`'s row: the id, status and storing order (``metadata`` names a former successor as
    ``held_again_after``), then what the scope's rows kept in memory need of the fact
    (`FactRepository._written`): its governing row's version hash as the print sums it (`scope_memo`; its
    chunk and recall row, written by the same statement, have the same id and version) and the columns
    `scope_memo.MEMO_ROWS` reads of it. ``vector``, ``dl`` and ``terms`` are None when no recall row was
    written."""

    id: str
    status: str
    seq: int
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    version: int
    vector: bytes | None
    dl: float | None
    terms: bytes | None


# The successor's valid_from as text (ISO 8601, UTC), for its predecessors' valid_to.
_VALID_FROM_TEXT = sql.SQL(
    """coalesce(s.metadata->>'valid_from',
                to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))"""
)
# Supersession, in the transaction that wrote the successor: each predecessor (same scope, a status that
# can be superseded, valid from before its successor) becomes `superseded`, holds until the successor's
# valid_from, links to it and gets an audit row; the successor lists its predecessors. The row lock of
# the UPDATE orders two supersessions of one fact: the second re-reads the row, finds it superseded and
# updates nothing, and `FactRepository.write` then refuses its whole transaction.
SUPERSEDE = sql.SQL(
    """WITH s AS (
    SELECT g.id, g.created_at, g.metadata, {valid_from} AS vf FROM {schema}.{gov} g
    WHERE g.id = %(successor)s AND g.org_id = %(org_id)s
),
old AS (
    UPDATE {schema}.{gov} g SET status = 'superseded', updated_at = now(),
        metadata = g.metadata || jsonb_build_object('valid_to', {valid_from_text}, 'superseded_by', s.id,
                                                    'superseded_from', g.status)
    FROM s
    WHERE g.id = ANY(%(ids)s) AND g.id <> s.id AND g.org_id = %(org_id)s AND g.source = %(source)s
      AND g.metadata->>'assignment_id' = %(assignment_id)s AND g.status = ANY(%(supersedable)s)
      AND {valid_from} < s.vf
    RETURNING g.id, g.metadata->>'superseded_from' AS previous, g.metadata->>'valid_to' AS valid_to
),
a AS (
    INSERT INTO {mem}.audit (actor, action, org_id, assignment_id, document_id, details)
    SELECT %(actor)s, 'supersede', %(org_id)s, %(assignment_id)s, old.id,
           jsonb_build_object('superseded_by', %(successor)s::text, 'valid_to', old.valid_to,
                              'previous_status', old.previous)
    FROM old
),
link AS (
    UPDATE {schema}.{gov} g SET metadata = jsonb_set(g.metadata, '{{supersedes}}', (
        SELECT coalesce(jsonb_agg(DISTINCT x.id), '[]'::jsonb)
        FROM (SELECT jsonb_array_elements_text(coalesce(g.metadata->'supersedes', '[]'::jsonb)) AS id
              UNION SELECT old.id FROM old) x))
    WHERE g.id = %(successor)s AND g.org_id = %(org_id)s AND EXISTS (SELECT 1 FROM old)
)
SELECT old.id FROM old"""
)
# A successor answers questions worded like the facts it replaced: its recall row's lexemes (and their
# scope-salted keys) are recomputed from its own text and its predecessors', so "Swift now runs in
# sa-east-1" is still found by "which region is the swift cluster in?" once it superseded "The swift
# cluster lives in region eu-west-1". Its vector, its length (BM25's dl: the words it takes do not make it
# look long), and what recall returns stay its own.
INHERIT_TERMS = sql.SQL(
    """UPDATE {schema}.osa_fact_terms t SET terms = ls.terms, term_keys = {term_keys}
    FROM (SELECT to_tsvector(%(language)s::regconfig,
                 regexp_replace(c.content, '^<!-- osa-memory:scope [^\n]* -->\n', '') || E'\n' ||
                 coalesce((SELECT string_agg(regexp_replace(p.content, '^<!-- osa-memory:scope [^\n]* -->\n', ''),
                                             E'\n' ORDER BY p.id)
                           FROM {schema}.{chunk} p
                           WHERE p.id IN (SELECT jsonb_array_elements_text(g.metadata->'supersedes')
                                          FROM {schema}.{gov} g
                                          WHERE g.id = %(successor)s AND g.org_id = %(org_id)s)), '')) AS tsv
          FROM {schema}.{chunk} c WHERE c.id = %(successor)s
          OFFSET 0) x,  -- tokenised once (see SCOPE_ROWS)
         LATERAL ({lexeme_stats}) ls
    WHERE t.document_id = %(successor)s AND t.org_id = %(org_id)s"""
)
# A superseded fact stored again holds again (UPSERT_GOVERNING_ROW): its former successor stops listing it,
# so that a value going back (X, then Y, then X again naming Y in ``supersedes``) is a new version of X after
# Y, never a loop of two facts listing each other. Its recall row is then recomputed (INHERIT_TERMS).
DETACH_SUCCESSOR = sql.SQL(
    """UPDATE {schema}.{gov} s
    SET metadata = CASE WHEN coalesce(s.metadata->'supersedes', '[]'::jsonb) - %(id)s::text = '[]'::jsonb
                        THEN s.metadata - 'supersedes'
                        ELSE jsonb_set(s.metadata, '{{supersedes}}', (s.metadata->'supersedes') - %(id)s::text) END
    WHERE s.id = %(successor)s AND s.org_id = %(org_id)s AND s.source = %(source)s
      AND s.metadata->>'assignment_id' = %(assignment_id)s"""
)
# Why an id named in ``supersedes`` was not superseded (read in the same transaction, before it is undone).
SUPERSEDE_REFUSALS = sql.SQL(
    """SELECT g.id, g.status, g.metadata->>'superseded_by', {valid_from}
    FROM {schema}.{gov} g
    WHERE g.id = ANY(%(ids)s) AND g.org_id = %(org_id)s AND g.source = %(source)s
      AND g.metadata->>'assignment_id' = %(assignment_id)s AND g.status <> 'retired'"""
)


class FactWriting:
    """Upserts facts and supersedes the ones they replace (mixed into `FactRepository`)."""

    conn_str: str
    config: MemoryConfig

    def _init_writing(self, names: dict[str, sql.Identifier]) -> None:
        """Compose the writing statements for these schema and table names (`MemoryConfig.sql_names`)."""
        self._supersede = rendered(SUPERSEDE.format(**names, valid_from=VALID_FROM, valid_from_text=_VALID_FROM_TEXT))
        self._supersede_refusals = rendered(SUPERSEDE_REFUSALS.format(**names, valid_from=VALID_FROM))
        self._detach_successor = rendered(DETACH_SUCCESSOR.format(**names))
        self._inherit_terms = rendered(
            INHERIT_TERMS.format(
                **names,
                lexeme_stats=lexeme_stats(sql.SQL("x.tsv")),
                term_keys=term_keys_of(sql.SQL("ls.terms"), sql.SQL("%(org_id)s"), sql.SQL("%(assignment_id)s")),
            )
        )
        self._write_fact, self._write_alone = (
            rendered(
                WRITE_FACT.format(
                    upsert_row=UPSERT_GOVERNING_ROW.format(**names, alone=alone),
                    lexeme_stats=lexeme_stats(sql.SQL("x.tsv")),
                    term_keys=term_keys_of(sql.SQL("ls.terms"), sql.SQL("%(org_id)s"), sql.SQL("%(assignment_id)s")),
                    **names,
                )
            )
            for alone in (sql.SQL(""), _ALONE)
        )

    def write(
        self,
        items: Sequence[tuple[dict[str, Any], dict[str, Any]]],
        *,
        audit: dict[str, Any] | None = None,
    ) -> list[str]:
        """Upsert governing rows and their chunks in ONE transaction: all become visible, or none.

        With ``audit`` (``actor``, ``action``), one audit row per fact is appended in the same
        transaction (the audit table lives in ``config.memory_schema``).

        Raises:
            DatabaseError: the database failed, or an id is taken by a document of another scope.
            SupersessionError: a fact named in ``supersedes`` cannot be superseded, or the fact written
                waits for a person's review; nothing is written.
        """
        return [doc_id for doc_id, _ in self.write_statuses(items, audit=audit)]

    def write_statuses(
        self,
        items: Sequence[tuple[dict[str, Any], dict[str, Any]]],
        *,
        audit: dict[str, Any] | None = None,
    ) -> list[tuple[str, str]]:
        """`write`, returning each fact's id with the status it has after the write (storing the text of a
        fact held for review keeps it held: `tools.HELD_STATUSES`)."""
        now = datetime.now(UTC).isoformat()
        params = [
            {
                **{k: v for k, v in row.items() if k != "supersedes"},
                "metadata": json.dumps({"valid_from": now, **row["metadata"]}),
                "valid_from_given": "valid_from" in row["metadata"],
                "audit": audit is not None,
                "actor": audit["actor"] if audit else None,
                "action": audit["action"] if audit else None,
                "assignment_id": row["metadata"].get("assignment_id"),
                "kind": row["metadata"].get("kind"),
                "chunk_id": chunk["id"],
                "embedding": vector_parameter(chunk.get("embedding")),
                "vector_index_from": VECTOR_INDEX_FROM,
                "content": chunk["content"],
                "meta": json.dumps(chunk["meta"]),
                "language": self.config.language,
                "held": list(HELD_STATUSES),
            }
            for row, chunk in items
        ]
        written: list[tuple[str, str]] = []
        scopes = {(row["org_id"], row["metadata"].get("assignment_id")) for row, _ in items}
        org_id, assignment_id = next(iter(scopes)) if len(scopes) == 1 else ("", "")
        # Written inside the rows' scope: with row-level security on, PostgreSQL checks each new row
        # against it (a batch spanning scopes is refused there).
        if len(params) == 1 and not items[0][0].get("supersedes"):
            with fact_scope(org_id, assignment_id or ""), statement(self.conn_str, self.config) as conn:
                found = conn.execute(self._write_alone, params[0]).fetchone()
            if found is not None:
                alone = WrittenRow(*found)
                self._written_alone(params[0], items[0][1]["meta"], alone)
                return [(params[0]["id"], str(alone.status))]
            # Refused, nothing written: a superseded fact held again, or another scope's id (refused below).
        with (
            fact_scope(org_id, assignment_id or ""),
            transaction(self.conn_str, self.config) as conn,
            conn.cursor() as cur,
        ):
            if len(params) == 1:
                cur.execute(self._write_fact, params[0])
            else:
                cur.executemany(self._write_fact, params, returning=True)
            detached: list[tuple[dict[str, Any], str]] = []
            rows: list[WrittenRow] = []
            for n, p in enumerate(params):
                if n:
                    cur.nextset()
                found = cur.fetchone()
                if found is None:
                    msg = f"document id {p['id']} belongs to another document; refusing to overwrite it"
                    raise DatabaseError(msg)
                rows.append(WrittenRow(*found))
                written.append((p["id"], str(rows[-1].status)))
                successor = rows[-1].metadata.get("held_again_after")
                if successor is not None:
                    detached.append((p, str(successor)))
            for p, successor in detached:
                # It no longer lists the fact that holds again: its recall row loses that fact's words.
                scope = {**self._scope_of(p), "successor": successor}
                cur.execute(self._detach_successor, {**scope, "id": p["id"]})
                cur.execute(self._inherit_terms, {**scope, "language": p["language"]})
            for (row, _), p, (_, status) in zip(items, params, written, strict=True):
                if row.get("supersedes"):
                    if status != APPROVED:
                        msg = (
                            f"cannot supersede: fact {p['id']} is {status} and waits for a person's review "
                            "(osa-memory review); only an approved fact can supersede others. Nothing was stored."
                        )
                        raise SupersessionError(msg)
                    self._supersede_in(cur, p, list(row["supersedes"]))
        if len(rows) == 1 and not detached and not items[0][0].get("supersedes"):
            self._written_alone(params[0], items[0][1]["meta"], rows[0])
        return written

    def _written_alone(self, params: dict[str, Any], chunk_meta: dict[str, Any], row: WrittenRow) -> None:
        """A fact whose statement was the only one of its transaction (nothing else changed the rows it wrote:
        what it returned of them is what committed) joins its scope's rows kept (`_written`)."""
        try:
            self._written(params, chunk_meta, row)
        except Exception as e:  # the fact is stored: rows kept that miss it only cost the next print a match
            logger.warning("a stored fact did not join its scope's rows kept in memory: %s", type(e).__name__)

    def _written(self, params: dict[str, Any], chunk_meta: dict[str, Any], row: WrittenRow) -> None:
        """After one fact's write committed, the only statement of its transaction that touched its rows:
        ``params`` as written (``chunk_meta``: its chunk's metadata before it was serialised into them), ``row``
        what `WRITE_FACT` returned. `FactRepository` adds it to the scope's rows kept in memory (`scope_memo`)."""

    @staticmethod
    def _scope_of(written: dict[str, Any]) -> dict[str, Any]:
        return {
            "org_id": written["org_id"],
            "assignment_id": written["assignment_id"],
            "source": written["source"],
        }

    def _supersede_in(self, cur: psycopg.Cursor[Any], written: dict[str, Any], ids: list[str]) -> None:
        """Supersede ``ids`` by the fact just written (`SUPERSEDE`), in its transaction; refuses them all,
        with the reason for each, unless every one was superseded (the caller's transaction is then undone)."""
        scope = {
            "org_id": written["org_id"],
            "assignment_id": written["assignment_id"],
            "source": written["source"],
            "ids": ids,
        }
        params = {
            **scope,
            "successor": written["id"],
            "supersedable": list(SUPERSEDABLE_STATUSES),
            "actor": written["actor"] or "unknown",
        }
        done = {r[0] for r in cur.execute(self._supersede, params).fetchall()}
        if done == set(ids):
            inherit = {**scope, "successor": written["id"], "language": written["language"]}
            cur.execute(self._inherit_terms, inherit)
            return
        found = {r[0]: r[1:] for r in cur.execute(self._supersede_refusals, scope).fetchall()}
        successor = found.get(written["id"])
        reasons = []
        for doc_id in ids:
            if doc_id in done:
                continue
            row = found.get(doc_id)
            if doc_id == written["id"]:
                reasons.append(f"{doc_id} is the fact being stored: a fact cannot supersede itself")
            elif row is None:
                reasons.append(f"no fact {doc_id} in this assignment")
            elif row[0] == SUPERSEDED:
                reasons.append(f"fact {doc_id} is already superseded by {row[1]}")
            elif row[0] in REVIEWABLE_STATUSES:
                reasons.append(
                    f"fact {doc_id} is {row[0]} and waits for a person's review (osa-memory review); "
                    f"only {', '.join(SUPERSEDABLE_STATUSES)} facts can be superseded"
                )
            elif row[0] not in SUPERSEDABLE_STATUSES:
                allowed = ", ".join(SUPERSEDABLE_STATUSES)
                reasons.append(f"fact {doc_id} is {row[0]}; only {allowed} facts can be superseded")
            else:
                since = successor[2].isoformat() if successor is not None else "its valid_from"
                reasons.append(
                    f"fact {doc_id} holds from {row[2].isoformat()}, not before the new fact (valid from {since})"
                )
        msg = "cannot supersede: " + "; ".join(reasons) + ". Nothing was stored."
        raise SupersessionError(msg)
