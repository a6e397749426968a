"""MCP tool `kb_memory_recall`: a thin Hayhooks wrapper over the package's recall pipeline."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import MemoryToolWrapper, tool_api
from haystack_osa_memory.tools import RECALL, RecallArguments


class PipelineWrapper(MemoryToolWrapper):
    def setup(self) -> None:
        super().setup()
        self.pipeline = self.memory.recall_pipeline

    @tool_api(RECALL)
    def run_api(self, args: RecallArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.RECALL` (arguments, limits, descriptions)."""
        return self.memory.recall_arguments(args, caller=caller_for(args.assignment, headers))
