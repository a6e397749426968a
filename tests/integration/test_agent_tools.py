"""A Haystack Agent using the memory tools, with the scope injected from state (never from the model)."""

from __future__ import annotations

import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_osa_memory import Caller, Memory
from haystack_osa_memory.agent_tools import SCOPE_STATE_KEY, memory_tools

pytestmark = pytest.mark.integration


def _agent(memory: Memory, replies: list[ChatMessage]) -> Agent:
    agent = Agent(
        chat_generator=MockChatGenerator(responses=replies),
        tools=memory_tools(memory),
        state_schema={SCOPE_STATE_KEY: {"type": dict}},
    )
    agent.warm_up()
    return agent


def test_tool_schemas_hide_the_scope(memory: Memory) -> None:
    for tool in memory_tools(memory):
        assert "state" not in tool.parameters["properties"]
        assert SCOPE_STATE_KEY not in tool.parameters["properties"]


def test_agent_stores_and_recalls_in_its_scope(memory: Memory, alice: Caller, bob: Caller) -> None:
    store_call = ToolCall(tool_name="kb_memory_store", arguments={"fact": "The agent learned: CI uses Python 3.11"})
    agent = _agent(memory, [ChatMessage.from_assistant(tool_calls=[store_call]), ChatMessage.from_assistant("Done.")])
    result = agent.run(
        messages=[ChatMessage.from_user("Remember the CI Python version")],
        osa_scope={"org_id": alice.org_id, "assignment_id": alice.assignment_id},
    )
    assert result["messages"][-1].text == "Done."
    assert [f["content"] for f in memory.recall("CI Python", caller=alice)["facts"]] == [
        "The agent learned: CI uses Python 3.11"
    ]
    assert memory.recall("CI Python", caller=bob)["facts"] == []


def test_the_model_cannot_choose_the_scope(memory: Memory, alice: Caller, bob: Caller) -> None:
    forged = ToolCall(
        tool_name="kb_memory_store",
        arguments={"fact": "Forged into bob", "state": {"osa_scope": {"org_id": "acme", "assignment_id": "asg-beta"}}},
    )
    agent = _agent(memory, [ChatMessage.from_assistant(tool_calls=[forged]), ChatMessage.from_assistant("ok")])
    agent.run(messages=[ChatMessage.from_user("x")], osa_scope={"org_id": "acme", "assignment_id": "asg-alpha"})
    assert memory.recall("forged bob", caller=bob)["facts"] == []
    assert [f["content"] for f in memory.recall("forged bob", caller=alice)["facts"]] == ["Forged into bob"]


def test_no_scope_in_state_fails_closed(memory: Memory, alice: Caller) -> None:
    call = ToolCall(tool_name="kb_memory_store", arguments={"fact": "Nowhere to go"})
    agent = _agent(memory, [ChatMessage.from_assistant(tool_calls=[call]), ChatMessage.from_assistant("ok")])
    result = agent.run(messages=[ChatMessage.from_user("x")])
    tool_results = [m for m in result["messages"] if m.tool_call_result is not None]
    assert tool_results
    assert tool_results[0].tool_call_result.error
    assert memory.recall("nowhere", caller=alice)["facts"] == []


def test_agent_supersedes_and_recalls_as_of(memory: Memory, alice: Caller) -> None:
    """The Agent's tools take what the MCP tools take: `supersedes`, `valid_from`, `as_of`."""
    old = memory.store("CI uses Python 3.11", caller=alice, valid_from="2026-01-05")["document_id"]
    store_call = ToolCall(
        tool_name="kb_memory_store",
        arguments={"fact": "CI now uses Python 3.13", "supersedes": [old], "valid_from": "2026-03-01"},
    )
    recall_call = ToolCall(tool_name="kb_memory_recall", arguments={"query": "CI Python", "as_of": "2026-02-01"})
    replies = [
        ChatMessage.from_assistant(tool_calls=[store_call]),
        ChatMessage.from_assistant(tool_calls=[recall_call]),
        ChatMessage.from_assistant("Done."),
    ]
    result = _agent(memory, replies).run(
        messages=[ChatMessage.from_user("Python changed")],
        osa_scope={"org_id": alice.org_id, "assignment_id": alice.assignment_id},
    )
    assert memory.read(old, caller=alice)["status"] == "superseded"
    assert [f["content"] for f in memory.recall("CI Python", caller=alice)["facts"]] == ["CI now uses Python 3.13"]
    recalled = [m for m in result["messages"] if m.tool_call_result is not None][-1].tool_call_result
    assert recalled is not None
    assert "CI uses Python 3.11" in recalled.result
    assert "3.13" not in recalled.result
