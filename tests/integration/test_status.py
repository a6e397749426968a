"""kb_memory_status reports distinct database states."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.cli.main import buffers_note
from haystack_osa_memory.store.facts import BufferFit, buffer_fit
from haystack_osa_memory.transfer import ImportItem
from tests.conftest import new_schema_config
from tests.e2e.conftest import OSA_MEMORY, env_for

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


def test_buffer_fit_reads_shared_buffers_and_the_recall_rows_growing(
    pg_conn_str: str, config: MemoryConfig, memory: Memory, alice: Caller
) -> None:
    before = buffer_fit(pg_conn_str, config)
    with psycopg.connect(pg_conn_str) as conn:
        row = conn.execute("SHOW shared_buffers").fetchone()
        assert row is not None
        setting = row[0]
        sized = conn.execute("SELECT pg_size_bytes(current_setting('shared_buffers'))").fetchone()
    assert before.shared_buffers == setting
    assert sized is not None
    assert before.shared_buffers_bytes == sized[0]
    assert before.recall_rows_bytes > 0  # the empty table's indexes
    memory.import_items(
        [ImportItem(fact=f"fact {i}: the build server {i} runs job {i * 7}", origin=f"line {i}") for i in range(400)],
        caller=alice,
    )
    assert buffer_fit(pg_conn_str, config).recall_rows_bytes > before.recall_rows_bytes


def test_buffer_fit_of_a_schema_without_recall_rows_is_zero(pg_conn_str: str) -> None:
    assert buffer_fit(pg_conn_str, new_schema_config(pg_conn_str)).recall_rows_bytes == 0


def test_status_says_when_the_recall_rows_outgrow_shared_buffers() -> None:
    small = BufferFit("128MB", 128 * 2**20, 431 * 2**20)
    assert not small.fits
    assert BufferFit("1GB", 2**30, 431 * 2**20).fits
    note = buffers_note(small)
    assert "431 MB" in note
    assert "(128MB)" in note


def test_status_command_reports_shared_buffers_and_recall_rows(pg_conn_str: str, config: MemoryConfig) -> None:
    done = subprocess.run(
        [*OSA_MEMORY, "status", "--json"],
        env=env_for(config, pg_conn_str),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    fit = buffer_fit(pg_conn_str, config)
    assert data["shared_buffers"] == fit.shared_buffers
    assert data["recall_rows_mb"] == round(fit.recall_rows_bytes / 2**20, 1)


def test_store_counts_checks_and_reads_on_its_own_pool(config: MemoryConfig, memory: Memory, alice: Caller) -> None:
    from haystack_osa_memory import MemoryStore
    from haystack_osa_memory.store.database import get_pool
    from haystack_osa_memory.store.schema import SCHEMA_VERSION

    memory.store("the release train leaves on Tuesdays", caller=alice)
    with MemoryStore.from_config(config) as store:
        counts = store.count_facts()
        assert (counts["facts"], counts["assignments"], counts["chunks"]) == (1, 1, 1)
        assert store.check_schema().version == SCHEMA_VERSION
        assert store.buffer_fit().recall_rows_bytes > 0
        with store.transaction() as conn:
            row = conn.execute("SELECT txid_current_if_assigned() IS NULL, now() = statement_timestamp()").fetchone()
        assert row == (True, False)  # inside BEGIN ... COMMIT: now() is the transaction's start
        with store.reading() as conn:  # each statement commits on its own: its own implicit transaction
            assert conn.execute("SELECT now() = statement_timestamp()").fetchone() == (True,)
        pool = get_pool(store.conn_str, store.config)
    # The memory's store holds the same pool: closing this store left it open, and memory goes on.
    assert not pool.closed
    assert memory.recall("release train", caller=alice)["facts"]
    held = memory.kb
    memory.close()
    memory.close()  # idempotent
    assert memory.kb is None
    assert held is not None
    assert held._holding is None  # its store let go of the pool
    assert memory.recall("release train", caller=alice)["facts"]  # a later call warms up again
    assert memory.kb is not None
    assert memory.kb is not held
    memory.close()
