"""How big the knowledge base is and how PostgreSQL sees it: facts and assignments counted (`count_facts`),
the recall rows beside the shared buffers (`buffer_fit`), and the planner's statistics of the fact tables,
refreshed after a bulk load or when they fall behind (`ANALYZE_FACT_TABLES`, `statistics_stale`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.store.database import read, transaction
from haystack_osa_memory.store.scope_query import FACT_SOURCE

# The planner's statistics of the tables facts are written to, refreshed after a bulk load (`import`):
# until ANALYZE (or autovacuum, which may come minutes later) has seen the new rows, PostgreSQL takes a new
# scope for a few rows and plans the scope's statements for that. Only the tables' owner may analyze them;
# PostgreSQL skips (with a warning) a table another role owns.
ANALYZE_FACT_TABLES = sql.SQL("ANALYZE {schema}.{gov}, {schema}.{chunk}, {schema}.osa_fact_terms")
# Rows of the recall-row table written since it was last analyzed, and how many it had then: a big scope's
# recall refreshes the statistics itself when more rows were written since than the table had (many agents
# storing into a new assignment, faster than autovacuum's threshold of a tenth of the table).
WRITES_SINCE_ANALYZE = sql.SQL(
    """SELECT s.n_mod_since_analyze, c.reltuples, s.last_analyze IS NULL AND s.last_autoanalyze IS NULL
    FROM pg_catalog.pg_stat_user_tables s JOIN pg_catalog.pg_class c ON c.oid = s.relid
    WHERE s.schemaname = %(schema)s AND s.relname = 'osa_fact_terms'"""
)
#: Seconds between two looks at `WRITES_SINCE_ANALYZE` per process (only recalls of big scopes look).
STALE_STATISTICS_CHECK_S = 60.0


def statistics_stale(conn: psycopg.Connection[Any], config: MemoryConfig, written_past: int) -> bool:
    """More than ``written_past`` recall rows written since the last ANALYZE, and more than the table then
    had or it was never analyzed (`WRITES_SINCE_ANALYZE`)."""
    row = conn.execute(WRITES_SINCE_ANALYZE, {"schema": config.kb_schema}).fetchone()
    if row is None:
        return False
    written, rows_then, never = int(row[0] or 0), max(float(row[1] or 0.0), 0.0), bool(row[2])
    return written > written_past and (never or written > rows_then)


COUNT_FACTS = sql.SQL(
    """SELECT count(*) FILTER (WHERE g.source = %(source)s) AS facts,
              count(DISTINCT g.metadata->>'assignment_id') FILTER (WHERE g.source = %(source)s) AS assignments,
              count(*) AS governing_rows,
              (SELECT count(*) FROM {schema}.{chunk}) AS chunks
    FROM {schema}.{gov} g"""
)


def count_facts(conn_str: str, config: MemoryConfig) -> dict[str, int]:
    """Facts, assignments with facts, governing rows and chunks in the knowledge base."""
    query = COUNT_FACTS.format(**config.sql_names())
    with transaction(conn_str, config) as conn:
        row = conn.execute(query, {"source": FACT_SOURCE}).fetchone()
    assert row is not None
    return dict(zip(("facts", "assignments", "governing_rows", "chunks"), map(int, row), strict=True))


# The recall rows (osa_fact_terms with its indexes) beside the server's shared buffers: recall in a big
# assignment reads its candidates' pages at random, from the operating system's cache when they do not fit
# (docs/operations.md, "Sizing").
RECALL_ROWS_SIZE = sql.SQL(
    """SELECT current_setting('shared_buffers'), pg_size_bytes(current_setting('shared_buffers')),
              coalesce(pg_total_relation_size(to_regclass(format('%%I.osa_fact_terms', %(schema)s::text))), 0)"""
)


@dataclass(frozen=True)
class BufferFit:
    """The server's ``shared_buffers`` and the size of the recall rows with their indexes, in bytes."""

    shared_buffers: str
    shared_buffers_bytes: int
    recall_rows_bytes: int

    @property
    def fits(self) -> bool:
        """The recall rows fit in the shared buffers."""
        return self.recall_rows_bytes <= self.shared_buffers_bytes


def buffer_fit(conn_str: str, config: MemoryConfig) -> BufferFit:
    """How the recall rows compare with the server's shared buffers (`RECALL_ROWS_SIZE`)."""
    with read(conn_str, config) as conn:  # one statement: no BEGIN / COMMIT round trips
        row = conn.execute(RECALL_ROWS_SIZE, {"schema": config.kb_schema}).fetchone()
    assert row is not None
    return BufferFit(str(row[0]), int(row[1]), int(row[2]))
