"""MCP tool `kb_memory_reflect`: consolidate repeated facts of the assignment."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import MemoryToolWrapper, tool_api
from haystack_osa_memory.tools import REFLECT, ReflectArguments


class PipelineWrapper(MemoryToolWrapper):
    @tool_api(REFLECT)
    def run_api(self, args: ReflectArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.REFLECT` (arguments, limits, descriptions)."""
        return self.memory.reflect(caller=caller_for(args.assignment, headers))
