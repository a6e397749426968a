"""`DirectToolCalls`: a plain ``tools/call`` answered without the MCP SDK's per-request session gets the very
bytes the SDK would send (success, tool error, unknown tool, structured content), and every other request
still goes through the SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hayhooks.server.utils.mcp_utils import create_starlette_app
from mcp import types
from mcp.server.lowlevel import Server
from starlette.testclient import TestClient

from haystack_osa_memory.caller import Caller, current_caller
from haystack_osa_memory.mcp.server import BearerAuthMiddleware, DirectToolCalls

CALLER = Caller(org_id="acme", assignment_id="asg-1", specialist_id="spec-1")
HEADERS = {
    "Authorization": "Bearer t",
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}


def mcp_server() -> Server:
    server = Server("direct-test")
    tool = types.Tool(name="echo", inputSchema={"type": "object"}, outputSchema={"type": "object"})

    @server.list_tools()  # type: ignore[untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        return [tool]

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def call_tool(name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        if name != "echo":
            raise ValueError(f"Unknown tool '{name}'")
        if (arguments or {}).get("fail"):
            raise RuntimeError("the tool failed")
        caller = current_caller()
        answer = {"said": (arguments or {}).get("say"), "assignment": caller.assignment_id if caller else None}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(answer))], structuredContent=answer
        )

    return server


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, TestClient]]:
    # Hayhooks configures Haystack's tracer as it builds the app: leave the process's tracer as it was.
    from hayhooks.settings import settings as hayhooks_settings
    from haystack.tracing.tracer import disable_tracing

    monkeypatch.setattr(hayhooks_settings, "tracing_include_haystack_spans", False)
    server = mcp_server()
    via_sdk = BearerAuthMiddleware(create_starlette_app(server, json_response=True), lambda token: CALLER)
    direct = BearerAuthMiddleware(
        create_starlette_app(server, json_response=True), lambda token: CALLER, DirectToolCalls(server)
    )
    try:
        with TestClient(via_sdk) as a, TestClient(direct) as b:  # type: ignore[arg-type]
            yield a, b
    finally:
        disable_tracing()


def call(client: TestClient, body: Any, **headers: str) -> tuple[int, str, bytes]:
    r = client.post("/mcp", content=json.dumps(body).encode(), headers={**HEADERS, **headers})
    return r.status_code, r.headers.get("content-type", ""), r.content


@pytest.mark.parametrize(
    "params",
    [
        {"name": "echo", "arguments": {"say": "hello"}},
        {"name": "echo", "arguments": {"fail": True}},
        {"name": "nope", "arguments": {}},
        {"name": "echo"},
        {"name": "echo", "arguments": {"say": "ü 𝄞 \u2028"}, "_meta": {"progressToken": 7}},
    ],
)
@pytest.mark.parametrize("request_id", [1, "abc-1"])
def test_the_same_bytes_as_the_sdk(clients: tuple[TestClient, TestClient], params: Any, request_id: Any) -> None:
    via_sdk, direct = clients
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    expected = call(via_sdk, body)
    assert expected[0] == 200
    assert call(direct, body) == expected


def test_the_caller_is_the_token_s(clients: tuple[TestClient, TestClient]) -> None:
    _, direct = clients
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
    answer = json.loads(call(direct, body)[2])
    assert answer["result"]["structuredContent"]["assignment"] == "asg-1"


@pytest.mark.parametrize(
    "body",
    [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo"}},  # a notification
        [{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}],  # a batch
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}},  # no name
        {"jsonrpc": "1.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}},
        {"jsonrpc": "2.0", "id": None, "method": "tools/call", "params": {"name": "echo"}},
    ],
)
def test_anything_else_is_left_to_the_sdk(body: Any) -> None:
    server = mcp_server()
    assert DirectToolCalls(server).takes({b"accept": b"application/json", b"content-type": b"application/json"})
    import anyio

    assert anyio.run(DirectToolCalls(server).answer, json.dumps(body).encode()) is None


@pytest.mark.parametrize(
    "headers",
    [
        {b"accept": b"text/event-stream", b"content-type": b"application/json"},
        {b"accept": b"application/json", b"content-type": b"text/plain"},
        {b"accept": b"application/json", b"content-type": b"application/json", b"mcp-protocol-version": b"1999-01-01"},
        {b"accept": b"application/json", b"content-type": b"Application/JSON"},
    ],
)
def test_headers_the_sdk_would_refuse_are_left_to_it(headers: dict[bytes, bytes]) -> None:
    assert not DirectToolCalls(mcp_server()).takes(headers)
