"""MCP tool `kb_memory_scopes`: the assignments the caller's token grants."""

from typing import Any

from hayhooks import BasePipelineWrapper
from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import tool_api
from haystack_osa_memory.tools import SCOPES, ScopesArguments


class PipelineWrapper(BasePipelineWrapper):
    def setup(self) -> None:
        self.pipeline = None

    @tool_api(SCOPES)
    def run_api(self, args: ScopesArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.SCOPES` (no arguments)."""
        caller = caller_for(None, headers)
        return {
            "org_id": caller.org_id,
            "default_assignment": caller.assignment_id,
            "assignments": list(caller.grants),
        }
