"""MCP tool `kb_memory_list`: page through the assignment's facts."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import MemoryToolWrapper, tool_api
from haystack_osa_memory.tools import LIST, ListArguments


class PipelineWrapper(MemoryToolWrapper):
    @tool_api(LIST)
    def run_api(self, args: ListArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.LIST` (arguments, limits, descriptions)."""
        return self.memory.list_facts(args.status, args.topic, args.cursor, caller=caller_for(args.assignment, headers))
