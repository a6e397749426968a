"""MCP tool `kb_memory_scopes`: the assignments the caller's token grants."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import MemoryToolWrapper, tool_api
from haystack_osa_memory.tools import SCOPES, ScopesArguments


class PipelineWrapper(MemoryToolWrapper):
    @tool_api(SCOPES)
    def run_api(self, args: ScopesArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.SCOPES` (no arguments)."""
        return self.memory.scopes(caller=caller_for(None, headers))
