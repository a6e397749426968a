"""MCP tool `kb_memory_list`: page through the assignment's facts."""

from typing import Annotated, Any, Literal

from hayhooks import BasePipelineWrapper
from pydantic import Field
from starlette.datastructures import Headers

from haystack_osa_memory import shared_memory
from haystack_osa_memory.auth import caller_for


class PipelineWrapper(BasePipelineWrapper):
    def setup(self) -> None:
        self.memory = shared_memory()
        self.memory.warm_up()

    def run_api(
        self,
        status: Literal["approved", "proposed", "flagged", "rejected"] | None = None,
        topic: Annotated[str | None, Field(min_length=1, max_length=120)] = None,
        cursor: Annotated[str | None, Field(min_length=1, max_length=500)] = None,
        assignment: Annotated[str | None, Field(min_length=1, max_length=128)] = None,
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
