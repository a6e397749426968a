"""MCP tool `kb_memory_feedback`: confirm or flag a fact."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import MemoryToolWrapper, tool_api
from haystack_osa_memory.tools import FEEDBACK, FeedbackArguments


class PipelineWrapper(MemoryToolWrapper):
    @tool_api(FEEDBACK)
    def run_api(self, args: FeedbackArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.FEEDBACK` (arguments, limits, descriptions)."""
        return self.memory.feedback(
            args.document_id, args.verdict, args.note, caller=caller_for(args.assignment, headers)
        )
