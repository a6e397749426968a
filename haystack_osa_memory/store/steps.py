"""What a migration is made of: the configured names as SQL identifiers, steps that each name the table
they touch and the lock they take there, and the labels of those locks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from haystack_osa_memory.config import MemoryConfig

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


# The table a step touches, as reports name it (None: no table).
def chunk_table(n: Names) -> str:
    return n.chunk_label


def gov_table(n: Names) -> str:
    return n.gov_label


def mem_table(name: str) -> Callable[[Names], str]:
    return lambda n: f"{n.config.memory_schema}.{name}"


def terms_table(n: Names) -> str:
    return f"{n.config.kb_schema}.osa_fact_terms"


def no_table(n: Names) -> None:
    return None
