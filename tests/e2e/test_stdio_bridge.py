"""End to end: the stdio bridge (`python -m haystack_osa_memory.mcp.stdio_bridge`) in its own process, driven by the
official MCP stdio client, in front of a real `osa-memory serve` (or of a port where nothing listens)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.session import MessageHandlerFnT
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, ServerNotification, ToolListChangedNotification

from haystack_osa_memory.mcp.stdio_bridge import STATUS_TOOL, BridgeBuffer, token_fingerprint
from tests.conftest import REPO, free_port, row_counts
from tests.e2e.conftest import Server, call

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

T = TypeVar("T")


def dead_url() -> str:
    """An MCP URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}/mcp"


def with_bridge(
    url: str,
    token: str,
    buffer: Path,
    fn: Callable[[ClientSession], Awaitable[T]],
    *extra_args: str,
    message_handler: MessageHandlerFnT | None = None,
) -> T:
    """Start the bridge as a subprocess, run ``fn`` in an initialised stdio session, stop the bridge.

    The bridge's stderr is appended to ``bridge.log`` beside the buffer's folder and checked for the token.
    """
    log_path = buffer.parent.parent / "bridge.log"
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            *(
                "-m",
                "haystack_osa_memory.mcp.stdio_bridge",
                "--url",
                url,
                "--buffer",
                str(buffer),
                "--log-level",
                "debug",
            ),
            *extra_args,
        ],
        env={**os.environ, "OSA_MEMORY_TOKEN": token, "PYTHONUNBUFFERED": "1"},
        cwd=str(REPO),
    )

    async def main() -> T:
        with log_path.open("a") as log:
            async with (
                stdio_client(params, errlog=log) as (read, write),
                ClientSession(read, write, message_handler=message_handler) as session,
            ):
                await session.initialize()
                return await fn(session)

    result = anyio.run(main)
    assert token not in log_path.read_text(), "the bridge logged the token"
    return result


def payload(result: CallToolResult) -> Any:
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert not result.isError, text
    return json.loads(text)


def error_text(result: CallToolResult) -> str:
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert result.isError, text
    return text


def buffer_items(buffer: Path) -> list[dict[str, Any]]:
    if not buffer.exists():
        return []
    return [json.loads(line) for line in buffer.read_text().splitlines() if line.strip()]


def kb_rows(server: Server) -> tuple[int, int]:
    counts = row_counts(server.pg_conn_str, server.config)
    return counts[server.config.governing_table], counts[server.config.chunk_table]


def test_tools_are_listed_and_store_recall_work_through_the_bridge(server: Server, tmp_path: Path) -> None:
    token = server.token("asg-bridge-online")["token"]
    buffer = tmp_path / "bridge-buffer.jsonl"

    async def online(session: ClientSession) -> dict[str, Any]:
        tools = (await session.list_tools()).tools
        names = {t.name for t in tools}
        # The bridge answers some calls itself while the server is down, in its own shapes: it must not
        # hand the client the server's output schemas, which the client would then enforce.
        assert [t.name for t in tools if t.outputSchema is not None] == []
        stored = payload(
            await session.call_tool("kb_memory_store", {"fact": "The bridge test VPN is vpn-brg", "topic": "vpn"})
        )
        recalled = payload(await session.call_tool("kb_memory_recall", {"query": "bridge test VPN", "limit": 5}))
        unknown = await session.call_tool("no_such_tool", {})
        return {"names": names, "stored": stored, "recalled": recalled, "unknown": unknown}

    out = with_bridge(server.url, token, buffer, online)
    assert {"kb_memory_store", "kb_memory_recall", "kb_memory_propose", STATUS_TOOL} <= out["names"]
    assert out["stored"]["stored"] is True
    assert out["stored"]["assignment_id"] == "asg-bridge-online"
    (fact,) = out["recalled"]["facts"]
    assert fact["content"] == "The bridge test VPN is vpn-brg"
    assert fact["document_id"] == out["stored"]["document_id"]
    assert "Unknown tool" in error_text(out["unknown"])  # the server's own refusal, passed through
    # what the bridge stored is what the server holds for this token
    is_error, direct = call(server.url, token, "kb_memory_recall", {"query": "bridge test VPN"})
    assert not is_error
    assert [f["document_id"] for f in direct["facts"]] == [out["stored"]["document_id"]]
    # nothing queued; the tool list is cached next to the buffer, private to the user
    assert buffer_items(buffer) == []
    cache = tmp_path / "bridge-buffer.jsonl.tools.json"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert "kb_memory_store" in {t["name"] for t in json.loads(cache.read_text())["tools"]}

    # offline, with the same buffer: tools are listed from the cache, bad arguments are refused locally
    async def offline(session: ClientSession) -> dict[str, Any]:
        names = {t.name for t in (await session.list_tools()).tools}
        too_long = await session.call_tool("kb_memory_store", {"fact": "x" * 3000})
        nul = await session.call_tool("kb_memory_store", {"fact": "nul\u0000byte"})
        smuggled = await session.call_tool("kb_memory_store", {"fact": "ok", "assignment_id": "asg-other"})
        limit = await session.call_tool("kb_memory_recall", {"query": "vpn", "limit": 50})
        return {"names": names, "errors": [too_long, nul, smuggled, limit]}

    out = with_bridge(dead_url(), token, buffer, offline)
    assert {"kb_memory_store", "kb_memory_recall", STATUS_TOOL} <= out["names"]
    for result in out["errors"]:
        assert "invalid arguments" in error_text(result)
    assert buffer_items(buffer) == []


def test_offline_stores_are_queued_survive_restart_and_flush_in_order_once(server: Server, tmp_path: Path) -> None:
    token = server.token("asg-bridge-offline")["token"]
    buffer = tmp_path / "state" / "bridge-buffer.jsonl"
    facts = [
        "Bridgequeue first: the staging database is pg-stg-3",
        "Bridgequeue second: release trains leave on Tuesdays",
        "Bridgequeue third: the canary namespace is canary-eu",
    ]
    offline_url = dead_url()

    async def store_three(session: ClientSession) -> dict[str, Any]:
        answers = [payload(await session.call_tool("kb_memory_store", {"fact": f, "topic": "ops"})) for f in facts]
        recalled = payload(await session.call_tool("kb_memory_recall", {"query": "which staging database"}))
        listed = await session.call_tool("kb_memory_list", {})
        return {"answers": answers, "recalled": recalled, "listed": listed}

    out = with_bridge(offline_url, token, buffer, store_three)
    for n, answer in enumerate(out["answers"], start=1):
        assert answer["stored"] is False
        assert answer["queued"] is True
        assert answer["pending"] == n
        assert "cannot reach" in answer["reason"]
    assert out["recalled"]["degraded"]
    assert out["recalled"]["facts"][0]["content"] == facts[0]
    assert out["recalled"]["facts"][0]["queued"] is True
    assert "unreachable" in error_text(out["listed"])
    # the buffer: one durable line per call, in order, private, without the token
    items = buffer_items(buffer)
    assert [i["arguments"]["fact"] for i in items] == facts
    assert all(i["tool"] == "kb_memory_store" and i["id"] and i["queued_at"] for i in items)
    assert stat.S_IMODE(buffer.stat().st_mode) == 0o600
    assert token not in buffer.read_text()
    original_lines = buffer.read_text()

    # a restart of the bridge (still offline) finds the same queue
    async def status_and_recall(session: ClientSession) -> tuple[Any, Any]:
        status = payload(await session.call_tool(STATUS_TOOL, {}))
        recalled = payload(await session.call_tool("kb_memory_recall", {"query": "canary namespace", "limit": 3}))
        return status, recalled

    status, recalled = with_bridge(offline_url, token, buffer, status_and_recall)
    assert status["remote"] == "unreachable"
    assert status["pending"] == 3
    assert [i["queue_id"] for i in status["pending_items"]] == [i["id"] for i in items]
    assert recalled["facts"][0]["content"] == facts[2]
    assert "degraded" in recalled

    # back online: the first call flushes the three items, in order, before answering
    before = kb_rows(server)

    async def first_call(session: ClientSession) -> Any:
        return payload(await session.call_tool("kb_memory_recall", {"query": "bridgequeue", "limit": 10}))

    recalled = with_bridge(server.url, token, buffer, first_call)
    assert "degraded" not in recalled or "bridge" not in recalled["degraded"]
    assert sorted(f["content"] for f in recalled["facts"]) == sorted(facts)
    by_time = sorted(recalled["facts"], key=lambda f: f["stored_at"])
    assert [f["content"] for f in by_time] == facts  # sent in the order they were queued
    # each holds from when the agent stored it (queued), not from when the buffer drained
    queued_at = {i["arguments"]["fact"]: datetime.fromisoformat(i["queued_at"]) for i in items}
    assert {f["content"]: datetime.fromisoformat(f["valid_from"]) for f in recalled["facts"]} == queued_at
    assert buffer_items(buffer) == []
    after = kb_rows(server)
    assert after[0] == before[0] + 3
    # the server holds them for this token (same scope as if stored directly)
    is_error, direct = call(server.url, token, "kb_memory_recall", {"query": "bridgequeue", "limit": 10})
    assert not is_error
    assert direct["assignment_id"] == "asg-bridge-offline"
    ids = {f["document_id"] for f in direct["facts"]}
    assert len(ids) == 3

    # the bridge was killed after the server acknowledged, before the buffer was rewritten: the items are
    # sent again, and the deterministic document ids make that an update in place, not a duplicate
    buffer.write_text(original_lines)

    async def status_only(session: ClientSession) -> Any:
        return payload(await session.call_tool(STATUS_TOOL, {}))

    status = with_bridge(server.url, token, buffer, status_only)
    assert status["remote"] == "ok"
    assert status["pending"] == 0
    assert buffer_items(buffer) == []
    assert kb_rows(server) == after
    _, again = call(server.url, token, "kb_memory_recall", {"query": "bridgequeue", "limit": 10})
    assert {f["document_id"] for f in again["facts"]} == ids


def test_the_bridge_reconnects_by_itself_flushes_and_announces_the_tools(server: Server, tmp_path: Path) -> None:
    """No call needed: while stores wait, the bridge retries; when the server is back it sends them and tells
    the client (tools/list_changed) that the full tool list is available."""
    token = server.token("asg-bridge-reconnect")["token"]
    buffer = tmp_path / "bridge-buffer.jsonl"
    fact = "Reconnectcase: the bridge sent this by itself"
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, ServerNotification) and isinstance(message.root, ToolListChangedNotification):
            changed.set()

    async def steps(session: ClientSession) -> tuple[set[str], Any, set[str]]:
        before = {t.name for t in (await session.list_tools()).tools}
        queued = payload(await session.call_tool("kb_memory_store", {"fact": fact}))
        await anyio.to_thread.run_sync(server.start)
        with anyio.fail_after(60):
            await changed.wait()
            while buffer_items(buffer):
                await anyio.sleep(0.2)
        after = {t.name for t in (await session.list_tools()).tools}
        return before, queued, after

    server.stop()
    try:
        before, queued, after = with_bridge(
            server.url, token, buffer, steps, "--retry-interval", "0.5", message_handler=on_message
        )
    finally:
        if server.proc is None or server.proc.poll() is not None:
            server.start()
    assert before == {STATUS_TOOL}  # never reached yet, nothing cached: only the bridge's own tool
    assert queued["queued"] is True
    assert {"kb_memory_store", "kb_memory_recall", STATUS_TOOL} <= after
    _, recalled = call(server.url, token, "kb_memory_recall", {"query": "reconnectcase"})
    assert [f["content"] for f in recalled["facts"]] == [fact]


def test_a_refused_item_is_set_aside_and_the_flush_goes_on(server: Server, tmp_path: Path) -> None:
    token = server.token("asg-bridge-refusal")["token"]
    buffer = tmp_path / "bridge-buffer.jsonl"
    queue = BridgeBuffer(buffer, token_fingerprint(token))
    first, _ = queue.append("kb_memory_store", {"fact": "Refusalcase alpha: the first item is valid"})
    bad, _ = queue.append("kb_memory_store", {"fact": "Refusalcase beta " + "x" * 3000})
    third, _ = queue.append("kb_memory_store", {"fact": "Refusalcase gamma: the third item is valid"})
    other = BridgeBuffer(buffer, token_fingerprint("someone-else"))
    foreign, _ = other.append("kb_memory_store", {"fact": "Refusalcase delta: another token's item"})

    async def session_steps(session: ClientSession) -> Any:
        return payload(await session.call_tool(STATUS_TOOL, {}))

    status = with_bridge(server.url, token, buffer, session_steps)
    assert status["remote"] == "ok"
    # the item that can never be stored is set aside with the server's refusal; the one after it was sent
    assert status["pending"] == 0
    assert status["rejected"] == 1
    assert status["blocked_by"] is None
    rejected = [json.loads(line) for line in Path(f"{buffer}.rejected").read_text().splitlines() if line.strip()]
    assert [r["id"] for r in rejected] == [bad["id"]]
    assert "fact" in rejected[0]["rejected_reason"]
    assert "other_tokens_pending" not in status  # other tokens' queues are not the caller's business
    # the file: only the other token's item is left, untouched
    assert [i["id"] for i in buffer_items(buffer)] == [foreign["id"]]
    _, recalled = call(server.url, token, "kb_memory_recall", {"query": "refusalcase", "limit": 10})
    contents = {f["content"] for f in recalled["facts"]}
    assert "Refusalcase alpha: the first item is valid" in contents
    assert "Refusalcase gamma: the third item is valid" in contents
    assert not any("delta" in c or "beta" in c for c in contents)
    assert {first["id"], third["id"]}.isdisjoint({i["id"] for i in buffer_items(buffer)})


def test_a_switched_off_assignment_keeps_its_items_and_the_others_go_on(server: Server, tmp_path: Path) -> None:
    token = server.token("asg-bridge-on", "acme", "--assignment", "asg-bridge-off")["token"]
    buffer = tmp_path / "bridge-buffer.jsonl"
    queue = BridgeBuffer(buffer, token_fingerprint(token))
    off_first, _ = queue.append(
        "kb_memory_store", {"fact": "Switchcase one: kept while off", "assignment": "asg-bridge-off"}
    )
    on_item, _ = queue.append(
        "kb_memory_store", {"fact": "Switchcase two: sent meanwhile", "assignment": "asg-bridge-on"}
    )
    off_second, _ = queue.append(
        "kb_memory_store", {"fact": "Switchcase three: after the first", "assignment": "asg-bridge-off"}
    )
    assert server.cli("assignment", "disable", "asg-bridge-off", "--org", "acme").returncode == 0

    async def status_of(session: ClientSession) -> Any:
        return payload(await session.call_tool(STATUS_TOOL, {}))

    status = with_bridge(server.url, token, buffer, status_of)
    assert status["pending"] == 2
    assert status["rejected"] == 0
    assert status["blocked_by"]["queue_id"] == off_first["id"]
    assert [i["id"] for i in buffer_items(buffer)] == [off_first["id"], off_second["id"]]

    assert server.cli("assignment", "enable", "asg-bridge-off", "--org", "acme").returncode == 0
    status = with_bridge(server.url, token, buffer, status_of)
    assert status["pending"] == 0
    assert status["blocked_by"] is None
    assert buffer_items(buffer) == []
    _, recalled = call(
        server.url, token, "kb_memory_recall", {"query": "switchcase", "limit": 10, "assignment": "asg-bridge-off"}
    )
    assert {f["content"] for f in recalled["facts"]} == {
        "Switchcase one: kept while off",
        "Switchcase three: after the first",
    }
    assert on_item["id"] not in {i["id"] for i in buffer_items(buffer)}


def test_an_invalid_token_is_an_error_and_nothing_is_queued(server: Server, tmp_path: Path) -> None:
    buffer = tmp_path / "bridge-buffer.jsonl"
    bogus = "osam_0123456789abcdef_" + "A" * 43

    async def steps(session: ClientSession) -> tuple[CallToolResult, Any]:
        stored = await session.call_tool("kb_memory_store", {"fact": "never stored with a bad token"})
        status = payload(await session.call_tool(STATUS_TOOL, {}))
        return stored, status

    stored, status = with_bridge(server.url, bogus, buffer, steps)
    text = error_text(stored)
    assert "401" in text
    assert "token" in text
    assert "queued" in text  # "Nothing was stored or queued."
    assert status["remote"] == "unauthorized"
    assert buffer_items(buffer) == []


def test_the_bridge_needs_a_token_and_an_http_url(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OSA_MEMORY_TOKEN"}
    base = [sys.executable, "-m", "haystack_osa_memory.mcp.stdio_bridge", "--buffer", str(tmp_path / "b.jsonl")]
    done = subprocess.run(
        [*base, "--url", "http://127.0.0.1:1/mcp"], env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 2
    assert "OSA_MEMORY_TOKEN" in done.stderr
    assert done.stdout == ""
    done = subprocess.run(
        [*base, "--url", "ftp://example.com/mcp"],
        env={**env, "OSA_MEMORY_TOKEN": "t"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert "--url" in done.stderr
    done = subprocess.run(  # a client that did not expand ${OSA_MEMORY_TOKEN} in its config
        [*base, "--url", "http://127.0.0.1:1/mcp"],
        env={**env, "OSA_MEMORY_TOKEN": "${OSA_MEMORY_TOKEN}"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert "unexpanded placeholder" in done.stderr


def test_the_buffer_survives_a_torn_line_and_keeps_other_tokens_items(tmp_path: Path) -> None:
    buffer = tmp_path / "deep" / "bridge-buffer.jsonl"
    mine = BridgeBuffer(buffer, token_fingerprint("mine"))
    theirs = BridgeBuffer(buffer, token_fingerprint("theirs"))
    a, pending = mine.append("kb_memory_store", {"fact": "alpha fact"})
    assert pending == 1
    t, _ = theirs.append("kb_memory_store", {"fact": "their fact"})
    with buffer.open("ab") as f:  # a crash in the middle of an append
        f.write(b'{"id": "torn", "tool": "kb_memo')
    b, pending = mine.append("kb_memory_propose", {"kind": "fact", "title": "beta", "body": "beta body"})
    assert pending == 2
    assert [i["id"] for i in mine.pending()] == [a["id"], b["id"]]
    assert [i["id"] for i in theirs.pending()] == [t["id"]]
    assert mine.remove(a["id"]) == 1
    lines = buffer.read_text().splitlines()
    assert len(lines) == 3  # their item, the torn line (kept verbatim), beta
    assert lines[1].startswith('{"id": "torn"')
    facts, searched = mine.search("beta", 5, None)
    assert (facts, searched) == ([], 0)  # proposals are not recalled: they wait for a human
    assert stat.S_IMODE(buffer.stat().st_mode) == 0o600
    assert stat.S_IMODE(buffer.parent.stat().st_mode) == 0o700


def test_outages_and_refusals_are_told_apart(tmp_path: Path) -> None:
    """5xx and silence are outages (stores queued); 401 and other 4xx are not (nothing queued)."""
    import http.server
    import socket
    import threading

    from haystack_osa_memory.mcp.stdio_bridge import Bridge

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(int(self.path.strip("/").split("/")[0]))
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    silent = socket.socket()  # accepts connections, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    base = f"http://127.0.0.1:{web.server_address[1]}"
    cases = {
        "503": (f"{base}/503/mcp", "unreachable", True, "HTTP 503"),
        "silent": (f"http://127.0.0.1:{silent.getsockname()[1]}/mcp", "unreachable", True, "within 1 s"),
        "401": (f"{base}/401/mcp", "unauthorized", False, "invalid, expired or revoked"),
        "404": (f"{base}/404/mcp", "error", False, "HTTP 404"),
        "403": (f"{base}/403/mcp", "error", False, "HTTP 403"),
    }

    async def main() -> dict[str, tuple[CallToolResult, str, int]]:
        out = {}
        for label, (url, *_) in cases.items():
            bridge = Bridge(url, "tok", tmp_path / f"{label}.jsonl", connect_timeout=1.0, call_timeout=2.0)
            result = await bridge.call_tool("kb_memory_store", {"fact": f"outage case {label}"})
            out[label] = (result, bridge.remote_state, len(bridge.buffer.pending()))
        return out

    try:
        results = anyio.run(main)
    finally:
        web.shutdown()
        web.server_close()
        silent.close()
    for label, (_, state, queued, text) in cases.items():
        result, got_state, pending = results[label]
        assert got_state == state, label
        if queued:
            answer = payload(result)
            assert answer["queued"] is True, label
            assert text in answer["reason"], label
            assert pending == 1, label
        else:
            assert text in error_text(result), label
            assert "Nothing was stored or queued" in error_text(result), label
            assert pending == 0, label
