"""MCP tool `kb_memory_propose`: propose a fact for human review."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import MemoryToolWrapper, tool_api
from haystack_osa_memory.tools import PROPOSE, ProposeArguments


class PipelineWrapper(MemoryToolWrapper):
    def setup(self) -> None:
        super().setup()
        self.pipeline = self.memory.store_pipeline

    @tool_api(PROPOSE)
    def run_api(self, args: ProposeArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.PROPOSE` (arguments, limits, descriptions)."""
        return self.memory.propose(
            args.kind, args.title, args.body, args.paths, args.personas, caller=caller_for(args.assignment, headers)
        )
