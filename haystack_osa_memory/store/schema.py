"""Create or upgrade the tables memory needs, next to the team's knowledge base. Idempotent.

- The chunk table has exactly pgvector-haystack's layout, so ``PgvectorDocumentStore`` and its
  retrievers keep working on it; we only add a btree index on ``meta->>'document_id'``.
- The governing table holds one row per knowledge-base document (customer documents and facts):
  org, specialist, dataset, source, audience, status, metadata. Access is decided here.
- Tokens live in a private schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.database import transaction
from haystack_osa_memory.errors import SchemaError
from haystack_osa_memory.markers import MARKER_PREFIX
from haystack_osa_memory.store.facts import lexeme_stats

SCHEMA_VERSION = 8

CREATE_EXTENSION = sql.SQL("CREATE EXTENSION IF NOT EXISTS vector")
CREATE_SCHEMA = sql.SQL("CREATE SCHEMA IF NOT EXISTS {schema}")

# Same columns as pgvector-haystack 8.x (CREATE_TABLE_STATEMENT of its document store).
CREATE_CHUNK_TABLE = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {schema}.{table} (
    id VARCHAR(128) PRIMARY KEY,
    embedding vector({dimension}),
    content TEXT,
    blob_data BYTEA,
    blob_meta JSONB,
    blob_mime_type VARCHAR(255),
    meta JSONB)"""
)
CREATE_KEYWORD_INDEX = sql.SQL(
    "CREATE INDEX IF NOT EXISTS {index} ON {schema}.{table} USING GIN (to_tsvector({language}, content))"
)
CREATE_CHUNK_DOCUMENT_INDEX = sql.SQL("CREATE INDEX IF NOT EXISTS {index} ON {schema}.{table} ((meta->>'document_id'))")
CREATE_GOVERNING_TABLE = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {schema}.{table} (
    id VARCHAR(128) PRIMARY KEY,
    org_id TEXT NOT NULL,
    specialist_id TEXT,
    dataset TEXT NOT NULL,
    source VARCHAR(64) NOT NULL,
    audience VARCHAR(32) NOT NULL DEFAULT 'customer',
    status VARCHAR(32) NOT NULL DEFAULT 'approved',
    content_hash CHAR(64),
    title TEXT,
    metadata JSONB NOT NULL DEFAULT '{{}}'::jsonb,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now())"""
)
CREATE_SCOPE_INDEX = sql.SQL(
    "CREATE INDEX IF NOT EXISTS {index} ON {schema}.{table} (org_id, (metadata->>'assignment_id'), status)"
)
CREATE_TOKENS_TABLE = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {schema}.tokens (
    token_id VARCHAR(32) PRIMARY KEY,
    secret_sha256 CHAR(64) NOT NULL,
    org_id TEXT NOT NULL,
    assignment_id TEXT NOT NULL,
    specialist_id TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ,
    revoked_at TIMESTAMPTZ)"""
)
CREATE_VERSION_TABLE = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {schema}.schema_version (version INTEGER NOT NULL, applied_at TIMESTAMPTZ NOT NULL)"
)
# Version 2: the governed lifecycle (feedback, reads, audit, kill switches).
CREATE_FEEDBACK_TABLE = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {schema}.feedback (
    document_id VARCHAR(128) NOT NULL,
    run_id TEXT NOT NULL,
    verdict VARCHAR(16) NOT NULL CHECK (verdict IN ('confirm', 'flag')),
    note TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (document_id, run_id))"""
)
CREATE_READS_TABLE = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {schema}.reads (
    document_id VARCHAR(128) NOT NULL,
    run_id TEXT NOT NULL,
    first_read_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (document_id, run_id))"""
)
CREATE_AUDIT_TABLE = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {schema}.audit (
    id BIGSERIAL PRIMARY KEY,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    actor TEXT NOT NULL,
    action VARCHAR(32) NOT NULL,
    org_id TEXT,
    assignment_id TEXT,
    document_id VARCHAR(128),
    details JSONB NOT NULL DEFAULT '{{}}'::jsonb)"""
)
CREATE_AUDIT_INDEX = sql.SQL("CREATE INDEX IF NOT EXISTS audit_scope_idx ON {schema}.audit (org_id, assignment_id, id)")
CREATE_SWITCHES_TABLE = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {schema}.switches (
    org_id TEXT NOT NULL,
    assignment_id TEXT NOT NULL,
    enabled BOOLEAN NOT NULL,
    reason TEXT,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, assignment_id))"""
)
# Version 3: tokens may grant several assignments.
ADD_TOKEN_GRANTS = sql.SQL("ALTER TABLE {schema}.tokens ADD COLUMN IF NOT EXISTS assignment_ids TEXT[]")
# Version 4: lexical statistics of facts precomputed at write time (in their version-8 form: the
# version-7 columns and the packed lexemes; earlier tables are brought there below).
CREATE_TERMS_TABLE = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {schema}.osa_fact_terms (
    document_id VARCHAR(128) PRIMARY KEY,
    language TEXT NOT NULL,
    content_md5 TEXT NOT NULL,
    dl DOUBLE PRECISION NOT NULL,
    content_hash CHAR(64),
    embedding vector,
    terms BYTEA)"""
)
# Version 5: facts keep their storing order (recall scores a fact with its neighbours). Adding an
# identity column numbers the existing rows.
ADD_SEQ = sql.SQL("ALTER TABLE {schema}.{table} ADD COLUMN IF NOT EXISTS seq BIGINT GENERATED BY DEFAULT AS IDENTITY")
# Version 6: a fact's chunk row stays whole. A 384-d vector (1.5 kB) next to a fact's text and
# metadata passes PostgreSQL's 2 kB TOAST threshold, so the vector (or the metadata and text) was
# moved out of line and every recall paid TOAST lookups per fact of the scope (docs/traps.md).
# toast_tuple_target 4080 keeps rows up to ~4 kB inline; STORAGE MAIN makes the vector the last value
# to leave the row when a longer one must shrink. Both are catalog changes (no rewrite) and affect
# rows written afterwards.
CHUNK_STORAGE = sql.SQL(
    """SELECT a.attstorage, coalesce(c.reloptions, '{{}}') FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s AND a.attname = 'embedding' AND NOT a.attisdropped"""
)
TOAST_TUPLE_TARGET = 4080
SET_CHUNK_STORAGE = sql.SQL(
    "ALTER TABLE {schema}.{table} ALTER COLUMN embedding SET STORAGE MAIN, SET (toast_tuple_target = {target})"
)
# Version 7: recall reads each fact's vector from osa_fact_terms (a copy written with the fact) and
# checks that row against the governing row's content hash, instead of joining the chunk table for
# every fact of the scope. Rows written before are filled (on the upgrade from an earlier version)
# from their chunks while the chunk still holds the text they were computed from; the others are
# recomputed at query time as before.
ADD_TERMS_RECALL_COLUMNS = sql.SQL(
    """ALTER TABLE {schema}.osa_fact_terms
    ADD COLUMN IF NOT EXISTS content_hash CHAR(64),
    ADD COLUMN IF NOT EXISTS embedding vector"""
)
TERMS_EMBEDDING_STORAGE = sql.SQL(
    """SELECT a.attstorage FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = 'osa_fact_terms' AND a.attname = 'embedding' AND NOT a.attisdropped"""
)
SET_TERMS_STORAGE = sql.SQL("ALTER TABLE {schema}.osa_fact_terms ALTER COLUMN embedding SET STORAGE MAIN")
BACKFILL_TERMS = sql.SQL(
    """UPDATE {schema}.osa_fact_terms t SET content_hash = g.content_hash, embedding = c.embedding
    FROM {schema}.{gov} g, {schema}.{chunk} c
    WHERE t.content_hash IS NULL AND g.id = t.document_id AND c.id = t.document_id
      AND c.meta->>'document_id' = g.id AND t.content_md5 = md5(c.content)"""
)
# Version 8: a fact's lexemes are stored packed (`haystack_osa_memory.store.facts.LEXEME_STATS`) instead
# of as a tsvector, so recall matches them against the query in numpy. On the upgrade, the packed form
# is computed from each row's tsvector and the tsvector column dropped.
ADD_TERMS_PACKED = sql.SQL("ALTER TABLE {schema}.osa_fact_terms ADD COLUMN IF NOT EXISTS terms BYTEA")
TERMS_HAS_TSV = sql.SQL(
    """SELECT count(*) > 0 FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = 'osa_fact_terms' AND a.attname = 'tsv' AND NOT a.attisdropped"""
)
BACKFILL_PACKED = sql.SQL(
    "UPDATE {schema}.osa_fact_terms SET terms = (SELECT ls.terms FROM ({lexeme_stats}) ls) WHERE terms IS NULL"
)
DROP_TERMS_TSV = sql.SQL("ALTER TABLE {schema}.osa_fact_terms DROP COLUMN tsv")
# A fact's row in osa_fact_terms is dropped when other tools change or delete its chunk (content or
# vector), so recall falls back to reading the chunk. Our own write changes both in one statement;
# row triggers fire at its end, when the two agree again, and leave the row alone. SECURITY DEFINER
# (with a fixed search_path): a role that may write the chunk table but not osa_fact_terms (a team's
# indexing job) can still update its chunks; the function only ever deletes rows of osa_fact_terms.
# The search_path holds pgvector's schema (its type and equality operator) and nothing writable.
CREATE_TERMS_INVALIDATE_FUNCTION = sql.SQL(
    """CREATE OR REPLACE FUNCTION {schema}.osa_fact_terms_invalidate() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, {vector_schema}, pg_temp AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        TRUNCATE {schema}.osa_fact_terms;
    ELSIF TG_OP = 'DELETE' THEN
        DELETE FROM {schema}.osa_fact_terms WHERE document_id = OLD.id;
    ELSE
        DELETE FROM {schema}.osa_fact_terms
        WHERE document_id = OLD.id
          AND (document_id <> NEW.id OR content_md5 IS DISTINCT FROM md5(NEW.content)
               OR embedding IS DISTINCT FROM NEW.embedding::vector);
    END IF;
    RETURN NULL;
END $$"""
)
VECTOR_SCHEMA = sql.SQL(
    "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
)
TERMS_TRIGGERS_PRESENT = sql.SQL(
    """SELECT count(*) = 2 FROM pg_trigger
    WHERE tgrelid = to_regclass(%s) AND tgname IN ('osa_fact_terms_invalidate', 'osa_fact_terms_truncate')"""
)
DROP_TERMS_TRIGGERS = sql.SQL(
    """DROP TRIGGER IF EXISTS osa_fact_terms_invalidate ON {schema}.{table};
    DROP TRIGGER IF EXISTS osa_fact_terms_truncate ON {schema}.{table}"""
)
# Only rows that were facts (their content starts with the scope marker) call the function: updating
# or deleting customer chunks costs a string prefix test per row, no function call.
CREATE_TERMS_TRIGGERS = sql.SQL(
    """CREATE TRIGGER osa_fact_terms_invalidate AFTER UPDATE OF id, content, embedding OR DELETE ON {schema}.{table}
        FOR EACH ROW WHEN (starts_with(OLD.content, {marker}))
        EXECUTE FUNCTION {schema}.osa_fact_terms_invalidate();
    CREATE TRIGGER osa_fact_terms_truncate AFTER TRUNCATE ON {schema}.{table}
        FOR EACH STATEMENT EXECUTE FUNCTION {schema}.osa_fact_terms_invalidate()"""
)
READ_VERSION = sql.SQL("SELECT max(version) FROM {schema}.schema_version")
WRITE_VERSION = sql.SQL("INSERT INTO {schema}.schema_version (version, applied_at) VALUES (%s, now())")
EMBEDDING_DIMENSION = sql.SQL(
    """SELECT a.atttypmod FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s AND a.attname = 'embedding' AND NOT a.attisdropped"""
)
TABLE_EXISTS = sql.SQL("SELECT to_regclass(%s) IS NOT NULL")
ANALYZE = sql.SQL("ANALYZE {schema}.{table}")
# Serialise concurrent `init` runs (two servers starting at once).
INIT_LOCK = sql.SQL("SELECT pg_advisory_xact_lock(hashtext('osa-memory-init'))")


@dataclass
class InitReport:
    """What :func:`ensure_schema` did."""

    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    version_before: int | None = None
    version_after: int = SCHEMA_VERSION

    def as_dict(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "existing": self.existing,
            "version_before": self.version_before,
            "version_after": self.version_after,
        }


def _exists(conn: psycopg.Connection[Any], schema: str, table: str) -> bool:
    row = conn.execute(TABLE_EXISTS, (f'"{schema}"."{table}"',)).fetchone()
    return bool(row and row[0])


def ensure_schema(conn_str: str, config: MemoryConfig) -> InitReport:
    """Create or upgrade every table and index memory needs; safe to run any number of times.

    Raises:
        SchemaError: the existing chunk table's embedding dimension differs from the configured one.
    """
    report = InitReport()
    kb = sql.Identifier(config.kb_schema)
    mem = sql.Identifier(config.memory_schema)
    chunk = sql.Identifier(config.chunk_table)
    gov = sql.Identifier(config.governing_table)
    with transaction(conn_str, config) as conn:
        conn.execute(INIT_LOCK)
        conn.execute(CREATE_EXTENSION)
        for schema in {config.kb_schema, config.memory_schema}:
            conn.execute(CREATE_SCHEMA.format(schema=sql.Identifier(schema)))
        names = {
            f"{config.kb_schema}.{config.chunk_table}": (config.kb_schema, config.chunk_table),
            f"{config.kb_schema}.{config.governing_table}": (config.kb_schema, config.governing_table),
            f"{config.memory_schema}.tokens": (config.memory_schema, "tokens"),
            f"{config.memory_schema}.schema_version": (config.memory_schema, "schema_version"),
            f"{config.memory_schema}.feedback": (config.memory_schema, "feedback"),
            f"{config.memory_schema}.reads": (config.memory_schema, "reads"),
            f"{config.memory_schema}.audit": (config.memory_schema, "audit"),
            f"{config.memory_schema}.switches": (config.memory_schema, "switches"),
            f"{config.kb_schema}.osa_fact_terms": (config.kb_schema, "osa_fact_terms"),
        }
        for label, (schema, table) in names.items():
            (report.existing if _exists(conn, schema, table) else report.created).append(label)

        if f"{config.kb_schema}.{config.chunk_table}" in report.existing:
            row = conn.execute(EMBEDDING_DIMENSION, (config.kb_schema, config.chunk_table)).fetchone()
            if row is not None and row[0] not in (-1, config.embedding_dimension):
                msg = (
                    f"chunk table {config.kb_schema}.{config.chunk_table} stores {row[0]}-dimensional embeddings "
                    f"but OSA_MEMORY_EMBEDDING_DIM is {config.embedding_dimension}; set it to {row[0]} "
                    "or use another OSA_MEMORY_CHUNK_TABLE"
                )
                raise SchemaError(msg)

        conn.execute(
            CREATE_CHUNK_TABLE.format(schema=kb, table=chunk, dimension=sql.Literal(config.embedding_dimension))
        )
        conn.execute(
            CREATE_KEYWORD_INDEX.format(
                index=sql.Identifier(f"{config.chunk_table}_keyword_index"),
                schema=kb,
                table=chunk,
                language=sql.Literal(config.language),
            )
        )
        conn.execute(
            CREATE_CHUNK_DOCUMENT_INDEX.format(
                index=sql.Identifier(f"{config.chunk_table}_document_id_idx"), schema=kb, table=chunk
            )
        )
        conn.execute(CREATE_GOVERNING_TABLE.format(schema=kb, table=gov))
        conn.execute(
            CREATE_SCOPE_INDEX.format(index=sql.Identifier(f"{config.governing_table}_scope_idx"), schema=kb, table=gov)
        )
        conn.execute(CREATE_TOKENS_TABLE.format(schema=mem))
        conn.execute(CREATE_VERSION_TABLE.format(schema=mem))
        for statement in (
            CREATE_FEEDBACK_TABLE,
            CREATE_READS_TABLE,
            CREATE_AUDIT_TABLE,
            CREATE_AUDIT_INDEX,
            CREATE_SWITCHES_TABLE,
            ADD_TOKEN_GRANTS,
        ):
            conn.execute(statement.format(schema=mem))
        conn.execute(CREATE_TERMS_TABLE.format(schema=kb))
        conn.execute(ADD_TERMS_RECALL_COLUMNS.format(schema=kb))
        row = conn.execute(TERMS_EMBEDDING_STORAGE, (config.kb_schema,)).fetchone()
        if row is not None and row[0] != "m":
            conn.execute(SET_TERMS_STORAGE.format(schema=kb))
        row = conn.execute(READ_VERSION.format(schema=mem)).fetchone()
        report.version_before = row[0] if row else None
        upgrading = report.version_before != SCHEMA_VERSION
        if report.version_before is not None and report.version_before < 7:
            conn.execute(BACKFILL_TERMS.format(schema=kb, gov=gov, chunk=chunk))
        conn.execute(ADD_TERMS_PACKED.format(schema=kb))
        row = conn.execute(TERMS_HAS_TSV, (config.kb_schema,)).fetchone()
        if row is not None and row[0]:
            conn.execute(BACKFILL_PACKED.format(schema=kb, lexeme_stats=lexeme_stats(sql.SQL("tsv"))))
            conn.execute(DROP_TERMS_TSV.format(schema=kb))
        # The triggers are (re)created on an upgrade or when missing (a recreated chunk table), not at
        # every start: CREATE TRIGGER locks the team's chunk table against writes while it runs.
        row = conn.execute(TERMS_TRIGGERS_PRESENT, (f'"{config.kb_schema}"."{config.chunk_table}"',)).fetchone()
        if upgrading or not (row and row[0]):
            row = conn.execute(VECTOR_SCHEMA).fetchone()
            vector_schema = sql.Identifier(row[0] if row else "public")
            conn.execute(CREATE_TERMS_INVALIDATE_FUNCTION.format(schema=kb, vector_schema=vector_schema))
            conn.execute(DROP_TERMS_TRIGGERS.format(schema=kb, table=chunk))
            conn.execute(CREATE_TERMS_TRIGGERS.format(schema=kb, table=chunk, marker=sql.Literal(MARKER_PREFIX)))
        conn.execute(ADD_SEQ.format(schema=kb, table=gov))
        row = conn.execute(CHUNK_STORAGE, (config.kb_schema, config.chunk_table)).fetchone()
        if row is not None and (row[0] != "m" or f"toast_tuple_target={TOAST_TUPLE_TARGET}" not in row[1]):
            conn.execute(SET_CHUNK_STORAGE.format(schema=kb, table=chunk, target=sql.Literal(TOAST_TUPLE_TARGET)))
        if upgrading:
            conn.execute(WRITE_VERSION.format(schema=mem), (SCHEMA_VERSION,))
        # Statistics on the scope expression make the planner pick the btree (docs/traps.md).
        conn.execute(ANALYZE.format(schema=kb, table=gov))
    return report
