"""`MemoryStore.prepare_schema`: a plain check on a team's database, brought up to date only on the embedded one."""

from __future__ import annotations

import psycopg
import pytest

from haystack_osa_memory.errors import SchemaError
from haystack_osa_memory.store.memory_store import MemoryStore
from haystack_osa_memory.store.schema import SCHEMA_VERSION, SchemaState
from tests.conftest import drop_schema, new_schema_config


def _schema_exists(pg_conn_str: str, name: str) -> bool:
    with psycopg.connect(pg_conn_str) as conn:
        row = conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def test_prepare_schema_creates_nothing_unless_the_database_is_the_embedded_one(pg_conn_str: str) -> None:
    config = new_schema_config(pg_conn_str)
    try:
        with MemoryStore.from_config(config) as store:
            with pytest.raises(SchemaError, match="no osa-memory schema"):
                store.prepare_schema()
            assert not _schema_exists(pg_conn_str, config.memory_schema)

            state, report = store.prepare_schema(embedded=True)
            assert state == SchemaState(SCHEMA_VERSION, False)
            assert report is not None
            assert report.applied[-1] == SCHEMA_VERSION
            assert _schema_exists(pg_conn_str, config.memory_schema)

            assert store.prepare_schema() == (state, None)
            assert store.probe() == ("ok", None)
    finally:
        drop_schema(pg_conn_str, config.kb_schema)
