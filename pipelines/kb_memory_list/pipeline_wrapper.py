"""MCP tool `kb_memory_list`: page through the assignment's facts."""

from typing import Annotated, Any, Literal

from pydantic import Field
from starlette.datastructures import Headers

from haystack_osa_memory.auth import caller_for
from haystack_osa_memory.tool_wrapper import AssignmentArgument, MemoryToolWrapper


class PipelineWrapper(MemoryToolWrapper):
    def run_api(
        self,
        status: Literal["approved", "proposed", "flagged", "rejected"] | None = None,
        topic: Annotated[str | None, Field(min_length=1, max_length=120)] = None,
        cursor: Annotated[str | None, Field(min_length=1, max_length=500)] = None,
        assignment: AssignmentArgument = None,
        headers: Headers | None = None,
    ) -> dict[str, Any]:
        """List this assignment's facts, 20 per page, oldest first; pass next_cursor back for the next page.

        Args:
            status: Only facts with this status (default: all but retracted ones).
            topic: Only facts with this topic.
            cursor: The next_cursor of the previous page.
            assignment: Optional assignment to act on, one granted to your token (default: its first).
        """
        return self.memory.list_facts(status, topic, cursor, caller=caller_for(assignment, headers))
