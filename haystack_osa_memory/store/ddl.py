"""The statements of the migrations (`haystack_osa_memory.store.migrations`), by the version that brought
them: tables, columns, indexes and triggers, and the catalog reads that decide whether a conditional step runs.

- The chunk table has exactly pgvector-haystack's layout, so ``PgvectorDocumentStore`` and its
  retrievers keep working on it; we only add a btree index on ``meta->>'document_id'``.
- The governing table holds one row per knowledge-base document (customer documents and facts):
  org, specialist, dataset, source, audience, status, metadata. Access is decided here.
- Tokens live in a private schema.
"""

from __future__ import annotations

from psycopg import sql

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
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {schema}.{table} USING GIN (to_tsvector({language}, content))"
)
CREATE_CHUNK_DOCUMENT_INDEX = sql.SQL(
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {schema}.{table} ((meta->>'document_id'))"
)
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
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {schema}.{table} (org_id, (metadata->>'assignment_id'), status)"
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
# Version 9: the fact's scope on its recall row, written with it.
ADD_TERMS_SCOPE = sql.SQL(
    """ALTER TABLE {schema}.osa_fact_terms ADD COLUMN IF NOT EXISTS org_id TEXT,
    ADD COLUMN IF NOT EXISTS assignment_id TEXT"""
)
BACKFILL_TERMS_SCOPE = sql.SQL(
    """UPDATE {schema}.osa_fact_terms t SET org_id = g.org_id, assignment_id = g.metadata->>'assignment_id'
    FROM {schema}.{gov} g WHERE g.id = t.document_id AND t.org_id IS NULL"""
)
# Version 10: candidates for recall in big scopes come from indexes that carry the scope
# (`haystack_osa_memory.store.facts`, BIG_SCOPE_*): the fact's storing order (a copy of its governing
# row's seq, for the neighbours of the context window) and its lexemes salted with its scope
# (`TERM_KEY`), so that a GIN posting list holds one scope's facts only. Rows written before are filled.
ADD_TERMS_CANDIDATE_COLUMNS = sql.SQL(
    """ALTER TABLE {schema}.osa_fact_terms ADD COLUMN IF NOT EXISTS seq BIGINT,
    ADD COLUMN IF NOT EXISTS term_keys BIGINT[]"""
)
BACKFILL_TERMS_CANDIDATE_COLUMNS = sql.SQL(
    """UPDATE {schema}.osa_fact_terms t SET seq = g.seq, term_keys = ({term_keys})
    FROM {schema}.{gov} g WHERE g.id = t.document_id AND (t.seq IS NULL OR t.term_keys IS NULL)"""
)
CREATE_TERMS_SCOPE_INDEX = sql.SQL(
    """CREATE INDEX CONCURRENTLY IF NOT EXISTS osa_fact_terms_scope_seq_idx
    ON {schema}.osa_fact_terms (org_id, assignment_id, seq) INCLUDE (dl)"""
)
CREATE_TERMS_KEYS_INDEX = sql.SQL(
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS osa_fact_terms_keys_idx ON {schema}.osa_fact_terms USING gin (term_keys)"
)
# The vector column is untyped (`vector`), so the index is on the cast to the configured dimension;
# recall orders by the same expression.
CREATE_TERMS_VECTOR_INDEX = sql.SQL(
    """CREATE INDEX CONCURRENTLY IF NOT EXISTS osa_fact_terms_embedding_idx ON {schema}.osa_fact_terms
    USING hnsw ((embedding::vector({dimension})) vector_cosine_ops)"""
)
# Version 12: only big scopes' rows in the vector index. The HNSW index of osa_fact_terms serves recall in scopes
# past `big_scope.EXACT_SCOPE_MAX` facts that the process cannot hold in memory, yet every hybrid write paid
# its insert (most of a hybrid store's PostgreSQL time beyond a lexical one's, benchmarks/README.md). A row
# written while its scope holds fewer than `fact_writing.VECTOR_INDEX_FROM` recall rows is left out
# (``vector_indexed`` false) and found through a small index of such rows instead, ranked exactly beside the
# HNSW's candidates (`big_scope.BIG_SCOPE_VECTOR`). Rows written before, and rows other tools insert, stay in.
ADD_TERMS_VECTOR_FLAG = sql.SQL(
    "ALTER TABLE {schema}.osa_fact_terms ADD COLUMN IF NOT EXISTS vector_indexed BOOLEAN NOT NULL DEFAULT true"
)
CREATE_TERMS_BIG_VECTOR_INDEX = sql.SQL(
    """CREATE INDEX CONCURRENTLY IF NOT EXISTS osa_fact_terms_vector_big_idx ON {schema}.osa_fact_terms
    USING hnsw ((embedding::vector({dimension})) vector_cosine_ops) WHERE vector_indexed"""
)
CREATE_TERMS_UNINDEXED_INDEX = sql.SQL(
    """CREATE INDEX CONCURRENTLY IF NOT EXISTS osa_fact_terms_unindexed_idx ON {schema}.osa_fact_terms
    (org_id, assignment_id) WHERE NOT vector_indexed"""
)
DROP_TERMS_VECTOR_INDEX = sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {schema}.osa_fact_terms_embedding_idx")
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
DROP_TERMS_TRIGGER = sql.SQL("DROP TRIGGER IF EXISTS osa_fact_terms_invalidate ON {schema}.{table}")
DROP_TERMS_TRUNCATE_TRIGGER = sql.SQL("DROP TRIGGER IF EXISTS osa_fact_terms_truncate ON {schema}.{table}")
# Only rows that were facts (their content starts with the scope marker) call the function: updating
# or deleting customer chunks costs a string prefix test per row, no function call.
CREATE_TERMS_TRIGGER = sql.SQL(
    """CREATE TRIGGER osa_fact_terms_invalidate AFTER UPDATE OF id, content, embedding OR DELETE ON {schema}.{table}
        FOR EACH ROW WHEN (starts_with(OLD.content, {marker}))
        EXECUTE FUNCTION {schema}.osa_fact_terms_invalidate()"""
)
CREATE_TERMS_TRUNCATE_TRIGGER = sql.SQL(
    """CREATE TRIGGER osa_fact_terms_truncate AFTER TRUNCATE ON {schema}.{table}
        FOR EACH STATEMENT EXECUTE FUNCTION {schema}.osa_fact_terms_invalidate()"""
)
# Version 11: the review console. Tokens carry a role (`agent`, the default, acts over MCP; `reviewer` and
# `admin` sign in to the console, for one org, with no assignment) and the person's name; console
# sessions are server-side rows keyed by a sha256 of the cookie's session id.
ADD_TOKEN_ROLES = sql.SQL(
    """ALTER TABLE {schema}.tokens ADD COLUMN IF NOT EXISTS role VARCHAR(16) NOT NULL DEFAULT 'agent',
    ADD COLUMN IF NOT EXISTS display_name TEXT, ALTER COLUMN assignment_id DROP NOT NULL"""
)
CREATE_CONSOLE_SESSIONS_TABLE = sql.SQL(
    """CREATE TABLE IF NOT EXISTS {schema}.console_sessions (
    session_sha256 CHAR(64) PRIMARY KEY,
    token_id VARCHAR(32) NOT NULL,
    org_id TEXT NOT NULL,
    role VARCHAR(16) NOT NULL,
    display_name TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL,
    ended_at TIMESTAMPTZ)"""
)
# A scope's facts in storing order (`kb_memory_list`, the console's assignment browser) and the org's
# review queue (proposed and flagged facts, oldest first) read an index in order instead of sorting
# every row of the scope or org.
CREATE_SCOPE_CREATED_INDEX = sql.SQL(
    """CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {schema}.{table}
    (org_id, (metadata->>'assignment_id'), created_at, id)"""
)
CREATE_REVIEW_QUEUE_INDEX = sql.SQL(
    """CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {schema}.{table} (org_id, created_at, id)
    WHERE status IN ('proposed', 'flagged')"""
)
CREATE_CONSOLE_SESSIONS_INDEX = sql.SQL(
    "CREATE INDEX IF NOT EXISTS console_sessions_token_idx ON {schema}.console_sessions (token_id)"
)
# Version 1 creates the schemas and the extension only when missing (a DBA may have made them).
SCHEMA_EXISTS = sql.SQL("SELECT to_regnamespace(%s) IS NOT NULL")
EXTENSION_EXISTS = sql.SQL("SELECT count(*) > 0 FROM pg_extension WHERE extname = 'vector'")
