"""MCP tool `kb_memory_status`: health of the memory for this caller."""

from typing import Any

from starlette.datastructures import Headers

from haystack_osa_memory.auth import caller_for
from haystack_osa_memory.tool_wrapper import AssignmentArgument, MemoryToolWrapper


class PipelineWrapper(MemoryToolWrapper):
    def run_api(
        self,
        assignment: AssignmentArgument = None,
        headers: Headers | None = None,
    ) -> dict[str, Any]:
        """Report the memory's health: database state, your scope's buffered facts, embedder, your scope's size.

        Counts (pending, rejected, facts) cover only your org and assignment; no connection details are shown.

        Args:
            assignment: Optional assignment to report on, one granted to your token (default: its first).
        """
        return self.memory.status(caller=caller_for(assignment, headers))
