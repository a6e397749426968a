"""MCP tool `kb_memory_reflect`: consolidate repeated facts of the assignment."""

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
        """Consolidate near-duplicate and repeated facts of this assignment into observations; reports what changed.

        Args:
            assignment: Optional assignment to act on, one granted to your token (default: its first).
        """
        return self.memory.reflect(caller=caller_for(assignment, headers))
