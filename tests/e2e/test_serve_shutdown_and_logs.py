"""`osa-memory serve` as a real process: shutdown stops the embedded PostgreSQL it started, the log holds no
token or fact text, and a revoked token's bridge queue is set aside instead of being sent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]
import pytest
from mcp import ClientSession

from haystack_osa_memory.mcp.guard import GUARD_MARKER
from haystack_osa_memory.mcp.stdio_bridge import STATUS_TOOL, BridgeBuffer, token_fingerprint
from haystack_osa_memory.store.tokens import TOKEN_PREFIX, TokenStore
from tests.conftest import free_port
from tests.e2e.conftest import OSA_MEMORY, Server, call, env_for, wait_for_status
from tests.e2e.test_stdio_bridge import buffer_items, payload, with_bridge

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

STOP_WITHIN = 30.0  # seconds for the server to exit and its PostgreSQL to be gone


def embedded_env() -> dict[str, str]:
    """The environment of a server on its own embedded database (no PG_CONN_STR), without embeddings."""
    env = {k: v for k, v in os.environ.items() if k != "PG_CONN_STR" and not k.startswith("OSA_MEMORY_")}
    return {**env, "OSA_MEMORY_EMBEDDER": "none", "PYTHONUNBUFFERED": "1"}


#: Every server process a test started, killed afterwards if the test left it running.
_started: list[subprocess.Popen[bytes]] = []


def start_serve(
    data_dir: Path, log: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """`osa-memory serve --data-dir DATA --port P ARGS...` (``env``: the given database instead), answering
    /status; (process, port)."""
    port = free_port()
    command = [*OSA_MEMORY, "serve", "--port", str(port), *args]
    if env is None:
        command += ["--data-dir", str(data_dir)]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, env=env or embedded_env(), stdout=out, stderr=subprocess.STDOUT)
    _started.append(proc)
    wait_for_status(proc, port, log, 120, "osa-memory serve")
    return proc, port


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()[0])


def handle_pids(data_dir: Path) -> list[int]:
    pids: list[int] = json.loads((data_dir / "pgdata" / ".handle_pids.json").read_text())
    return pids


def running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.2)
    return not running(pid)


def kill_database_guard(server_pid: int) -> None:
    """SIGKILL the database guard of the `serve` process ``server_pid`` (see `start_database_guard`)."""
    guards = [p for p in psutil.Process(server_pid).children() if any(GUARD_MARKER in part for part in p.cmdline())]
    assert len(guards) == 1, "precondition: a server on the embedded database runs one guard"
    guards[0].kill()
    assert gone_within(guards[0].pid, 10)  # a zombie until `serve` ends: not running all the same


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data folder for the embedded database; whatever a failed test left running is stopped afterwards."""
    data = tmp_path / "data"
    yield data
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    pid_file = data / "pgdata" / "postmaster.pid"
    if pid_file.exists() and running(postmaster_pid(data)):
        psutil.Process(postmaster_pid(data)).send_signal(signal.SIGINT)  # fast shutdown: drops clients


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 0)])
def test_sigterm_or_ctrl_c_stops_the_embedded_postgres(data_dir: Path, tmp_path: Path, sig: int, status: int) -> None:
    proc, _ = start_serve(data_dir, tmp_path / "serve.log")
    postmaster = postmaster_pid(data_dir)
    assert running(postmaster)
    assert handle_pids(data_dir) == [proc.pid]

    proc.send_signal(sig)
    assert proc.wait(STOP_WITHIN) == status, (tmp_path / "serve.log").read_text()
    assert gone_within(postmaster, STOP_WITHIN), "the embedded PostgreSQL outlived `osa-memory serve`"
    assert handle_pids(data_dir) == []


def test_a_crashed_servers_stale_pid_does_not_keep_the_database_alive(data_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    crashed, _ = start_serve(data_dir, log)
    postmaster = postmaster_pid(data_dir)
    # The whole server crashes, its database guard included (else the guard stops the database itself).
    kill_database_guard(crashed.pid)
    crashed.kill()  # SIGKILL: no atexit, its pid stays in the handle list
    crashed.wait(STOP_WITHIN)
    finished = subprocess.Popen(["true"])
    finished.wait()  # another pid that no longer runs, written in by hand
    (data_dir / "pgdata" / ".handle_pids.json").write_text(json.dumps([crashed.pid, finished.pid]))
    assert running(postmaster), "precondition: the crash left the database running"

    proc, _ = start_serve(data_dir, log)
    assert postmaster_pid(data_dir) == postmaster  # joined the running server
    assert handle_pids(data_dir) == [proc.pid]  # the dead pids were dropped when joining
    proc.send_signal(signal.SIGINT)  # Ctrl-C ran atexit before too: this checks the pruning alone
    assert proc.wait(STOP_WITHIN) == 0, log.read_text()
    assert gone_within(postmaster, STOP_WITHIN), "a dead pid in the handle list kept the database alive"


def test_the_log_holds_no_token_from_a_query_string_nor_arguments_of_a_malformed_request(
    server: Server, data_dir: Path, tmp_path: Path
) -> None:
    issued = TokenStore(server.pg_conn_str, server.config).create(org_id="acme", assignment_id="asg-logs")
    fact = "Logcheck: the staging VPN passphrase hint is tangerine-47"
    log = tmp_path / "serve.log"
    env = env_for(server.config, server.pg_conn_str)
    proc, port = start_serve(tmp_path, log, "--log-level", "info", env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        # a token put in the query string by mistake
        assert httpx.get(f"{base}/status", params={"token": issued.token}, timeout=10).status_code == 200
        assert httpx.post(f"{base}/mcp?token={issued.token}", json={}, timeout=10).status_code == 401
        # a malformed tools/call (arguments must be an object) carrying fact text
        malformed = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "kb_memory_store", "arguments": fact},
        }
        headers = {
            "Authorization": f"Bearer {issued.token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        answer = httpx.post(f"{base}/mcp", json=malformed, headers=headers, timeout=30)
        assert answer.status_code == 200
        assert "Invalid request parameters" in answer.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(STOP_WITHIN)
    text = log.read_text()
    assert issued.token not in text
    # Not even the secret part (it may hold "_" itself: split after the prefix and the token id).
    secret = issued.token.removeprefix(f"{TOKEN_PREFIX}{issued.token_id}_")
    assert len(secret) >= 32
    assert secret not in text
    assert "tangerine" not in text
    assert "Logcheck" not in text
    # both requests were logged all the same: the access line without its query string, the warning
    # without the arguments
    assert '"POST /mcp HTTP/1.1" 401' in text
    assert "Failed to validate request (details not logged" in text


def test_a_revoked_tokens_bridge_queue_is_set_aside_and_never_sent(server: Server, tmp_path: Path) -> None:
    issued = server.token("asg-bridge-revoked")
    token = issued["token"]
    buffer = tmp_path / "buffer" / "bridge-buffer.jsonl"
    queue = BridgeBuffer(buffer, token_fingerprint(token))
    first, _ = queue.append("kb_memory_store", {"fact": "Revokedqueue alpha: queued while offline"})
    second, _ = queue.append("kb_memory_store", {"fact": "Revokedqueue beta: queued while offline"})
    foreign, _ = BridgeBuffer(buffer, token_fingerprint("someone-else")).append(
        "kb_memory_store", {"fact": "Revokedqueue gamma: another token's item"}
    )
    assert TokenStore(server.pg_conn_str, server.config).revoke(issued["token_id"]) is True

    async def status(session: ClientSession) -> Any:
        return payload(await session.call_tool(STATUS_TOOL, {}))

    state = with_bridge(server.url, token, buffer, status)
    assert state["remote"] == "unauthorized"
    assert (state["pending"], state["rejected"]) == (0, 2)
    assert "other_tokens_pending" not in state
    # the other token's item stays queued; this token's items are kept aside, in order, not lost
    assert [i["id"] for i in buffer_items(buffer)] == [foreign["id"]]
    rejected = [json.loads(line) for line in queue.rejected_path.read_text().splitlines()]
    assert [r["id"] for r in rejected] == [first["id"], second["id"]]
    assert {r["rejected_reason"] for r in rejected} == {"the server refused the token (HTTP 401)"}
    assert oct(queue.rejected_path.stat().st_mode & 0o777) == "0o600"
    assert "Revokedqueue" not in (tmp_path / "bridge.log").read_text()
    # nothing reached the assignment
    reader = server.token("asg-bridge-revoked")["token"]
    _, recalled = call(server.url, reader, "kb_memory_recall", {"query": "revokedqueue offline", "limit": 10})
    assert recalled["facts"] == []
