"""Every statement memory sends names the org, so a knowledge base distributed by org (Citus, see
docs/scaling.md) sends it to one shard; the statements that cannot, or do not yet, are listed here
with the reason.

Native PostgreSQL partitioning stands in for Citus: a twin of the knowledge base whose governing
table, chunk table, `osa_fact_terms` and audit are hash-partitioned by org (4 partitions; the chunk
table gets the `org_id` column it needs for that, filled from its `meta->>'org_id'`), and whose
feedback and reads are hash-partitioned by document id (they carry no org). Tokens, switches and the
schema version stay whole, as they do on the Citus coordinator. Memory runs its real operations for
two orgs whose rows land in different partitions, and every statement it sends is recorded (psycopg's
`Cursor.execute` / `executemany` are wrapped, so new statements are covered without a list). Each
recorded statement is then planned on the twin with its own parameters (`EXPLAIN`, parameters bound
as at run time): the plan must read at most one partition of each partitioned table, and the org's
own partition when the statement carries an org. PostgreSQL drops partitions at plan time from the
same equalities on the partition key that Citus's router planner needs to send a statement to a
single shard; a statement that writes a partitioned table is also run once on the twin (rolled back),
so a write that leaves the org out fails on its NOT NULL key.

Memory runs on its own schema, not on the twin: its upserts say `ON CONFLICT (id)`, and a table
partitioned (or distributed) by org can have no unique index without the org, so they do not even
plan there (`PENDING`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import psycopg
import pytest
from haystack.components.embedders import MockDocumentEmbedder, MockTextEmbedder
from psycopg import sql
from psycopg.types.json import Jsonb

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.errors import AuthenticationError, MemoryOffError, SupersessionError
from haystack_osa_memory.reflect import repair_observations
from haystack_osa_memory.store import big_scope
from haystack_osa_memory.store.database import close_pools
from haystack_osa_memory.store.facts import count_facts
from haystack_osa_memory.store.lifecycle import Scope
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.transfer import ImportItem
from tests.conftest import drop_schema, new_schema_config

pytestmark = pytest.mark.integration

PARTITIONS = 4
#: Two orgs are taken from these, the first two whose rows land in different partitions.
ORG_CANDIDATES = ("acme", "globex", "initech", "umbrella", "hooli", "vandelay", "wonka", "stark")
ASSIGNMENT = "asg-1"


@dataclass(frozen=True)
class Listed:
    """A statement that reads more than one partition of ``tables`` (or does not plan on the twin),
    recognised by ``marks`` (text it contains), and why. ``fix`` None: so by design; otherwise the
    change that lets it name the org. ``fails_with``: it does not plan on the twin, with this error."""

    name: str
    marks: tuple[str, ...]
    tables: frozenset[str]
    reason: str
    fix: str | None = None
    fails_with: str | None = None


def _listed(name: str, marks: tuple[str, ...], tables: set[str], reason: str, **extra: str) -> Listed:
    return Listed(name, marks, frozenset(tables), reason, **extra)


_CHUNK_ORG_FIX = (
    "the chunk table gains an org_id column (a migration in store/schema.py; the writer fills it), and "
    "this statement joins the chunk by it: `... c ON c.meta->>'document_id' = g.id AND c.org_id = g.org_id`"
)

#: By design: the org is not known yet (an id named by an operator), the statement is meant to span
#: orgs (an operator's listing, the nightly reflect), or it is the team's own. Citus runs these on
#: every shard. Tokens and switches are not partitioned (docs/scaling.md): they need no entry.
BY_DESIGN: tuple[Listed, ...] = (
    _listed(
        "FIND_FOR_REVIEW",
        ("SELECT org_id FROM", "WHERE id = %s AND source = %s"),
        {"governing"},
        "`osa-memory review accept ID`: an operator names a fact by id alone, so its org is read first "
        "(every shard, one row); the row is then locked by id and org on one shard",
    ),
    _listed(
        "FIND_FACT",
        ("SELECT org_id, metadata->>'assignment_id' FROM", "WHERE id = %s AND source = %s AND status <> 'retired'"),
        {"governing"},
        "`osa-memory history ID`: an operator names a fact by id alone, so its scope is read first (every "
        "shard, one row); the chain is then read in that org",
    ),
    _listed(
        "REVIEW_LIST across orgs",
        ("g.status IN ('proposed', 'flagged')",),
        {"governing"},
        "`osa-memory review list` without --org lists every org's proposals (every shard)",
    ),
    _listed(
        "AUDIT_ROWS across orgs",
        ("FROM", ".audit", "ORDER BY id LIMIT"),
        {"audit"},
        "`osa-memory audit` without --org reads every org's audit (every shard, merged by id)",
    ),
    _listed(
        "REFLECT_SCOPES",
        ("SELECT DISTINCT org_id, metadata->>'assignment_id'",),
        {"governing"},
        "`osa-memory reflect --all` (nightly) finds the scopes of every org (every shard)",
    ),
    _listed(
        "REPAIR_OBSERVATIONS",
        ("g.metadata->>'kind' = 'observation' AND g.metadata ? 'evidence'",),
        {"governing", "chunk"},
        "the repair of observations (an operator's command) goes over every org's observations (every shard)",
    ),
    _listed(
        "COUNT_FACTS",
        ("AS governing_rows",),
        {"governing", "chunk"},
        "`osa-memory status` counts the whole knowledge base (every shard)",
    ),
    _listed(
        "team keyword search",
        ("ts_rank_cd",),
        {"chunk"},
        "the team's own `PgvectorKeywordRetriever` (customer search): its query has no org, and its "
        "filters compare `meta->>'...'`, never a column, so no filter of it can name the shard (every "
        "shard, top k merged on the coordinator)",
    ),
)

#: Not yet: each needs the change in ``fix``.
PENDING: tuple[Listed, ...] = (
    _listed(
        "WRITE_FACT",
        ("WITH g AS (INSERT INTO", "INSERT INTO", "osa_fact_terms"),
        set(),
        "its upserts name `ON CONFLICT (id)` / `(document_id)`, but a table partitioned or distributed by org "
        "has unique indexes only with the org in them, so the statement does not plan",
        fix="store/facts.py WRITE_FACT: `ON CONFLICT (org_id, id)` on the governing and chunk tables and "
        "`(org_id, document_id)` on osa_fact_terms (needs unique indexes on those in store/schema.py); the chunk "
        "INSERT fills `org_id`; `updated_at = EXCLUDED.updated_at` instead of `now()` in DO UPDATE SET",
        fails_with="no unique or exclusion constraint matching the ON CONFLICT specification",
    ),
    _listed(
        "SCOPE_ROWS",
        ("WITH s AS MATERIALIZED",),
        {"chunk"},
        "recall's scoped statement reads the chunk of a fact without a recall row (written by other tools) "
        "by `meta->>'document_id'`",
        fix="store/facts.py SCOPE_ROWS: once the chunk table has it, `AND c.org_id = %(org_id)s` in the chunk lateral",
    ),
    _listed(
        "SCOPE_FACTS",
        ("FROM unnest(%(document_ids)s::text[]",),
        {"chunk"},
        "recall's text fetch joins the chunk by id",
        fix="store/facts.py SCOPE_FACTS: `AND c.org_id = %(org_id)s` once the chunk table has it",
    ),
    _listed(
        "MEMO_PRINT",
        ("SELECT q.*, p.*", "AS version"),
        {"chunk"},
        "a kept scope's print reads its facts' chunks by id (their versions: a text rewritten in place is seen)",
        fix="store/scope_memo.py _CHUNKS: `AND c.org_id = %(org_id)s` once the chunk table has it",
    ),
    _listed(
        "MEMO_ROWS",
        ("vector_send(r.embedding)", "AS usable"),
        {"chunk"},
        "a small scope's rows are read with their facts' chunks, by id",
        fix="store/scope_memo.py _CHUNKS: `AND c.org_id = %(org_id)s` once the chunk table has it",
    ),
    _listed(
        "MEMO_SINCE",
        ("vector_send(t.embedding)", "AS usable", "%(since)s"),
        {"chunk"},
        "the facts a kept scope catches up with are read with their chunks, by id",
        fix="store/scope_memo.py MEMO_SINCE: `AND k.org_id = %(org_id)s` once the chunk table has it",
    ),
    _listed("SELECT_FACT", ("g.specialist_id", "LEFT JOIN"), {"chunk"}, "read joins the chunk", fix=_CHUNK_ORG_FIX),
    _listed(
        "LIST_FACTS", ("ORDER BY g.created_at, g.id LIMIT",), {"chunk"}, "list joins the chunk", fix=_CHUNK_ORG_FIX
    ),
    _listed(
        "SCOPE_CONTENTS",
        ("SELECT g.id, c.content FROM",),
        {"chunk"},
        "propose's duplicate check joins the chunk",
        fix=_CHUNK_ORG_FIX,
    ),
    _listed(
        "REFLECT_CANDIDATES",
        ("c.embedding::text",),
        {"chunk"},
        "reflect joins the chunk",
        fix=_CHUNK_ORG_FIX,
    ),
    _listed(
        "EXPORT_ROWS",
        ("'approved', 'proposed', 'flagged', 'rejected'",),
        {"chunk"},
        "export joins the chunk",
        fix=_CHUNK_ORG_FIX,
    ),
    _listed(
        "INHERIT_TERMS",
        ("UPDATE", "osa_fact_terms t SET terms = ls.terms"),
        {"chunk"},
        "a successor's recall row takes its predecessors' words: it reads their chunks by id",
        fix="store/facts.py INHERIT_TERMS: `AND c.org_id = %(org_id)s` / `AND p.org_id = %(org_id)s` once the "
        "chunk table has it",
    ),
    _listed(
        "CHAIN_ROWS",
        ("g.id = ANY(%(ids)s)", "c.content"),
        {"chunk"},
        "a fact's history (read, `osa-memory history`) joins each version's chunk",
        fix=_CHUNK_ORG_FIX,
    ),
    _listed(
        "REVIEW_LIST chunk",
        ("g.status IN ('proposed', 'flagged')",),
        {"chunk"},
        "the review listing joins the chunk",
        fix=_CHUNK_ORG_FIX,
    ),
    _listed(
        "DELETE_CHUNKS",
        ("DELETE FROM", "WHERE meta->>'document_id' = %s"),
        {"chunk"},
        "forget deletes the chunk by `meta->>'document_id'`",
        fix="once the chunk table has org_id, store/lifecycle.py DELETE_CHUNKS adds `AND org_id = %s`",
    ),
)

LISTED: tuple[Listed, ...] = BY_DESIGN + PENDING


# -- recording --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sent:
    """One statement as memory sent it: its text and its parameters."""

    text: str
    params: Any

    @property
    def flat(self) -> str:
        return " ".join(self.text.split())


class Recorder:
    """Every statement sent through a psycopg cursor while ``active``."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.active = False

    def add(self, cursor: psycopg.Cursor[Any], query: Any, params: Any) -> None:
        if not self.active:
            return
        if isinstance(query, sql.Composable):
            text = query.as_string(cursor)
        elif isinstance(query, bytes | bytearray | memoryview):
            text = bytes(query).decode()
        else:
            text = str(query)
        if isinstance(params, dict):
            params = dict(params)
        elif params is not None:
            params = tuple(params)
        self.sent.append(Sent(text, params))


@contextmanager
def recording(recorder: Recorder) -> Iterator[None]:
    """Wrap psycopg's cursor, under every connection and pool: nothing memory sends goes around it."""
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def recorded_execute(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kwargs: Any) -> Any:
        recorder.add(self, query, params)
        return execute(self, query, params, **kwargs)

    def recorded_executemany(self: psycopg.Cursor[Any], query: Any, params_seq: Any, **kwargs: Any) -> None:
        params_seq = list(params_seq)
        for params in params_seq:
            recorder.add(self, query, params)
        executemany(self, query, params_seq, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(psycopg.Cursor, "execute", recorded_execute)
        patch.setattr(psycopg.Cursor, "executemany", recorded_executemany)
        recorder.active = True
        try:
            yield
        finally:
            recorder.active = False


# -- the org-partitioned twin ----------------------------------------------------------------------
@dataclass(frozen=True)
class TwinTable:
    logical: str
    schema: str
    table: str
    key: str
    primary_key: tuple[str, ...]
    extra: str = ""


@dataclass
class Twin:
    """The partitioned copy of one knowledge base: ``schemas`` maps each source schema to its twin."""

    schemas: dict[str, str]
    tables: list[TwinTable]
    whole: list[tuple[str, str]]
    #: partition name -> logical table name
    partitions: dict[str, str] = field(default_factory=dict)

    def table(self, logical: str) -> TwinTable:
        return next(t for t in self.tables if t.logical == logical)

    def ident(self, schema: str, table: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schemas[schema]), sql.Identifier(table))

    def rewrite(self, sent: Sent) -> tuple[str, Any]:
        """The statement and its parameters aimed at the twin's schemas."""
        text = sent.text
        for source, twin in self.schemas.items():
            text = text.replace(f'"{source}"', f'"{twin}"')

        def value(v: Any) -> Any:
            if isinstance(v, str):
                for source, twin in self.schemas.items():
                    v = twin if v == source else v.replace(f'"{source}"', f'"{twin}"')
            return v

        params = sent.params
        if isinstance(params, dict):
            params = {k: value(v) for k, v in params.items()}
        elif params is not None:
            params = tuple(value(v) for v in params)
        return text, params


def build_twin(conn: psycopg.Connection[Any], cfg: MemoryConfig) -> Twin:
    kb, mem = cfg.kb_schema, cfg.memory_schema
    twin = Twin(
        schemas={s: f"{s}_p" for s in (kb, mem)},
        tables=[
            TwinTable("governing", kb, cfg.governing_table, "org_id", ("org_id", "id")),
            # The column Citus needs: a distribution column must be a real column (not an expression,
            # not a generated column), so the chunk's org has to be stored as one.
            TwinTable("chunk", kb, cfg.chunk_table, "org_id", ("org_id", "id"), "org_id TEXT NOT NULL"),
            TwinTable("osa_fact_terms", kb, "osa_fact_terms", "org_id", ("org_id", "document_id")),
            TwinTable("audit", mem, "audit", "org_id", ("org_id", "id")),
            TwinTable("feedback", mem, "feedback", "document_id", ("document_id", "run_id")),
            TwinTable("reads", mem, "reads", "document_id", ("document_id", "run_id")),
        ],
        # Console sessions are people's, few and looked up by their own id or token: kept whole like tokens.
        whole=[(mem, "tokens"), (mem, "switches"), (mem, "schema_version"), (mem, "console_sessions")],
    )
    for schema in dict.fromkeys(twin.schemas.values()):
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    for t in twin.tables:
        source = sql.SQL("{}.{}").format(sql.Identifier(t.schema), sql.Identifier(t.table))
        extra = sql.SQL(", " + t.extra) if t.extra else sql.SQL("")
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS{}) PARTITION BY HASH ({})").format(
                twin.ident(t.schema, t.table), source, extra, sql.Identifier(t.key)
            )
        )
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD PRIMARY KEY ({})").format(
                twin.ident(t.schema, t.table), sql.SQL(", ").join(map(sql.Identifier, t.primary_key))
            )
        )
        for remainder in range(PARTITIONS):
            name = f"{t.table}_p{remainder}"
            conn.execute(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES WITH (MODULUS {}, REMAINDER {})").format(
                    twin.ident(t.schema, name),
                    twin.ident(t.schema, t.table),
                    sql.Literal(PARTITIONS),
                    sql.Literal(remainder),
                )
            )
            twin.partitions[name] = t.logical
    # The indexes recall relies on, so that the twin's plans are the ones a real deployment gets.
    gov, chunk = twin.table("governing"), twin.table("chunk")
    conn.execute(
        sql.SQL("CREATE INDEX ON {} (org_id, (metadata->>'assignment_id'), status)").format(
            twin.ident(gov.schema, gov.table)
        )
    )
    conn.execute(sql.SQL("CREATE INDEX ON {} ((meta->>'document_id'))").format(twin.ident(chunk.schema, chunk.table)))
    for schema, table in twin.whole:
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {}.{} INCLUDING ALL)").format(
                twin.ident(schema, table), sql.Identifier(schema), sql.Identifier(table)
            )
        )
    return twin


def fill_twin(conn: psycopg.Connection[Any], twin: Twin) -> None:
    """Copy the knowledge base into the twin (the chunk's org from its metadata), then ANALYZE it."""
    for t in twin.tables:
        org = sql.SQL(", s.meta->>'org_id'") if t.logical == "chunk" else sql.SQL("")
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT s.*{} FROM {}.{} s").format(
                twin.ident(t.schema, t.table), org, sql.Identifier(t.schema), sql.Identifier(t.table)
            )
        )
        conn.execute(sql.SQL("ANALYZE {}").format(twin.ident(t.schema, t.table)))
    for schema, table in twin.whole:
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT * FROM {}.{}").format(
                twin.ident(schema, table), sql.Identifier(schema), sql.Identifier(table)
            )
        )


# -- plans ------------------------------------------------------------------------------------------
_PLANNED = re.compile(r"^\s*(\(\s*)*(SELECT|WITH|INSERT|UPDATE|DELETE|VALUES)\b", re.IGNORECASE)


def _relations(node: Any, out: list[str]) -> list[str]:
    if isinstance(node, dict):
        if "Relation Name" in node:
            out.append(node["Relation Name"])
        for value in node.values():
            _relations(value, out)
    elif isinstance(node, list):
        for value in node:
            _relations(value, out)
    return out


def _inserts(node: Any, out: list[str]) -> list[str]:
    if isinstance(node, dict):
        if node.get("Node Type") == "ModifyTable" and node.get("Operation") == "Insert":
            out.append(node.get("Relation Name", ""))
        for value in node.values():
            _inserts(value, out)
    elif isinstance(node, list):
        for value in node:
            _inserts(value, out)
    return out


@dataclass(frozen=True)
class Planned:
    """What a statement reads on the twin: partitions per logical table, or why it could not run."""

    scanned: dict[str, frozenset[str]]
    error: str | None = None


def plan_on_twin(conn: psycopg.Connection[Any], twin: Twin, sent: Sent) -> Planned:
    text, params = twin.rewrite(sent)
    try:
        row = conn.execute("EXPLAIN (FORMAT JSON) " + text, params).fetchone()
        assert row is not None
        plan = row[0]
        parents = {t.table for t in twin.tables}
        if any(name in parents for name in _inserts(plan, [])):
            # Run it once (rolled back): an INSERT routes its rows at run time, and one without the
            # partition key fails on the key's NOT NULL.
            with conn.transaction(force_rollback=True):
                conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + text, params)
    except psycopg.Error as e:
        return Planned({}, f"{type(e).__name__}: {str(e).strip().splitlines()[0]}")
    scanned: dict[str, set[str]] = {}
    for name in _relations(plan, []):
        if name in twin.partitions:
            scanned.setdefault(twin.partitions[name], set()).add(name)
    return Planned({k: frozenset(v) for k, v in scanned.items()})


def partition_of(conn: psycopg.Connection[Any], twin: Twin, logical: str, value: str) -> str:
    """The partition of ``logical`` that holds rows whose key is ``value``."""
    t = twin.table(logical)
    query = sql.SQL("EXPLAIN (FORMAT JSON) SELECT 1 FROM {} WHERE {} = %s").format(
        twin.ident(t.schema, t.table), sql.Identifier(t.key)
    )
    row = conn.execute(query, (value,)).fetchone()
    assert row is not None
    (name,) = {n for n in _relations(row[0], []) if n in twin.partitions}
    return name


@dataclass
class Verdicts:
    """The outcome of checking recorded statements against the twin."""

    checked: int = 0
    skipped: int = 0
    #: (statement, what is wrong with it) -> the parameters of each time it was sent so
    problems: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    #: listed entry name -> how many statement instances needed it
    needed: dict[str, int] = field(default_factory=dict)
    #: listed entry name -> how many statement instances it matched at all
    matched: dict[str, int] = field(default_factory=dict)

    @property
    def failures(self) -> list[str]:
        return [
            f"{problem} (sent {len(params)}x)\n    {text[:500]}\n    first parameters: {params[0]!r:.300}"
            for (text, problem), params in self.problems.items()
        ]


def check_statements(
    conn: psycopg.Connection[Any],
    twin: Twin,
    orgs: tuple[str, str],
    sent: list[Sent],
    listed: tuple[Listed, ...] = LISTED,
) -> Verdicts:
    """Plan every statement on the twin; each must read at most one partition per table (its org's own
    when it carries an org), or be listed (``listed``) for the tables it spreads over."""
    own = {
        (t.logical, org): partition_of(conn, twin, t.logical, org)
        for t in twin.tables
        if t.key == "org_id"
        for org in orgs
    }
    verdicts = Verdicts()
    seen: set[tuple[str, str]] = set()
    for s in sent:
        key = (s.text, repr(s.params))
        if key in seen:
            continue
        seen.add(key)
        if not _PLANNED.match(s.text):
            verdicts.skipped += 1  # SET, DDL of pgvector-haystack's setup: nothing to plan
            continue
        verdicts.checked += 1
        values = s.params.values() if isinstance(s.params, dict) else (s.params or ())
        carried = [org for org in orgs if any(v == org for v in values if isinstance(v, str))]
        org = carried[0] if len(carried) == 1 else None
        planned = plan_on_twin(conn, twin, s)
        spread = {table for table, parts in planned.scanned.items() if len(parts) > 1}
        elsewhere = {
            table
            for table, parts in planned.scanned.items()
            if org is not None and (table, org) in own and len(parts) == 1 and parts != {own[(table, org)]}
        }
        matching = [entry for entry in listed if all(mark in s.flat for mark in entry.marks)]
        for entry in matching:
            verdicts.matched[entry.name] = verdicts.matched.get(entry.name, 0) + 1
        problems: list[str] = []
        if planned.error is not None:
            excused = [e for e in matching if e.fails_with is not None and e.fails_with in planned.error]
            if excused:
                for entry in excused:
                    verdicts.needed[entry.name] = verdicts.needed.get(entry.name, 0) + 1
            else:
                problems.append(f"does not plan on the org-partitioned schema: {planned.error}")
        uncovered = set(spread)
        for entry in matching:
            covered = uncovered & entry.tables
            if covered:
                verdicts.needed[entry.name] = verdicts.needed.get(entry.name, 0) + 1
                uncovered -= covered
        for table in sorted(uncovered):
            problems.append(f"reads {len(planned.scanned[table])} partitions of {table}")
        for table in sorted(elsewhere):
            problems.append(f"carries org {org} but reads {table} partition {sorted(planned.scanned[table])}")
        if problems:
            verdicts.problems.setdefault((s.flat, "; ".join(problems)), []).append(s.params)
    return verdicts


# -- memory's operations ----------------------------------------------------------------------------
FACTS = [
    "Staging deploys need the VPN and a fresh token",
    "Invoices are generated on the first business day of each month",
    "The on-call engineer acknowledges pages within five minutes",
]


def add_customer_documents(conn: psycopg.Connection[Any], cfg: MemoryConfig, orgs: tuple[str, ...]) -> None:
    """The team's customer documents, with the `meta.org_id` a chunk table distributed by org needs."""
    names = cfg.sql_names()
    for org in orgs:
        doc_id = f"cust-{org}-refunds"
        conn.execute(
            sql.SQL(
                "INSERT INTO {schema}.{gov} (id, org_id, dataset, source, audience) "
                "VALUES (%s, %s, 'kb', 'manual', 'customer')"
            ).format(**names),
            (doc_id, org),
        )
        conn.execute(
            sql.SQL("INSERT INTO {schema}.{chunk} (id, content, meta) VALUES (%s, %s, %s)").format(**names),
            (doc_id, f"Refund policy of {org}: refunds within 30 days", Jsonb({"document_id": doc_id, "org_id": org})),
        )


def run_operations(cfg: MemoryConfig, orgs: tuple[str, str]) -> None:
    """What agents, the MCP server's token check and operators do, for each org."""
    dim = cfg.embedding_dimension
    lexical = Memory(cfg, use_default_embedders=False)
    hybrid = Memory(
        cfg, document_embedder=MockDocumentEmbedder(dimension=dim), text_embedder=MockTextEmbedder(dimension=dim)
    )
    # Recall of a scope past `exact_scope_max` facts takes its candidates from indexes (scopes too big to be held
    # in memory), or ranks the scope held in memory: every scope does one or the other here.
    big = Memory(
        cfg, document_embedder=MockDocumentEmbedder(dimension=dim), text_embedder=MockTextEmbedder(dimension=dim)
    )
    held = Memory(
        cfg, document_embedder=MockDocumentEmbedder(dimension=dim), text_embedder=MockTextEmbedder(dimension=dim)
    )
    for memory in (big, held):
        memory.warm_up()
        assert memory.kb is not None
        memory.kb.facts.exact_scope_max = 0
    assert big.kb is not None
    big.kb.facts.scope_cache = None
    lexical.warm_up()
    assert lexical.kb is not None
    assert lexical.lifecycle is not None
    assert lexical.conn_str is not None
    tokens, lifecycle = lexical.kb.tokens, lexical.lifecycle
    for org in orgs:
        me = Caller(org_id=org, assignment_id=ASSIGNMENT, specialist_id="spec-1")
        peers = [Caller(org_id=org, assignment_id=ASSIGNMENT, specialist_id=f"spec-{i}") for i in (2, 3)]
        ids = [hybrid.store(fact, topic="ops", caller=me)["document_id"] for fact in FACTS]
        lexical.store(FACTS[0].lower() + ".", caller=me, ttl_days=30)  # a repeat, for reflect
        proposed = lexical.propose("procedure", "Release checklist", "Tag the release, then deploy", caller=me)
        assert lexical.recall("staging VPN", caller=me)["facts"]
        lexical.recall("invoices month", caller=me)
        assert hybrid.recall("how do I deploy to staging?", caller=me)["facts"]
        assert big.recall("staging VPN", caller=me)["facts"]
        assert held.recall("staging VPN", caller=me)["facts"]  # the scope read in full
        held.store("The staging VPN profile rotates every quarter.", caller=me)
        assert held.recall("staging VPN", caller=me)["facts"]  # the new fact appended
        # A lexeme held by more than a few facts is "common": its count is read from PostgreSQL's statistics.
        rare_max, big_scope.RARE_LEXEME_MAX_DF = big_scope.RARE_LEXEME_MAX_DF, 0
        try:
            assert big.recall("how do we deploy to staging?", caller=me)["facts"]
        finally:
            big_scope.RARE_LEXEME_MAX_DF = rare_max
        # A fact written by other tools, without its recall row: the exact path reads its chunk too (`SCOPE_ROWS`).
        other = lexical.store("The on-call phone sits in the top drawer.", caller=me)["document_id"]
        with psycopg.connect(cfg.pg_conn_str or "", autocommit=True) as conn:  # recorded and checked too
            conn.execute(
                sql.SQL("DELETE FROM {}.osa_fact_terms WHERE org_id = %s AND document_id = %s").format(
                    sql.Identifier(cfg.kb_schema)
                ),
                (org, other),
            )
        assert other in [f["document_id"] for f in lexical.recall("on-call phone drawer", caller=me)["facts"]]
        lexical.forget(other, "written for the check", caller=me)
        lexical.list_facts(caller=me)
        lexical.list_facts(topic="ops", caller=me)
        lexical.read(ids[1], caller=me)
        lexical.feedback(ids[1], "confirm", caller=me)
        for peer in peers:  # trust 1/4 falls below the floor: the fact is flagged
            lexical.feedback(ids[2], "flag", note="outdated", caller=peer)
        assert lexical.feedback(ids[2], "confirm", caller=me)["status"] == "flagged"  # 2/5: a review restores it
        assert lexical.feedback(ids[2], "flag", caller=me)["status"] == "flagged"  # the vote replaced: 1/5
        lexical.forget(ids[1], "superseded", caller=me)
        # A fact that changes: supersession (and a refused one), its history, forgetting inside the chain.
        window = lexical.store("The deploy window is 14-16 UTC", caller=me, valid_from="2026-01-05")["document_id"]
        moved = lexical.store("The deploy window is 15-17 UTC", caller=me, supersedes=[window])["document_id"]
        with pytest.raises(SupersessionError):
            lexical.store("The deploy window is 9-11 UTC", caller=me, supersedes=[window])
        assert [v["document_id"] for v in lexical.history(moved, caller=me)] == [window, moved]
        assert lifecycle.find_scope(moved) == Scope(org, ASSIGNMENT)
        assert lexical.recall("deploy window", caller=me, as_of="2026-02-01")["facts"]
        # The value goes back: the first window holds again, its former successor stops listing it.
        lexical.store("The deploy window is 14-16 UTC", caller=me, supersedes=[moved])
        lexical.forget(moved, "wrong window", caller=me)
        assert lexical.status(caller=me)["database"] == "ok"
        reflected = lexical.reflect(caller=me)
        assert reflected["facts_consolidated"] == 2
        # The repair of observations: its pass over every org (nothing to repair), then one repair written.
        assert repair_observations(lifecycle, dry_run=True) == 0
        (observation,) = reflected["observations_created"]
        evidence = lexical.read(observation, caller=me)["evidence"]
        assert lifecycle.repair_observation(
            Scope(org, ASSIGNMENT), observation, evidence=[], restore=evidence[:1], validity=None, actor="ops"
        ) == len(evidence)
        exported = list(lexical.export(caller=me))
        items = [ImportItem(fact=row["fact"], origin="export") for row in exported[:1]]
        items += [ImportItem(fact=f"Imported fact {n} about the billing portal", origin="notes") for n in range(3)]
        assert lexical.import_items(items, caller=me).stored == 3
        assert lexical.customer_search("refund policy", org_id=org)
        issued = tokens.create(org_id=org, assignment_id=ASSIGNMENT, specialist_id="spec-1")
        assert tokens.verify(issued.token).org_id == org
        assert tokens.org_of(issued.token_id) == org
        assert tokens.is_active(issued.token_id)
        assert tokens.revoke(issued.token_id)
        with pytest.raises(AuthenticationError):
            tokens.verify(issued.token)
        # An operator, for this org.
        assert lifecycle.review_list(org_id=org)
        lifecycle.review(proposed["document_id"], accept=True, actor="reviewer", note=None)
        lifecycle.set_switch(org, ASSIGNMENT, enabled=False, actor="operator", reason="incident")
        lifecycle.set_switch(org, ASSIGNMENT, enabled=False, actor="operator", reason="still investigating")
        with pytest.raises(MemoryOffError):
            lexical.store("Refused while memory is off", caller=me)
        lifecycle.set_switch(org, ASSIGNMENT, enabled=True, actor="operator", reason=None)
        assert lifecycle.audit(org_id=org, assignment_id=ASSIGNMENT)
    # An operator, across orgs.
    lifecycle.review_list()
    lifecycle.switches()
    lifecycle.audit()
    assert len(lifecycle.reflect_scopes()) == 2
    tokens.list()
    count_facts(lexical.conn_str, cfg)


@dataclass
class Run:
    cfg: MemoryConfig
    twin: Twin
    orgs: tuple[str, str]
    sent: list[Sent]
    conn: psycopg.Connection[Any]
    repositories: list[Any]

    @cached_property
    def verdicts(self) -> Verdicts:
        return check_statements(self.conn, self.twin, self.orgs, self.sent)


@pytest.fixture(scope="module")
def run(pg_conn_str: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Memory's operations for two orgs, recorded, and the org-partitioned twin of what they left."""
    tmp: Path = tmp_path_factory.mktemp("partitioned")
    cfg = new_schema_config(pg_conn_str, data_dir=tmp, buffer_path=tmp / "buffer.jsonl")
    ensure_schema(pg_conn_str, cfg)
    conn = psycopg.connect(pg_conn_str, autocommit=True)
    twin: Twin | None = None
    try:
        twin = build_twin(conn, cfg)
        first = ORG_CANDIDATES[0]
        second = next(
            o
            for o in ORG_CANDIDATES[1:]
            if partition_of(conn, twin, "governing", o) != partition_of(conn, twin, "governing", first)
        )
        orgs = (first, second)
        add_customer_documents(conn, cfg, orgs)
        recorder = Recorder()
        with recording(recorder):
            run_operations(cfg, orgs)
        fill_twin(conn, twin)
        probe = Memory(cfg, use_default_embedders=False)
        probe.warm_up()
        assert probe.kb is not None
        repositories = [probe.kb.facts, probe.kb.lifecycle, probe.kb.tokens]
        yield Run(cfg, twin, orgs, recorder.sent, conn, repositories)
    finally:
        close_pools()
        for schema in dict.fromkeys(twin.schemas.values() if twin else ()):
            drop_schema(pg_conn_str, schema)
        conn.close()
        drop_schema(pg_conn_str, cfg.kb_schema)
        drop_schema(pg_conn_str, cfg.memory_schema)


# -- tests ------------------------------------------------------------------------------------------
def test_every_statement_reads_one_partition_of_its_org(run: Run) -> None:
    verdicts = run.verdicts
    assert verdicts.checked > 50, verdicts
    assert not verdicts.failures, (
        f"{len(verdicts.failures)} statement(s) read more than one partition (or another org's) of a table "
        "distributed by org; name the org in them, or list them with the reason:\n" + "\n".join(verdicts.failures)
    )


def test_every_listed_statement_is_still_sent_and_still_needs_its_place(run: Run) -> None:
    verdicts = run.verdicts
    gone = [e.name for e in LISTED if not verdicts.matched.get(e.name)]
    assert not gone, f"listed statements memory no longer sends (remove them from the list): {gone}"
    routed = [e.name for e in LISTED if not verdicts.needed.get(e.name)]
    assert not routed, f"listed statements that now read one partition (remove them from the list): {routed}"


def test_every_statement_of_the_repositories_was_exercised(run: Run) -> None:
    """A statement the operations above never send is not checked: a new one must be exercised here."""
    sent = [s.flat for s in run.sent]
    missing = []
    with psycopg.connect(run.cfg.pg_conn_str or "") as conn:
        for repository in run.repositories:
            statements = {**vars(repository), **getattr(repository, "_q", {})}
            # and those a repository keeps in a dataclass of its own (`scope_cache.Statements`)
            for holder, held in list(statements.items()):
                if dataclasses.is_dataclass(held) and not isinstance(held, type):
                    statements.update({f"{holder}.{k}": v for k, v in vars(held).items()})
            for name, statement in statements.items():
                if isinstance(statement, sql.Composable):
                    flat = " ".join(statement.as_string(conn).split())
                    if not any(flat in s for s in sent):
                        missing.append(f"{type(repository).__name__}.{name}")
    assert not missing, f"statements never sent by run_operations (exercise them there): {missing}"


def test_the_check_catches_a_statement_without_its_org(run: Run) -> None:
    """The same statement, with its org condition removed or pointed at the other org, fails the check."""
    count = next(s for s in run.sent if "SELECT count(*) FROM" in s.text and "g.status = 'approved'" in s.text)
    assert "g.org_id = %(org_id)s AND" in count.text
    assert check_statements(run.conn, run.twin, run.orgs, [count]).failures == []
    unscoped = Sent(count.text.replace("g.org_id = %(org_id)s AND", ""), count.params)
    (failure,) = check_statements(run.conn, run.twin, run.orgs, [unscoped]).failures
    assert f"reads {PARTITIONS} partitions of governing" in failure
    other = run.orgs[1] if count.params["org_id"] == run.orgs[0] else run.orgs[0]
    misrouted = Sent(count.text.replace("g.org_id = %(org_id)s", f"g.org_id = '{other}'"), count.params)
    (failure,) = check_statements(run.conn, run.twin, run.orgs, [misrouted]).failures
    assert "but reads governing partition" in failure
    # Listed statements are excused only on their own tables.
    listed = next(e for e in LISTED if e.name == "LIST_FACTS")
    page = next(s for s in run.sent if all(mark in s.flat for mark in listed.marks))
    bare = Sent(page.text.replace("g.org_id = %(org_id)s AND", ""), page.params)
    (failure,) = check_statements(run.conn, run.twin, run.orgs, [bare]).failures
    assert "partitions of governing" in failure
    # A write that leaves the org out is caught when it runs (an INSERT shows no partition in its plan).
    audit = next(s for s in run.sent if s.flat.startswith("INSERT INTO") and ".audit (actor" in s.flat)
    assert check_statements(run.conn, run.twin, run.orgs, [audit]).failures == []
    orgless = Sent(audit.text.replace("%(org_id)s", "NULL"), audit.params)
    (failure,) = check_statements(run.conn, run.twin, run.orgs, [orgless]).failures
    assert "NotNullViolation" in failure


def test_two_orgs_write_to_different_partitions(run: Run) -> None:
    for t in run.twin.tables:
        if t.key != "org_id":
            continue
        for org in run.orgs:
            own = partition_of(run.conn, run.twin, t.logical, org)
            query = sql.SQL("SELECT DISTINCT {} FROM {}").format(sql.Identifier(t.key), run.twin.ident(t.schema, own))
            held = {row[0] for row in run.conn.execute(query).fetchall()}
            assert org in held, (t.logical, org, own, held)
    first, second = (partition_of(run.conn, run.twin, "governing", org) for org in run.orgs)
    assert first != second
