"""Create or upgrade the tables memory needs, next to the team's knowledge base. Idempotent.

- The chunk table has exactly pgvector-haystack's layout, so ``PgvectorDocumentStore`` and its
  retrievers keep working on it; we only add a btree index on ``meta->>'document_id'``.
- The governing table holds one row per knowledge-base document (customer documents and facts):
  org, specialist, dataset, source, audience, status, metadata. Access is decided here.
- Tokens live in a private schema.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import DatabaseError, SchemaError
from haystack_osa_memory.markers import MARKER_PREFIX, MARKER_SUFFIX
from haystack_osa_memory.store.database import connection_kwargs, note_row_level_security
from haystack_osa_memory.store.facts import FACT_SOURCE, lexeme_stats, term_keys_of

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
READ_VERSION = sql.SQL("SELECT max(version) FROM {schema}.schema_version")
WRITE_VERSION = sql.SQL("INSERT INTO {schema}.schema_version (version, applied_at) VALUES (%s, now())")
EMBEDDING_DIMENSION = sql.SQL(
    """SELECT a.atttypmod FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s AND a.attname = 'embedding' AND NOT a.attisdropped"""
)
TABLE_EXISTS = sql.SQL("SELECT to_regclass(%s) IS NOT NULL")
ANALYZE = sql.SQL("ANALYZE {schema}.{table}")
# Serialise concurrent `init` runs: a session lock held for the whole run (the indexes built
# CONCURRENTLY run outside any transaction).
INIT_LOCK_KEY = sql.SQL("hashtext('osa-memory-init')")
INIT_SESSION_LOCK = sql.SQL("SELECT pg_advisory_lock({key})").format(key=INIT_LOCK_KEY)
INIT_SESSION_UNLOCK = sql.SQL("SELECT pg_advisory_unlock({key})").format(key=INIT_LOCK_KEY)
# `init` waits at most this long for a table lock, then fails: waiting longer would queue every query
# of the team's pipelines on that table behind ours (docs/operations.md).
SET_LOCK_TIMEOUT = sql.SQL("SET lock_timeout = {ms}")
DEFAULT_LOCK_TIMEOUT_MS = 5000
RLS_ENABLED = sql.SQL(
    """SELECT c.relrowsecurity AND c.relforcerowsecurity
       AND EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid AND p.polname = 'osa_memory_scope')
    FROM pg_class c WHERE c.oid = to_regclass(%s)"""
)

# Locks, as PostgreSQL documents them for each statement (a test checks them against pg_locks).
NO_TABLE_LOCK = "none on existing tables"
NEW_TABLE = "none (creates a table if missing)"
SHARE_UPDATE_EXCLUSIVE = "SHARE UPDATE EXCLUSIVE (reads and writes go on)"
SHARE_ROW_EXCLUSIVE = "SHARE ROW EXCLUSIVE (blocks writes, not reads)"
ROW_EXCLUSIVE = "ROW EXCLUSIVE (row locks on the rows it updates)"
ACCESS_EXCLUSIVE = "ACCESS EXCLUSIVE (blocks reads and writes while it runs)"
ACCESS_EXCLUSIVE_IF_PRESENT = "ACCESS EXCLUSIVE (brief) if it exists, else none"


@dataclass(frozen=True)
class Names:
    """The configured names as SQL identifiers, and their labels for reports."""

    kb: sql.Identifier
    mem: sql.Identifier
    chunk: sql.Identifier
    gov: sql.Identifier
    config: MemoryConfig
    vector_schema: sql.Identifier

    @classmethod
    def of(cls, config: MemoryConfig, vector_schema: str = "public") -> Names:
        return cls(
            kb=sql.Identifier(config.kb_schema),
            mem=sql.Identifier(config.memory_schema),
            chunk=sql.Identifier(config.chunk_table),
            gov=sql.Identifier(config.governing_table),
            config=config,
            vector_schema=sql.Identifier(vector_schema),
        )

    @property
    def chunk_label(self) -> str:
        return f"{self.config.kb_schema}.{self.config.chunk_table}"

    @property
    def gov_label(self) -> str:
        return f"{self.config.kb_schema}.{self.config.governing_table}"

    def team_tables(self) -> tuple[str, str]:
        """The tables a team's own pipelines use too (we add to them, never own them)."""
        return (self.chunk_label, self.gov_label)


Condition = Callable[[psycopg.Connection[Any], Names], bool]
Statement = sql.SQL | sql.Composed


@dataclass(frozen=True)
class Step:
    """One statement of a migration: what it runs, which table it touches and the lock it takes there.

    ``when``: the step runs only if this holds (read from the catalog just before). ``in_transaction``
    False: run on its own, outside the migration's transaction (``CREATE INDEX CONCURRENTLY``).
    """

    build: Callable[[Names], Statement]
    table: Callable[[Names], str | None]
    lock: str
    when: Condition | None = None
    in_transaction: bool = True


@dataclass(frozen=True)
class Migration:
    """One schema version: its number, what it is for, and its steps in order."""

    version: int
    description: str
    steps: tuple[Step, ...]


def _chunk(n: Names) -> str:
    return n.chunk_label


def _gov(n: Names) -> str:
    return n.gov_label


def _mem_table(name: str) -> Callable[[Names], str]:
    return lambda n: f"{n.config.memory_schema}.{name}"


def _terms(n: Names) -> str:
    return f"{n.config.kb_schema}.osa_fact_terms"


def _no_table(n: Names) -> None:
    return None


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


SCHEMA_EXISTS = sql.SQL("SELECT to_regnamespace(%s) IS NOT NULL")
EXTENSION_EXISTS = sql.SQL("SELECT count(*) > 0 FROM pg_extension WHERE extname = 'vector'")


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


ANALYZE_GOVERNING = Step(lambda n: ANALYZE.format(schema=n.kb, table=n.gov), _gov, SHARE_UPDATE_EXCLUSIVE)

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
            Step(lambda n: CREATE_EXTENSION, _no_table, NO_TABLE_LOCK, when=_extension_missing),
            Step(lambda n: CREATE_SCHEMA.format(schema=n.kb), _no_table, NO_TABLE_LOCK, when=_kb_schema_missing),
            Step(lambda n: CREATE_SCHEMA.format(schema=n.mem), _no_table, NO_TABLE_LOCK, when=_mem_schema_missing),
            Step(
                lambda n: CREATE_CHUNK_TABLE.format(
                    schema=n.kb, table=n.chunk, dimension=sql.Literal(n.config.embedding_dimension)
                ),
                _chunk,
                NEW_TABLE,
            ),
            Step(lambda n: CREATE_GOVERNING_TABLE.format(schema=n.kb, table=n.gov), _gov, NEW_TABLE),
            Step(lambda n: CREATE_TOKENS_TABLE.format(schema=n.mem), _mem_table("tokens"), NEW_TABLE),
            Step(lambda n: CREATE_VERSION_TABLE.format(schema=n.mem), _mem_table("schema_version"), NEW_TABLE),
            Step(
                _index(CREATE_KEYWORD_INDEX, "keyword_index", "chunk"),
                _chunk,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
            Step(
                _index(CREATE_CHUNK_DOCUMENT_INDEX, "document_id_idx", "chunk"),
                _chunk,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
            Step(_index(CREATE_SCOPE_INDEX, "scope_idx", "gov"), _gov, SHARE_UPDATE_EXCLUSIVE, in_transaction=False),
        ),
    ),
    Migration(
        2,
        "the governed lifecycle: feedback, reads, audit, kill switches",
        (
            Step(lambda n: CREATE_FEEDBACK_TABLE.format(schema=n.mem), _mem_table("feedback"), NEW_TABLE),
            Step(lambda n: CREATE_READS_TABLE.format(schema=n.mem), _mem_table("reads"), NEW_TABLE),
            Step(lambda n: CREATE_AUDIT_TABLE.format(schema=n.mem), _mem_table("audit"), NEW_TABLE),
            Step(lambda n: CREATE_AUDIT_INDEX.format(schema=n.mem), _mem_table("audit"), "SHARE (our table)"),
            Step(lambda n: CREATE_SWITCHES_TABLE.format(schema=n.mem), _mem_table("switches"), NEW_TABLE),
        ),
    ),
    Migration(
        3,
        "tokens may grant several assignments",
        (Step(lambda n: ADD_TOKEN_GRANTS.format(schema=n.mem), _mem_table("tokens"), ACCESS_EXCLUSIVE),),
    ),
    Migration(
        4,
        "osa_fact_terms: each fact's lexical statistics (and, from version 7, its vector), written with it",
        (Step(lambda n: CREATE_TERMS_TABLE.format(schema=n.kb), _terms, NEW_TABLE),),
    ),
    Migration(
        5,
        "governing rows keep their storing order (seq), numbering the existing rows",
        (Step(lambda n: ADD_SEQ.format(schema=n.kb, table=n.gov), _gov, ACCESS_EXCLUSIVE),),
    ),
    Migration(
        6,
        "a fact's chunk row stays whole (vector kept inline: no TOAST lookups per fact)",
        (
            Step(
                lambda n: SET_CHUNK_STORAGE.format(schema=n.kb, table=n.chunk, target=sql.Literal(TOAST_TUPLE_TARGET)),
                _chunk,
                ACCESS_EXCLUSIVE,
                when=_has_storage_to_set,
            ),
        ),
    ),
    Migration(
        7,
        "recall reads each fact's vector from osa_fact_terms; triggers drop that row when other tools change the chunk",
        (
            Step(lambda n: ADD_TERMS_RECALL_COLUMNS.format(schema=n.kb), _terms, ACCESS_EXCLUSIVE),
            Step(lambda n: SET_TERMS_STORAGE.format(schema=n.kb), _terms, ACCESS_EXCLUSIVE, when=_terms_storage_to_set),
            Step(
                lambda n: BACKFILL_TERMS.format(schema=n.kb, gov=n.gov, chunk=n.chunk),
                _terms,
                ROW_EXCLUSIVE + "; reads the chunk and governing tables",
            ),
            Step(
                lambda n: CREATE_TERMS_INVALIDATE_FUNCTION.format(schema=n.kb, vector_schema=n.vector_schema),
                _no_table,
                NO_TABLE_LOCK,
            ),
            Step(lambda n: DROP_TERMS_TRIGGER.format(schema=n.kb, table=n.chunk), _chunk, ACCESS_EXCLUSIVE_IF_PRESENT),
            Step(
                lambda n: DROP_TERMS_TRUNCATE_TRIGGER.format(schema=n.kb, table=n.chunk),
                _chunk,
                ACCESS_EXCLUSIVE_IF_PRESENT,
            ),
            Step(
                lambda n: CREATE_TERMS_TRIGGER.format(schema=n.kb, table=n.chunk, marker=_marker(n)),
                _chunk,
                SHARE_ROW_EXCLUSIVE,
            ),
            Step(
                lambda n: CREATE_TERMS_TRUNCATE_TRIGGER.format(schema=n.kb, table=n.chunk),
                _chunk,
                SHARE_ROW_EXCLUSIVE,
            ),
        ),
    ),
    Migration(
        8,
        "a fact's lexemes stored packed (bytea) instead of as a tsvector",
        (
            Step(lambda n: ADD_TERMS_PACKED.format(schema=n.kb), _terms, ACCESS_EXCLUSIVE),
            Step(
                lambda n: BACKFILL_PACKED.format(schema=n.kb, lexeme_stats=lexeme_stats(sql.SQL("tsv"))),
                _terms,
                ROW_EXCLUSIVE,
                when=_terms_has_tsv,
            ),
            Step(lambda n: DROP_TERMS_TSV.format(schema=n.kb), _terms, ACCESS_EXCLUSIVE, when=_terms_has_tsv),
        ),
    ),
    Migration(
        9,
        "osa_fact_terms carries its fact's scope (org, assignment): row-level security checks it on its own",
        (
            Step(lambda n: ADD_TERMS_SCOPE.format(schema=n.kb), _terms, ACCESS_EXCLUSIVE),
            Step(
                lambda n: BACKFILL_TERMS_SCOPE.format(schema=n.kb, gov=n.gov),
                _terms,
                ROW_EXCLUSIVE + "; reads the governing table",
            ),
        ),
    ),
    Migration(
        10,
        "big scopes: osa_fact_terms carries storing order and scope-salted lexemes, with a scope, a GIN and a "
        "vector index (candidates for recall when a scope holds thousands of facts)",
        (
            Step(lambda n: ADD_TERMS_CANDIDATE_COLUMNS.format(schema=n.kb), _terms, ACCESS_EXCLUSIVE),
            Step(
                lambda n: BACKFILL_TERMS_CANDIDATE_COLUMNS.format(
                    schema=n.kb,
                    gov=n.gov,
                    term_keys=term_keys_of(sql.SQL("t.terms"), sql.SQL("t.org_id"), sql.SQL("t.assignment_id")),
                ),
                _terms,
                ROW_EXCLUSIVE + "; reads the governing table",
            ),
            Step(
                lambda n: CREATE_TERMS_SCOPE_INDEX.format(schema=n.kb),
                _terms,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
            Step(
                lambda n: CREATE_TERMS_KEYS_INDEX.format(schema=n.kb),
                _terms,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
            Step(
                lambda n: CREATE_TERMS_VECTOR_INDEX.format(
                    schema=n.kb, dimension=sql.Literal(n.config.embedding_dimension)
                ),
                _terms,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
        ),
    ),
    Migration(
        11,
        "the review console: token roles (agent, reviewer, admin) and names, server-side console sessions; "
        "indexes for a scope's facts in storing order and for the review queue",
        (
            Step(lambda n: ADD_TOKEN_ROLES.format(schema=n.mem), _mem_table("tokens"), ACCESS_EXCLUSIVE),
            Step(
                lambda n: CREATE_CONSOLE_SESSIONS_TABLE.format(schema=n.mem),
                _mem_table("console_sessions"),
                NEW_TABLE,
            ),
            Step(
                lambda n: CREATE_CONSOLE_SESSIONS_INDEX.format(schema=n.mem),
                _mem_table("console_sessions"),
                "SHARE (our table)",
            ),
            Step(
                _index(CREATE_SCOPE_CREATED_INDEX, "scope_created_idx", "gov"),
                _gov,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
            Step(
                _index(CREATE_REVIEW_QUEUE_INDEX, "review_queue_idx", "gov"),
                _gov,
                SHARE_UPDATE_EXCLUSIVE,
                in_transaction=False,
            ),
        ),
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1].version

# Put back by `init` at the current version when missing (a chunk table recreated by other tools).
REPAIR_TRIGGERS = tuple(step for step in MIGRATIONS[6].steps[3:])

# -- row-level security (opt-in: `osa-memory init --row-level-security`) ---------------------------
# A fact row is visible only to a transaction whose scope settings (set by our code from the
# authenticated caller, `haystack_osa_memory.store.database`) name its org and assignment; every other row
# stays exactly as visible as before. A session that sets no scope (a team's pipeline, psql) reads
# no fact. FORCE: the tables' owner is held to the policies too (superusers and BYPASSRLS roles never are).
SCOPE_ORG = "osa_memory.org_id"
SCOPE_ASSIGNMENT = "osa_memory.assignment_id"
_SCOPE_ORG = sql.SQL("current_setting({}, true)").format(sql.Literal(SCOPE_ORG))
_SCOPE_ASSIGNMENT = sql.SQL("current_setting({}, true)").format(sql.Literal(SCOPE_ASSIGNMENT))
ENABLE_RLS = sql.SQL("ALTER TABLE {schema}.{table} ENABLE ROW LEVEL SECURITY")
FORCE_RLS = sql.SQL("ALTER TABLE {schema}.{table} FORCE ROW LEVEL SECURITY")
DROP_POLICY = sql.SQL("DROP POLICY IF EXISTS {policy} ON {schema}.{table}")
GOV_OTHERS_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_others ON {schema}.{table}
    USING (source IS DISTINCT FROM {source}) WITH CHECK (source IS DISTINCT FROM {source})"""
)
GOV_SCOPE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_scope ON {schema}.{table}
    USING (source = {source} AND org_id = {org} AND metadata->>'assignment_id' = {assignment})
    WITH CHECK (source = {source} AND org_id = {org} AND metadata->>'assignment_id' = {assignment})"""
)
# A chunk is a fact when its text starts with the scope marker; it is visible when that marker names the
# scope's assignment and its metadata the scope's org. Self-contained on purpose: a new row is checked
# (an upsert checks it against USING too) before its governing row, written in the same statement, is
# visible. osa_fact_terms carries the scope in its own columns (version 9) for the same reason.
CHUNK_OTHERS_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_others ON {schema}.{table}
    USING (NOT starts_with(coalesce(content, ''), {marker}))
    WITH CHECK (NOT starts_with(coalesce(content, ''), {marker}))"""
)
CHUNK_SCOPE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_scope ON {schema}.{table}
    USING (starts_with(content, {marker} || {assignment} || {suffix}) AND meta->>'org_id' = {org})
    WITH CHECK (starts_with(content, {marker} || {assignment} || {suffix}) AND meta->>'org_id' = {org})"""
)
TERMS_SCOPE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_scope ON {schema}.osa_fact_terms
    USING (org_id = {org} AND assignment_id = {assignment})
    WITH CHECK (org_id = {org} AND assignment_id = {assignment})"""
)


def _policy_values(n: Names) -> dict[str, sql.Composable]:
    return {
        "schema": n.kb,
        "gov": n.gov,
        "source": sql.Literal(FACT_SOURCE),
        "org": _SCOPE_ORG,
        "assignment": _SCOPE_ASSIGNMENT,
        "marker": sql.Literal(MARKER_PREFIX),
        "suffix": sql.Literal(MARKER_SUFFIX + "\n"),
    }


def _on_table(
    template: sql.SQL, table: Callable[[Names], sql.Identifier], **extra: sql.Composable
) -> Callable[[Names], Statement]:
    """A statement on one table, with the policy values (`_policy_values`) at hand."""

    def build(n: Names) -> Statement:
        return template.format(**{**_policy_values(n), "table": table(n), **extra})

    return build


def _gov_ident(n: Names) -> sql.Identifier:
    return n.gov


def _chunk_ident(n: Names) -> sql.Identifier:
    return n.chunk


def _terms_ident(n: Names) -> sql.Identifier:
    return sql.Identifier("osa_fact_terms")


_RLS_TABLES: tuple[
    tuple[Callable[[Names], sql.Identifier], Callable[[Names], str | None], tuple[sql.SQL, ...]], ...
] = (
    (_gov_ident, _gov, (GOV_OTHERS_POLICY, GOV_SCOPE_POLICY)),
    (_chunk_ident, _chunk, (CHUNK_OTHERS_POLICY, CHUNK_SCOPE_POLICY)),
    (_terms_ident, _terms, (TERMS_SCOPE_POLICY,)),
)


def _rls_steps() -> tuple[Step, ...]:
    steps: list[Step] = []
    for ident, label, policies in _RLS_TABLES:
        for policy in ("osa_memory_others", "osa_memory_scope"):
            steps.append(
                Step(_on_table(DROP_POLICY, ident, policy=sql.Identifier(policy)), label, ACCESS_EXCLUSIVE_IF_PRESENT)
            )
        steps += [Step(_on_table(template, ident), label, ACCESS_EXCLUSIVE) for template in policies]
        steps += [Step(_on_table(statement, ident), label, ACCESS_EXCLUSIVE) for statement in (ENABLE_RLS, FORCE_RLS)]
    return tuple(steps)


RLS_STEPS = _rls_steps()
DISABLE_RLS = sql.SQL("ALTER TABLE {schema}.{table} NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY")

# -- the runtime role (`osa-memory init --runtime-role NAME`): the rows `serve` needs, no DDL -------
GRANTS: tuple[tuple[sql.SQL, Callable[[Names], str | None]], ...] = (
    (sql.SQL("GRANT USAGE ON SCHEMA {kb} TO {role}"), _no_table),
    (sql.SQL("GRANT USAGE ON SCHEMA {mem} TO {role}"), _no_table),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE ON {kb}.{gov} TO {role}"), _gov),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {kb}.{chunk} TO {role}"), _chunk),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {kb}.osa_fact_terms TO {role}"), _terms),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {mem}.feedback, {mem}.reads TO {role}"), _no_table),
    (sql.SQL("GRANT SELECT, INSERT ON {mem}.audit TO {role}"), _mem_table("audit")),
    (sql.SQL("GRANT SELECT ON {mem}.tokens, {mem}.switches, {mem}.schema_version TO {role}"), _no_table),
    (sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {mem} TO {role}"), _no_table),
)


def _grant(statement: sql.SQL, role: str) -> Callable[[Names], Statement]:
    def build(n: Names) -> Statement:
        return statement.format(kb=n.kb, mem=n.mem, gov=n.gov, chunk=n.chunk, role=sql.Identifier(role))

    return build


def _grant_steps(role: str) -> tuple[Step, ...]:
    return tuple(Step(_grant(statement, role), label, NO_TABLE_LOCK) for statement, label in GRANTS)


# -- the console role (`osa-memory init --console-role NAME`): what the review console does, no more ---
# Review transitions and forget (status and metadata of governing rows; a forgotten fact's chunk, terms,
# votes and reads), kill switches, audit rows, token sign-in and revocation, its own sessions. Never
# INSERT on the fact tables (the console stores no fact) and never DDL.
CONSOLE_GRANTS: tuple[tuple[sql.SQL, Callable[[Names], str | None]], ...] = (
    (sql.SQL("GRANT USAGE ON SCHEMA {kb} TO {role}"), _no_table),
    (sql.SQL("GRANT USAGE ON SCHEMA {mem} TO {role}"), _no_table),
    (sql.SQL("GRANT SELECT, UPDATE ON {kb}.{gov} TO {role}"), _gov),
    (sql.SQL("GRANT SELECT, DELETE ON {kb}.{chunk} TO {role}"), _chunk),
    (sql.SQL("GRANT SELECT, DELETE ON {kb}.osa_fact_terms TO {role}"), _terms),
    (sql.SQL("GRANT SELECT, DELETE ON {mem}.feedback, {mem}.reads TO {role}"), _no_table),
    (sql.SQL("GRANT SELECT, INSERT ON {mem}.audit TO {role}"), _mem_table("audit")),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {mem}.switches TO {role}"), _no_table),
    (sql.SQL("GRANT SELECT, UPDATE (revoked_at) ON {mem}.tokens TO {role}"), _no_table),
    (sql.SQL("GRANT SELECT, INSERT, UPDATE ON {mem}.console_sessions TO {role}"), _no_table),
    (sql.SQL("GRANT SELECT ON {mem}.schema_version TO {role}"), _no_table),
    (sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {mem} TO {role}"), _no_table),
)
# With row-level security on, the console role sees the facts of the org its session names (the scope
# setting's org, `haystack_osa_memory.store.database.fact_scope`), any assignment, and no other org's.
CONSOLE_POLICY = "osa_memory_console"
GOV_CONSOLE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_console ON {schema}.{table} TO {role}
    USING (source = {source} AND org_id = {org}) WITH CHECK (source = {source} AND org_id = {org})"""
)
CHUNK_CONSOLE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_console ON {schema}.{table} TO {role}
    USING (starts_with(content, {marker}) AND meta->>'org_id' = {org})
    WITH CHECK (starts_with(content, {marker}) AND meta->>'org_id' = {org})"""
)
TERMS_CONSOLE_POLICY = sql.SQL(
    """CREATE POLICY osa_memory_console ON {schema}.osa_fact_terms TO {role}
    USING (org_id = {org}) WITH CHECK (org_id = {org})"""
)
_CONSOLE_POLICIES = (
    (_gov_ident, _gov, GOV_CONSOLE_POLICY),
    (_chunk_ident, _chunk, CHUNK_CONSOLE_POLICY),
    (_terms_ident, _terms, TERMS_CONSOLE_POLICY),
)


def _console_steps(role: str, *, policies: bool) -> tuple[Step, ...]:
    steps = [Step(_grant(statement, role), label, NO_TABLE_LOCK) for statement, label in CONSOLE_GRANTS]
    if policies:
        for ident, label, template in _CONSOLE_POLICIES:
            steps.append(
                Step(
                    _on_table(DROP_POLICY, ident, policy=sql.Identifier(CONSOLE_POLICY)),
                    label,
                    ACCESS_EXCLUSIVE_IF_PRESENT,
                )
            )
            steps.append(Step(_on_table(template, ident, role=sql.Identifier(role)), label, ACCESS_EXCLUSIVE))
    return tuple(steps)


@dataclass(frozen=True)
class PlannedStep:
    """One statement `init` runs (or would run, with ``--dry-run``)."""

    version: int | None
    purpose: str
    statement: str
    table: str | None
    team_table: bool
    lock: str
    conditional: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "purpose": self.purpose,
            "statement": self.statement,
            "table": self.table,
            "team_table": self.team_table,
            "lock": self.lock,
            "conditional": self.conditional,
        }


@dataclass
class InitReport:
    """What :func:`ensure_schema` did (or, as a dry run, would do)."""

    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    version_before: int | None = None
    version_after: int = SCHEMA_VERSION
    applied: list[int] = field(default_factory=list)
    steps: list[PlannedStep] = field(default_factory=list)
    row_level_security: bool = False
    runtime_role: str | None = None
    console_role: str | None = None
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "existing": self.existing,
            "version_before": self.version_before,
            "version_after": self.version_after,
            "applied": self.applied,
            "row_level_security": self.row_level_security,
            "runtime_role": self.runtime_role,
            "console_role": self.console_role,
            "dry_run": self.dry_run,
            "steps": [s.as_dict() for s in self.steps],
        }


@dataclass(frozen=True)
class SchemaState:
    """What :func:`check_schema` found: the version and whether facts are under row-level security."""

    version: int
    row_level_security: bool


def _exists(conn: psycopg.Connection[Any], schema: str, table: str) -> bool:
    row = conn.execute(TABLE_EXISTS, (f'"{schema}"."{table}"',)).fetchone()
    return bool(row and row[0])


def _tables(config: MemoryConfig) -> dict[str, tuple[str, str]]:
    return {
        f"{config.kb_schema}.{config.chunk_table}": (config.kb_schema, config.chunk_table),
        f"{config.kb_schema}.{config.governing_table}": (config.kb_schema, config.governing_table),
        f"{config.memory_schema}.tokens": (config.memory_schema, "tokens"),
        f"{config.memory_schema}.schema_version": (config.memory_schema, "schema_version"),
        f"{config.memory_schema}.feedback": (config.memory_schema, "feedback"),
        f"{config.memory_schema}.reads": (config.memory_schema, "reads"),
        f"{config.memory_schema}.audit": (config.memory_schema, "audit"),
        f"{config.memory_schema}.switches": (config.memory_schema, "switches"),
        f"{config.kb_schema}.osa_fact_terms": (config.kb_schema, "osa_fact_terms"),
        f"{config.memory_schema}.console_sessions": (config.memory_schema, "console_sessions"),
    }


def _read_version(conn: psycopg.Connection[Any], config: MemoryConfig) -> int | None:
    if not _exists(conn, config.memory_schema, "schema_version"):
        return None
    row = conn.execute(READ_VERSION.format(schema=sql.Identifier(config.memory_schema))).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def _check_dimension(conn: psycopg.Connection[Any], config: MemoryConfig) -> None:
    if not _exists(conn, config.kb_schema, config.chunk_table):
        return
    row = conn.execute(EMBEDDING_DIMENSION, (config.kb_schema, config.chunk_table)).fetchone()
    if row is not None and row[0] not in (-1, config.embedding_dimension):
        msg = (
            f"chunk table {config.kb_schema}.{config.chunk_table} stores {row[0]}-dimensional embeddings "
            f"but OSA_MEMORY_EMBEDDING_DIM is {config.embedding_dimension}; set it to {row[0]} "
            "or use another OSA_MEMORY_CHUNK_TABLE"
        )
        raise SchemaError(msg)


def _names(conn: psycopg.Connection[Any], config: MemoryConfig) -> Names:
    row = conn.execute(VECTOR_SCHEMA).fetchone()
    return Names.of(config, row[0] if row else "public")


def _triggers_present(conn: psycopg.Connection[Any], config: MemoryConfig) -> bool:
    row = conn.execute(TERMS_TRIGGERS_PRESENT, (f'"{config.kb_schema}"."{config.chunk_table}"',)).fetchone()
    return bool(row and row[0])


def _rls_on(conn: psycopg.Connection[Any], config: MemoryConfig) -> bool:
    row = conn.execute(RLS_ENABLED, (f'"{config.kb_schema}"."{config.governing_table}"',)).fetchone()
    return bool(row and row[0])


def _plan(
    conn: psycopg.Connection[Any], n: Names, version: int | None, purpose: str, steps: tuple[Step, ...]
) -> list[PlannedStep]:
    team = n.team_tables()
    planned = []
    for step in steps:
        table = step.table(n)
        planned.append(
            PlannedStep(
                version=version,
                purpose=purpose,
                statement=step.build(n).as_string(conn),
                table=table,
                team_table=table in team,
                lock=step.lock,
                conditional=step.when is not None,
            )
        )
    return planned


def ensure_schema(
    conn_str: str,
    config: MemoryConfig,
    *,
    dry_run: bool = False,
    row_level_security: bool | None = None,
    runtime_role: str | None = None,
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
    target_version: int = SCHEMA_VERSION,
    console_role: str | None = None,
) -> InitReport:
    """`osa-memory init`: apply the migrations above the database's version, in order, each in its own
    transaction, under an advisory lock (two `init` at once run one after the other).

    :param dry_run: Only report the statements it would run (``report.steps``): nothing is executed
        beyond catalog reads.
    :param row_level_security: True: turn on row-level security for facts (`RLS_STEPS`); False: turn it
        off; None: leave it as it is.
    :param runtime_role: Grant this existing role the row rights `serve` needs (`GRANTS`), nothing more.
    :param console_role: Grant this existing role what `osa-memory console` needs (`CONSOLE_GRANTS`), and,
        with row-level security on, the policies that show it one org's facts at a time.
    :param lock_timeout_ms: Give up on a table lock after this long rather than queue the team's
        queries behind us.
    :param target_version: Stop after this version (tests of upgrades from earlier versions).
    Raises:
        SchemaError: the chunk table's embedding dimension differs from the configured one, or the
            database's schema is newer than this package.
        DatabaseError: a statement failed (for example on ``lock_timeout``); what committed before stays.
    """
    report = InitReport(dry_run=dry_run, runtime_role=runtime_role, console_role=console_role)
    try:
        with psycopg.connect(conn_str, **connection_kwargs(config)) as conn:
            conn.execute(SET_LOCK_TIMEOUT.format(ms=sql.Literal(int(lock_timeout_ms))))
            if not dry_run:
                conn.execute(INIT_SESSION_LOCK)
            # Until the next check, sessions set their scope again (row-level security may now be on).
            note_row_level_security(conn_str, config.kb_schema, True)
            try:
                _run_init(conn, config, report, row_level_security, runtime_role, target_version, console_role)
            finally:
                if not dry_run and not conn.closed:
                    conn.execute(INIT_SESSION_UNLOCK)
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = f"init stopped: {type(e).__name__}: {first}"
        if isinstance(e, psycopg.errors.LockNotAvailable):
            msg += (
                f" (another transaction held a lock for more than {lock_timeout_ms} ms; nothing of this step "
                "was applied: retry when it is done, or raise --lock-timeout)"
            )
        raise DatabaseError(msg) from e
    return report


def _run_init(
    conn: psycopg.Connection[Any],
    config: MemoryConfig,
    report: InitReport,
    row_level_security: bool | None,
    runtime_role: str | None,
    target_version: int,
    console_role: str | None = None,
) -> None:
    dry_run = report.dry_run
    _check_dimension(conn, config)
    for label, (schema, table) in _tables(config).items():
        (report.existing if _exists(conn, schema, table) else report.created).append(label)
    version = _read_version(conn, config)
    report.version_before = version
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaError(_ahead(version))
    for migration in MIGRATIONS:
        if (version is not None and migration.version <= version) or migration.version > target_version:
            continue
        n = _names(conn, config)
        report.steps += _plan(conn, n, migration.version, migration.description, migration.steps)
        if dry_run:
            continue
        with conn.transaction():
            for step in migration.steps:
                if step.in_transaction and (step.when is None or step.when(conn, n)):
                    conn.execute(step.build(n))
        for step in migration.steps:
            if not step.in_transaction:
                conn.execute(step.build(n))
        with conn.transaction():
            conn.execute(WRITE_VERSION.format(schema=n.mem), (migration.version,))
        report.applied.append(migration.version)
    extra: list[tuple[str, tuple[Step, ...]]] = []
    if version is not None and version >= 7 and not _triggers_present(conn, config):
        extra.append(("put back the chunk-table triggers that keep osa_fact_terms true", REPAIR_TRIGGERS))
    if row_level_security is True and not (
        _exists(conn, config.kb_schema, config.governing_table) and _rls_on(conn, config)
    ):
        extra.append(("row-level security: facts visible only inside their scope", RLS_STEPS))
    if (
        row_level_security is False
        and _exists(conn, config.kb_schema, config.governing_table)
        and _rls_on(conn, config)
    ):
        extra.append(("row-level security off", _rls_off_steps()))
    if runtime_role is not None:
        extra.append((f"rights of the runtime role {runtime_role} (rows only, no DDL)", _grant_steps(runtime_role)))
    if console_role is not None:
        has_gov = _exists(conn, config.kb_schema, config.governing_table)
        rls_after = row_level_security is True or (row_level_security is None and has_gov and _rls_on(conn, config))
        extra.append(
            (
                f"rights of the console role {console_role} (review, switches, audit, tokens; no DDL)",
                _console_steps(console_role, policies=rls_after),
            )
        )
    n = _names(conn, config)
    for purpose, steps in extra:
        report.steps += _plan(conn, n, None, purpose, steps)
        if not dry_run:
            with conn.transaction():
                for step in steps:
                    conn.execute(step.build(n))
    # Statistics on the scope expression make the planner pick the btree (docs/traps.md); only after
    # a migration (or, in a dry run, when one is pending).
    if report.applied or (dry_run and any(s.version is not None for s in report.steps)):
        report.steps += _plan(conn, n, None, "statistics for the planner", (ANALYZE_GOVERNING,))
        if not dry_run:
            conn.execute(ANALYZE_GOVERNING.build(n))
    if not dry_run:
        report.version_after = max([version or 0, *report.applied])
        report.row_level_security = _exists(conn, config.kb_schema, config.governing_table) and _rls_on(conn, config)
    else:
        pending = any(step.version is not None for step in report.steps)
        report.version_after = SCHEMA_VERSION if pending else (version or 0)
        report.row_level_security = bool(version) and _rls_on(conn, config)


def _rls_off_steps() -> tuple[Step, ...]:
    return tuple(Step(_on_table(DISABLE_RLS, ident), label, ACCESS_EXCLUSIVE) for ident, label, _ in _RLS_TABLES)


def _ahead(version: int) -> str:
    return (
        f"the database's memory schema is version {version}, newer than this osa-memory ({SCHEMA_VERSION}): "
        "upgrade osa-memory before serving (an older server must not run on a newer schema)"
    )


INIT_HINT = "run `osa-memory init` as the tables' owner (`osa-memory init --dry-run` prints what it will do)"


def check_schema(conn_str: str, config: MemoryConfig) -> SchemaState:
    """Check, without changing anything, that the database's schema is the one this package expects.

    Plain catalog and version reads: no DDL, no ANALYZE, no lock beyond a normal read. What `serve`,
    `Memory` and every command but `init` run at start.

    Raises:
        SchemaError: not initialised, behind (run `osa-memory init`), ahead (upgrade osa-memory), the
            chunk table's dimension differs, or the triggers that keep osa_fact_terms true are missing.
        DatabaseError: the database could not be read.
    """
    try:
        with psycopg.connect(conn_str, **connection_kwargs(config)) as conn:
            version = _read_version(conn, config)
            if version is None:
                msg = f"no osa-memory schema in this database ({config.memory_schema}.schema_version): {INIT_HINT}"
                raise SchemaError(msg)
            if version > SCHEMA_VERSION:
                raise SchemaError(_ahead(version))
            if version < SCHEMA_VERSION:
                msg = f"the memory schema is version {version}, this osa-memory needs {SCHEMA_VERSION}: {INIT_HINT}"
                raise SchemaError(msg)
            _check_dimension(conn, config)
            if not _triggers_present(conn, config):
                msg = (
                    f"the triggers that keep osa_fact_terms true are missing on {config.kb_schema}."
                    f"{config.chunk_table} (was the table recreated?): {INIT_HINT}"
                )
                raise SchemaError(msg)
            state = SchemaState(version, _rls_on(conn, config))
            note_row_level_security(conn_str, config.kb_schema, state.row_level_security)
            return state
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        msg = f"could not read the memory schema: {type(e).__name__}: {first}"
        raise DatabaseError(msg) from e


def prepare_schema(conn_str: str, config: MemoryConfig) -> tuple[SchemaState, InitReport | None]:
    """What a server, `Memory` or a command runs at start: :func:`check_schema`, except on the embedded
    default database (no ``PG_CONN_STR``), which is ours alone: there a missing or older schema is
    brought up to date first (the report of that, else ``None``), so that a newcomer's first `Memory()`
    or `serve` just works."""
    report = None
    if config.pg_conn_str is None:
        try:
            return check_schema(conn_str, config), None
        except SchemaError:
            report = ensure_schema(conn_str, config)
    return check_schema(conn_str, config), report
