"""MCP tool `kb_memory_read`: one fact with its provenance."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import MemoryToolWrapper, tool_api
from haystack_osa_memory.tools import READ, ReadArguments


class PipelineWrapper(MemoryToolWrapper):
    @tool_api(READ)
    def run_api(self, args: ReadArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.READ` (arguments, limits, descriptions)."""
        return self.memory.read(args.document_id, caller=caller_for(args.assignment, headers))
