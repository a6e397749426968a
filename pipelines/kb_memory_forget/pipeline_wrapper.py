"""MCP tool `kb_memory_forget`: retract a fact."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import MemoryToolWrapper, tool_api
from haystack_osa_memory.tools import FORGET, ForgetArguments


class PipelineWrapper(MemoryToolWrapper):
    @tool_api(FORGET)
    def run_api(self, args: ForgetArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.FORGET` (arguments, limits, descriptions)."""
        return self.memory.forget(args.document_id, args.reason, caller=caller_for(args.assignment, headers))
