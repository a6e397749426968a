"""kb_memory_status reports distinct database states."""

from __future__ import annotations

import psycopg
import pytest

from haystack_osa_memory import Caller, Memory, MemoryConfig
from tests.conftest import new_schema_config

pytestmark = pytest.mark.integration


def test_ok_reports_scope_size_and_embedder(memory: Memory, alice: Caller) -> None:
    memory.store("one", caller=alice)
    memory.store("two", caller=alice)
    status = memory.status(caller=alice)
    assert status["database"] == "ok"
    assert status["facts"] == 2
    assert status["scope"] == {"org_id": "acme", "assignment_id": "asg-alpha"}
    assert status["embedder"] == {"state": "none", "mode": "lexical"}
    assert status["pending"] == 0
    assert status["version"]


def test_unreachable(config: MemoryConfig, alice: Caller, tmp_path: object) -> None:
    cfg = config.model_copy(update={"pg_conn_str": "postgresql://postgres@127.0.0.1:1/postgres"})
    status = Memory(cfg, use_default_embedders=False, init_schema=False).status(caller=alice)
    assert status["database"] == "unreachable"
    assert status["facts"] is None


def test_unauthorised(pg_conn_str: str, config: MemoryConfig, alice: Caller) -> None:
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS osa_noaccess")
        conn.execute("CREATE ROLE osa_noaccess LOGIN")
    limited = pg_conn_str.replace("postgresql://postgres", "postgresql://osa_noaccess", 1)
    assert limited != pg_conn_str
    cfg = config.model_copy(update={"pg_conn_str": limited})
    status = Memory(cfg, use_default_embedders=False, init_schema=False).status(caller=alice)
    assert status["database"] == "unauthorised"
    assert "permission denied" in status["database_detail"]


def test_erroring(pg_conn_str: str, alice: Caller) -> None:
    cfg = new_schema_config(pg_conn_str)  # schema never created: the tables are missing
    status = Memory(cfg, use_default_embedders=False, init_schema=False).status(caller=alice)
    assert status["database"] == "erroring"
    assert "does not exist" in status["database_detail"]
