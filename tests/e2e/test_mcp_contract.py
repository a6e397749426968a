"""`osa-memory serve` publishes each tool's declared contract: input and output schemas, structured results."""

from __future__ import annotations

import json
import typing
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.types import CallToolResult
from pydantic import BaseModel

from haystack_osa_memory import tools
from tests.e2e.conftest import Server, with_session

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def _without_title(schema: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in schema.items() if key != "title"}


def _undeclared(model: type[BaseModel], data: Any, path: str = "") -> list[str]:
    """Keys of ``data`` that ``model`` does not declare, at any depth (nested models and lists of them)."""
    if not isinstance(data, dict):
        return []
    missing = [f"{path}{key}" for key in data if key not in model.model_fields]
    for key, field in model.model_fields.items():
        value = data.get(key)
        for arg in (field.annotation, *typing.get_args(field.annotation)):
            nested = typing.get_args(arg) or (arg,)
            for candidate in nested:
                if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                    items = value if isinstance(value, list) else [value]
                    for i, item in enumerate(items):
                        missing += _undeclared(candidate, item, f"{path}{key}[{i}].")
    return sorted(set(missing))


def test_tools_list_publishes_the_declared_schemas(server: Server) -> None:
    token = server.token("asg-contract-list")["token"]

    async def listed(session: ClientSession) -> dict[str, Any]:
        return {t.name: t for t in (await session.list_tools()).tools}

    served = with_session(server.url, token, listed)
    assert set(served) == set(tools.SPECS)
    for name, spec in tools.SPECS.items():
        tool = served[name]
        assert tool.description == spec.description
        assert _without_title(tool.inputSchema) == _without_title(spec.Arguments.model_json_schema()), name
        assert tool.outputSchema == spec.Result.model_json_schema(), name

    # on the wire too, for clients that read the JSON themselves
    response = httpx.post(
        server.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
        timeout=30,
    )
    assert response.status_code == 200
    # one JSON body, not an SSE stream: a stateless call has nothing to stream
    assert response.headers["content-type"].startswith("application/json")
    assert len(response.json()["result"]["tools"]) == len(tools.SPECS)
    assert response.text.count('"outputSchema"') == len(tools.SPECS)


def test_every_tool_answers_with_structured_content_equal_to_its_text(server: Server) -> None:
    token = server.token("asg-contract")["token"]
    fact = "The deploy pipeline needs the staging VPN profile stg-eu"
    results: dict[str, list[CallToolResult]] = {}

    async def run(session: ClientSession) -> None:
        async def call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
            result = await session.call_tool(tool, arguments)  # the client validates against outputSchema
            assert not result.isError, (tool, result.content)
            results.setdefault(tool, []).append(result)
            data: dict[str, Any] = json.loads("".join(getattr(c, "text", "") for c in result.content))
            return data

        stored = await call("kb_memory_store", {"fact": fact, "topic": "deploy", "ttl_days": 30})
        await call("kb_memory_store", {"fact": fact + "!", "kind": "procedure"})  # a near-duplicate
        await call("kb_memory_store", {"fact": "Ping 10.1.2.3 before a deploy", "topic": "host 10.1.2.4"})
        await call("kb_memory_recall", {"query": "staging VPN profile", "limit": 3})
        await call("kb_memory_recall", {"query": "nothing matches this"})
        doc = stored["document_id"]
        await call("kb_memory_feedback", {"document_id": doc, "verdict": "flag", "note": "outdated"})
        proposed = await call("kb_memory_propose", {"kind": "pitfall", "title": "VPN", "body": "Renew it weekly"})
        assert proposed["status"] == "proposed"
        rejected = await call("kb_memory_propose", {"kind": "fact", "title": "Again", "body": fact})
        assert "rejected" in rejected
        await call("kb_memory_list", {})
        await call("kb_memory_list", {"status": "proposed"})
        reflected = await call("kb_memory_reflect", {})
        assert reflected["changed"] is True
        observation = (reflected["observations_created"] or reflected["observations_updated"])[0]
        read = await call("kb_memory_read", {"document_id": observation})
        assert read["evidence"]
        consolidated = await call("kb_memory_read", {"document_id": doc})
        assert consolidated["status"] in tools.STATUSES
        await call("kb_memory_status", {})
        await call("kb_memory_scopes", {})
        await call("kb_memory_forget", {"document_id": doc, "reason": "moved"})

        # an error carries no structured content
        failed = await session.call_tool("kb_memory_read", {"document_id": "e" * 64})
        assert failed.isError
        assert failed.structuredContent is None

    with_session(server.url, token, run)
    assert set(results) == set(tools.SPECS)
    for name, answers in results.items():
        spec = tools.SPECS[name]
        for result in answers:
            text = "".join(getattr(c, "text", "") for c in result.content)
            assert result.structuredContent == json.loads(text), name
            spec.Result.model_validate(result.structuredContent)
            assert _undeclared(spec.Result, result.structuredContent) == [], name
