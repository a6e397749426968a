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

from collections.abc import Callable
from typing import Any, TypeVar

from haystack.components.agents.state.state import State
from haystack.tools.tool import Tool
from pydantic import BaseModel

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.errors import ScopeError
from haystack_osa_memory.memory import Memory
from haystack_osa_memory.tools import RECALL, STORE, RecallArguments, StoreArguments, ToolSpec

#: The agent-state key that holds `{"org_id": ..., "assignment_id": ..., "specialist_id": ...}`.
SCOPE_STATE_KEY = "osa_scope"

A = TypeVar("A", bound=BaseModel)


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


def tool_parameters(spec: ToolSpec[Any, Any]) -> dict[str, Any]:
    """The JSON schema of a tool's arguments for a model: the spec's, without `assignment` (the scope comes
    from the agent's state) and without pydantic's `title` keywords."""
    schema: dict[str, Any] = spec.Arguments.model_json_schema()
    schema.pop("title", None)
    properties = {
        name: {key: value for key, value in prop.items() if key != "title"}
        for name, prop in schema["properties"].items()
        if name != "assignment"
    }
    schema["properties"] = properties
    if "required" in schema:
        schema["required"] = [name for name in schema["required"] if name in properties]
    return schema


def _tool(spec: ToolSpec[A, Any], state_key: str, run: Callable[[A, Caller], dict[str, Any]]) -> Tool:
    """A Haystack tool for ``spec`` that runs ``run(arguments, caller)``, the caller taken from the state.

    The function's `State` parameter is injected by the Agent after the model's arguments (a `state` the
    model sends is replaced); the arguments are not validated here: `Memory` checks every value.
    """

    def function(state: State, **arguments: Any) -> dict[str, Any]:
        arguments.pop("assignment", None)
        return run(spec.Arguments.model_construct(**arguments), _caller(state, state_key))

    function.__name__ = spec.name
    return Tool(name=spec.name, description=spec.description, parameters=tool_parameters(spec), function=function)


def memory_tools(memory: Memory, state_key: str = SCOPE_STATE_KEY) -> list[Tool]:
    """`kb_memory_store` and `kb_memory_recall` as Haystack tools bound to ``memory`` (declared in `tools.py`)."""

    def store(args: StoreArguments, caller: Caller) -> dict[str, Any]:
        return memory.store_arguments(args, caller=caller)

    def recall(args: RecallArguments, caller: Caller) -> dict[str, Any]:
        return memory.recall_arguments(args, caller=caller)

    return [_tool(STORE, state_key, store), _tool(RECALL, state_key, recall)]
