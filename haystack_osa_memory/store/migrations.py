"""The schema's versions in order (`MIGRATIONS`): each a list of small idempotent steps that name the table
they touch and the lock they take there. Only `osa-memory init` (`haystack_osa_memory.store.schema`) applies
them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from haystack_osa_memory.markers import MARKER_PREFIX
from haystack_osa_memory.store.ddl import (
    ADD_SEQ,
    ADD_TERMS_CANDIDATE_COLUMNS,
    ADD_TERMS_PACKED,
    ADD_TERMS_RECALL_COLUMNS,
    ADD_TERMS_SCOPE,
    ADD_TERMS_VECTOR_FLAG,
    ADD_TOKEN_GRANTS,
    ADD_TOKEN_ROLES,
    BACKFILL_PACKED,
    BACKFILL_TERMS,
    BACKFILL_TERMS_CANDIDATE_COLUMNS,
    BACKFILL_TERMS_SCOPE,
    CHUNK_STORAGE,
    CREATE_AUDIT_INDEX,
    CREATE_AUDIT_TABLE,
    CREATE_CHUNK_DOCUMENT_INDEX,
    CREATE_CHUNK_TABLE,
    CREATE_CONSOLE_SESSIONS_INDEX,
    CREATE_CONSOLE_SESSIONS_TABLE,
    CREATE_EXTENSION,
    CREATE_FEEDBACK_TABLE,
    CREATE_GOVERNING_TABLE,
    CREATE_KEYWORD_INDEX,
    CREATE_READS_TABLE,
    CREATE_REVIEW_QUEUE_INDEX,
    CREATE_SCHEMA,
    CREATE_SCOPE_CREATED_INDEX,
    CREATE_SCOPE_INDEX,
    CREATE_SWITCHES_TABLE,
    CREATE_TERMS_BIG_VECTOR_INDEX,
    CREATE_TERMS_INVALIDATE_FUNCTION,
    CREATE_TERMS_KEYS_INDEX,
    CREATE_TERMS_SCOPE_INDEX,
    CREATE_TERMS_TABLE,
    CREATE_TERMS_TRIGGER,
    CREATE_TERMS_TRUNCATE_TRIGGER,
    CREATE_TERMS_UNINDEXED_INDEX,
    CREATE_TERMS_VECTOR_INDEX,
    CREATE_TOKENS_TABLE,
    CREATE_VERSION_TABLE,
    DROP_TERMS_TRIGGER,
    DROP_TERMS_TRUNCATE_TRIGGER,
    DROP_TERMS_TSV,
    DROP_TERMS_VECTOR_INDEX,
    EXTENSION_EXISTS,
    SCHEMA_EXISTS,
    SET_CHUNK_STORAGE,
    SET_TERMS_STORAGE,
    TERMS_EMBEDDING_STORAGE,
    TERMS_HAS_TSV,
    TOAST_TUPLE_TARGET,
)
from haystack_osa_memory.store.facts import lexeme_stats, term_keys_of
from haystack_osa_memory.store.steps import (
    ACCESS_EXCLUSIVE,
    ACCESS_EXCLUSIVE_IF_PRESENT,
    NEW_TABLE,
    NO_TABLE_LOCK,
    ROW_EXCLUSIVE,
    SHARE_ROW_EXCLUSIVE,
    SHARE_UPDATE_EXCLUSIVE,
    Migration,
    Names,
    Statement,
    Step,
    chunk_table,
    gov_table,
    mem_table,
    no_table,
    terms_table,
)


def _terms_index(template: sql.SQL) -> Step:
    """A ``CREATE`` (or ``DROP``) ``INDEX CONCURRENTLY`` on osa_fact_terms, run on its own: writers go on meanwhile.
    ``template`` may name the embedding's ``{dimension}``."""
    return Step(
        lambda n: template.format(schema=n.kb, dimension=sql.Literal(n.config.embedding_dimension)),
        terms_table,
        SHARE_UPDATE_EXCLUSIVE,
        in_transaction=False,
    )


def _index(template: sql.SQL, suffix: str, table: str) -> Callable[[Names], Statement]:
    """A ``CREATE INDEX CONCURRENTLY`` on the chunk or governing table: their writers go on meanwhile."""

    def build(n: Names) -> Statement:
        name = n.config.chunk_table if table == "chunk" else n.config.governing_table
        return template.format(
            index=sql.Identifier(f"{name}_{suffix}"),
            schema=n.kb,
            table=n.chunk if table == "chunk" else n.gov,
            language=sql.Literal(n.config.language),
        )

    return build


def _has_storage_to_set(conn: psycopg.Connection[Any], n: Names) -> bool:
    row = conn.execute(CHUNK_STORAGE, (n.config.kb_schema, n.config.chunk_table)).fetchone()
    return row is not None and (row[0] != "m" or f"toast_tuple_target={TOAST_TUPLE_TARGET}" not in row[1])


def _terms_storage_to_set(conn: psycopg.Connection[Any], n: Names) -> bool:
    row = conn.execute(TERMS_EMBEDDING_STORAGE, (n.config.kb_schema,)).fetchone()
    return row is not None and row[0] != "m"


def _terms_has_tsv(conn: psycopg.Connection[Any], n: Names) -> bool:
    row = conn.execute(TERMS_HAS_TSV, (n.config.kb_schema,)).fetchone()
    return bool(row and row[0])


def _extension_missing(conn: psycopg.Connection[Any], n: Names) -> bool:
    row = conn.execute(EXTENSION_EXISTS).fetchone()
    return not (row and row[0])


def _schema_missing(conn: psycopg.Connection[Any], name: str) -> bool:
    row = conn.execute(SCHEMA_EXISTS, (f'"{name}"',)).fetchone()
    return not (row and row[0])


def _kb_schema_missing(conn: psycopg.Connection[Any], n: Names) -> bool:
    return _schema_missing(conn, n.config.kb_schema)


def _mem_schema_missing(conn: psycopg.Connection[Any], n: Names) -> bool:
    return _schema_missing(conn, n.config.memory_schema)


def _marker(n: Names) -> sql.Literal:
    return sql.Literal(MARKER_PREFIX)


#: Every schema version in order. `osa-memory init` applies those above the database's version, each
#: in its own transaction (indexes on the team's tables are built CONCURRENTLY, just after it), then
#: records the version. Steps are idempotent, so a migration cut short is simply applied again.
#: A new migration goes at the end, with the next number; SCHEMA_VERSION follows it.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "pgvector, the knowledge-base tables (pgvector-haystack's chunk layout, governing rows), tokens",
        (
            # Each only when missing: a DBA may create the schemas and the extension beforehand, and the
            # owner then needs no CREATE right on the database (IF NOT EXISTS checks that right first).
            Step(lambda n: CREATE_EXTENSION, no_table, NO_TABLE_LOCK, when=_extension_missing),
            Step(lambda n: CREATE_SCHEMA.format(schema=n.kb), no_table, NO_TABLE_LOCK, when=_kb_schema_missing),
            Step(lambda n: CREATE_SCHEMA.format(schema=n.mem), no_table, NO_TABLE_LOCK, when=_mem_schema_missing),
            Step(
                lambda n: CREATE_CHUNK_TABLE.format(
                    schema=n.kb, table=n.chunk, dimension=sql.Literal(n.config.embedding_dimension)
                ),
                chunk_table,
                NEW_TABLE,
            ),
            Step(lambda n: CREATE_GOVERNING_TABLE.format(schema=n.kb, table=n.gov), gov_table, NEW_TABLE),
            Step(lambda n: CREATE_TOKENS_TABLE.format(schema=n.mem), mem_table("tokens"), NEW_TABLE),
            Step(lambda n: CREATE_VERSION_TABLE.format(schema=n.mem), mem_table("schema_version"), NEW_TABLE),
            Step(
                _index(CREATE_KEYWORD_INDEX, "keyword_index", "chunk"),
                chunk_table,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
            Step(
                _index(CREATE_CHUNK_DOCUMENT_INDEX, "document_id_idx", "chunk"),
                chunk_table,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
            Step(
                _index(CREATE_SCOPE_INDEX, "scope_idx", "gov"), gov_table, SHARE_UPDATE_EXCLUSIVE, in_transaction=False
            ),
        ),
    ),
    Migration(
        2,
        "the governed lifecycle: feedback, reads, audit, kill switches",
        (
            Step(lambda n: CREATE_FEEDBACK_TABLE.format(schema=n.mem), mem_table("feedback"), NEW_TABLE),
            Step(lambda n: CREATE_READS_TABLE.format(schema=n.mem), mem_table("reads"), NEW_TABLE),
            Step(lambda n: CREATE_AUDIT_TABLE.format(schema=n.mem), mem_table("audit"), NEW_TABLE),
            Step(lambda n: CREATE_AUDIT_INDEX.format(schema=n.mem), mem_table("audit"), "SHARE (our table)"),
            Step(lambda n: CREATE_SWITCHES_TABLE.format(schema=n.mem), mem_table("switches"), NEW_TABLE),
        ),
    ),
    Migration(
        3,
        "tokens may grant several assignments",
        (Step(lambda n: ADD_TOKEN_GRANTS.format(schema=n.mem), mem_table("tokens"), ACCESS_EXCLUSIVE),),
    ),
    Migration(
        4,
        "osa_fact_terms: each fact's lexical statistics (and, from version 7, its vector), written with it",
        (Step(lambda n: CREATE_TERMS_TABLE.format(schema=n.kb), terms_table, NEW_TABLE),),
    ),
    Migration(
        5,
        "governing rows keep their storing order (seq), numbering the existing rows",
        (Step(lambda n: ADD_SEQ.format(schema=n.kb, table=n.gov), gov_table, ACCESS_EXCLUSIVE),),
    ),
    Migration(
        6,
        "a fact's chunk row stays whole (vector kept inline: no TOAST lookups per fact)",
        (
            Step(
                lambda n: SET_CHUNK_STORAGE.format(schema=n.kb, table=n.chunk, target=sql.Literal(TOAST_TUPLE_TARGET)),
                chunk_table,
                ACCESS_EXCLUSIVE,
                when=_has_storage_to_set,
            ),
        ),
    ),
    Migration(
        7,
        "recall reads each fact's vector from osa_fact_terms; triggers drop that row when other tools change the chunk",
        (
            Step(lambda n: ADD_TERMS_RECALL_COLUMNS.format(schema=n.kb), terms_table, ACCESS_EXCLUSIVE),
            Step(
                lambda n: SET_TERMS_STORAGE.format(schema=n.kb),
                terms_table,
                ACCESS_EXCLUSIVE,
                when=_terms_storage_to_set,
            ),
            Step(
                lambda n: BACKFILL_TERMS.format(schema=n.kb, gov=n.gov, chunk=n.chunk),
                terms_table,
                ROW_EXCLUSIVE + "; reads the chunk and governing tables",
            ),
            Step(
                lambda n: CREATE_TERMS_INVALIDATE_FUNCTION.format(schema=n.kb, vector_schema=n.vector_schema),
                no_table,
                NO_TABLE_LOCK,
            ),
            Step(
                lambda n: DROP_TERMS_TRIGGER.format(schema=n.kb, table=n.chunk),
                chunk_table,
                ACCESS_EXCLUSIVE_IF_PRESENT,
            ),
            Step(
                lambda n: DROP_TERMS_TRUNCATE_TRIGGER.format(schema=n.kb, table=n.chunk),
                chunk_table,
                ACCESS_EXCLUSIVE_IF_PRESENT,
            ),
            Step(
                lambda n: CREATE_TERMS_TRIGGER.format(schema=n.kb, table=n.chunk, marker=_marker(n)),
                chunk_table,
                SHARE_ROW_EXCLUSIVE,
            ),
            Step(
                lambda n: CREATE_TERMS_TRUNCATE_TRIGGER.format(schema=n.kb, table=n.chunk),
                chunk_table,
                SHARE_ROW_EXCLUSIVE,
            ),
        ),
    ),
    Migration(
        8,
        "a fact's lexemes stored packed (bytea) instead of as a tsvector",
        (
            Step(lambda n: ADD_TERMS_PACKED.format(schema=n.kb), terms_table, ACCESS_EXCLUSIVE),
            Step(
                lambda n: BACKFILL_PACKED.format(schema=n.kb, lexeme_stats=lexeme_stats(sql.SQL("tsv"))),
                terms_table,
                ROW_EXCLUSIVE,
                when=_terms_has_tsv,
            ),
            Step(lambda n: DROP_TERMS_TSV.format(schema=n.kb), terms_table, ACCESS_EXCLUSIVE, when=_terms_has_tsv),
        ),
    ),
    Migration(
        9,
        "osa_fact_terms carries its fact's scope (org, assignment): row-level security checks it on its own",
        (
            Step(lambda n: ADD_TERMS_SCOPE.format(schema=n.kb), terms_table, ACCESS_EXCLUSIVE),
            Step(
                lambda n: BACKFILL_TERMS_SCOPE.format(schema=n.kb, gov=n.gov),
                terms_table,
                ROW_EXCLUSIVE + "; reads the governing table",
            ),
        ),
    ),
    Migration(
        10,
        "big scopes: osa_fact_terms carries storing order and scope-salted lexemes, with a scope, a GIN and a "
        "vector index (candidates for recall when a scope holds thousands of facts)",
        (
            Step(lambda n: ADD_TERMS_CANDIDATE_COLUMNS.format(schema=n.kb), terms_table, ACCESS_EXCLUSIVE),
            Step(
                lambda n: BACKFILL_TERMS_CANDIDATE_COLUMNS.format(
                    schema=n.kb,
                    gov=n.gov,
                    term_keys=term_keys_of(sql.SQL("t.terms"), sql.SQL("t.org_id"), sql.SQL("t.assignment_id")),
                ),
                terms_table,
                ROW_EXCLUSIVE + "; reads the governing table",
            ),
            _terms_index(CREATE_TERMS_SCOPE_INDEX),
            _terms_index(CREATE_TERMS_KEYS_INDEX),
            _terms_index(CREATE_TERMS_VECTOR_INDEX),
        ),
    ),
    Migration(
        11,
        "the review console: token roles (agent, reviewer, admin) and names, server-side console sessions; "
        "indexes for a scope's facts in storing order and for the review queue",
        (
            Step(lambda n: ADD_TOKEN_ROLES.format(schema=n.mem), mem_table("tokens"), ACCESS_EXCLUSIVE),
            Step(
                lambda n: CREATE_CONSOLE_SESSIONS_TABLE.format(schema=n.mem),
                mem_table("console_sessions"),
                NEW_TABLE,
            ),
            Step(
                lambda n: CREATE_CONSOLE_SESSIONS_INDEX.format(schema=n.mem),
                mem_table("console_sessions"),
                "SHARE (our table)",
            ),
            Step(
                _index(CREATE_SCOPE_CREATED_INDEX, "scope_created_idx", "gov"),
                gov_table,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
            Step(
                _index(CREATE_REVIEW_QUEUE_INDEX, "review_queue_idx", "gov"),
                gov_table,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
        ),
    ),
    Migration(
        12,
        "only big scopes' rows in the vector index of osa_fact_terms: a row written while its scope is small is "
        "left out of the HNSW and ranked exactly beside it (a cheaper hybrid store)",
        (
            Step(lambda n: ADD_TERMS_VECTOR_FLAG.format(schema=n.kb), terms_table, ACCESS_EXCLUSIVE),
            _terms_index(CREATE_TERMS_BIG_VECTOR_INDEX),
            _terms_index(CREATE_TERMS_UNINDEXED_INDEX),
            _terms_index(DROP_TERMS_VECTOR_INDEX),
        ),
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1].version

# Put back by `init` at the current version when missing (a chunk table recreated by other tools).
REPAIR_TRIGGERS = tuple(step for step in MIGRATIONS[6].steps[3:])
