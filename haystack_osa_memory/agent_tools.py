"""Memory tools for a Haystack `Agent`, with the scope injected from the agent's state.

The model chooses *what* to store or recall, never *where*: each tool takes the whole `State`
(Haystack injects it after the model's arguments, so a model cannot override it) and reads the
caller's scope from it. A scope missing from the state fails closed.

Usage:
```python
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage
from haystack_osa_memory import Memory
from haystack_osa_memory.agent_tools import SCOPE_STATE_KEY, memory_tools

memory = Memory()
agent = Agent(
    chat_generator=my_chat_generator,           # any Haystack chat generator that supports tools
    tools=memory_tools(memory),
    state_schema={SCOPE_STATE_KEY: {"type": dict}},
)
agent.run(
    messages=[ChatMessage.from_user("Remember that staging deploys need the VPN.")],
    osa_scope={"org_id": "acme", "assignment_id": "asg-42"},   # from your auth, not from the model
)
```
"""

from __future__ import annotations

from typing import Annotated, Any

from haystack.components.agents.state.state import State
from haystack.tools.from_function import create_tool_from_function
from haystack.tools.tool import Tool

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.errors import ScopeError
from haystack_osa_memory.memory import Memory

#: The agent-state key that holds `{"org_id": ..., "assignment_id": ..., "specialist_id": ...}`.
SCOPE_STATE_KEY = "osa_scope"


def _caller(state: State, key: str) -> Caller:
    scope = state.get(key) if state.has(key) else None
    if not isinstance(scope, dict) or "org_id" not in scope or "assignment_id" not in scope:
        msg = f"no memory scope in the agent state: pass {key}={{'org_id': ..., 'assignment_id': ...}} to Agent.run"
        raise ScopeError(msg)
    return Caller(
        org_id=scope["org_id"],
        assignment_id=scope["assignment_id"],
        specialist_id=scope.get("specialist_id"),
        token_id=scope.get("run_id"),
    )


def memory_tools(memory: Memory, state_key: str = SCOPE_STATE_KEY) -> list[Tool]:
    """`kb_memory_store` and `kb_memory_recall` as Haystack tools bound to ``memory``."""

    def kb_memory_store(
        fact: Annotated[str, "The fact to remember, 1 to 2000 characters, self-contained."],
        state: State,
        topic: Annotated[str | None, "Optional short topic, at most 120 characters."] = None,
    ) -> dict[str, Any]:
        """Store a durable fact in the memory of the assignment you are working on, for later sessions."""
        return memory.store(fact, topic, caller=_caller(state, state_key))

    def kb_memory_recall(
        query: Annotated[str, "What you want to remember: a question or keywords, 1 to 1000 characters."],
        state: State,
        limit: Annotated[int, "How many facts to return, 1 to 20."] = 8,
    ) -> dict[str, Any]:
        """Recall facts stored earlier in the memory of the assignment you are working on, best match first."""
        return memory.recall(query, limit, caller=_caller(state, state_key))

    return [create_tool_from_function(kb_memory_store), create_tool_from_function(kb_memory_recall)]
