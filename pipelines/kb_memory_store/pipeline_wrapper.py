"""MCP tool `kb_memory_store`: a thin Hayhooks wrapper over the package's store pipeline."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.mcp.auth import caller_for
from haystack_osa_memory.mcp.wrapper import MemoryToolWrapper, tool_api
from haystack_osa_memory.tools import STORE, StoreArguments


class PipelineWrapper(MemoryToolWrapper):
    def setup(self) -> None:
        super().setup()
        self.pipeline = self.memory.store_pipeline

    @tool_api(STORE)
    def run_api(self, args: StoreArguments, headers: Headers | None) -> dict[str, Any]:
        """Hayhooks serves the signature and docstring of `tools.STORE` (arguments, limits, descriptions)."""
        return self.memory.store_arguments(args, caller=caller_for(args.assignment, headers))
