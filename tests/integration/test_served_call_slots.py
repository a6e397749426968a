"""The served app runs its calls' blocking work (token check, tool run) through `CallSlots`: with one slot, at
most one call's work is in a thread at a time, and concurrent recalls still get their own answers; the app takes
its slots from `OSA_MEMORY_CALL_SLOTS` and `OSA_MEMORY_CALL_LEASE`."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest

from haystack_osa_memory import Caller
from haystack_osa_memory import memory as memory_module
from haystack_osa_memory.mcp.call_slots import CallSlots
from haystack_osa_memory.mcp.server import BearerAuthMiddleware, create_app

pytestmark = pytest.mark.integration

HEADERS = {"authorization": "Bearer t", "accept": "application/json, text/event-stream"}


def _call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def test_one_slot_runs_one_calls_work_at_a_time_and_each_gets_its_answer(served_env: None, alice: Caller) -> None:
    lock = threading.Lock()
    running = most = 0

    def verify(token: str) -> Caller:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)  # long enough for the other calls to be waiting
        with lock:
            running -= 1
        return alice

    slots = CallSlots(1, lease=30.0)
    app = create_app(verify, slots=slots)
    memory = memory_module.shared_memory()
    facts = {f"tag{i}": f"The tag{i} service listens on port {9000 + i}" for i in range(4)}
    for text in facts.values():
        memory.store(text, "ops", caller=alice)

    async def calls() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return list(
                await asyncio.gather(
                    *(
                        client.post(
                            "/mcp", headers=HEADERS, json=_call(i, "kb_memory_recall", {"query": tag, "limit": 1})
                        )
                        for i, tag in enumerate(facts)
                    )
                )
            )

    answers = asyncio.run(calls())
    assert most == 1
    assert slots.expired == 0
    for response, (tag, text) in zip(answers, facts.items(), strict=True):
        assert response.status_code == 200, response.text
        result = response.json()["result"]
        assert result["structuredContent"]["facts"][0]["content"] == text, tag
        assert json.loads(result["content"][0]["text"]) == result["structuredContent"]


def test_the_app_takes_its_slots_from_the_configuration(
    served_env: None, alice: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OSA_MEMORY_CALL_SLOTS", "3")
    monkeypatch.setenv("OSA_MEMORY_CALL_LEASE", "0.25")
    app = create_app(lambda token: alice)
    assert isinstance(app, BearerAuthMiddleware)
    assert (app.slots.slots, app.slots.lease) == (3, 0.25)
