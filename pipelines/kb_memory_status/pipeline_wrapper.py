"""MCP tool `kb_memory_status`: health of the memory for this caller."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import MemoryToolWrapper, tool_api
from haystack_osa_memory.tools import STATUS, StatusArguments


class PipelineWrapper(MemoryToolWrapper):
    @tool_api(STATUS)
    def run_api(self, args: StatusArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.STATUS` (arguments, limits, descriptions)."""
        return self.memory.status(caller=caller_for(args.assignment, headers))
