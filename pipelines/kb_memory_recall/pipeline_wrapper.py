"""MCP tool `kb_memory_recall`: a thin Hayhooks wrapper over the package's recall pipeline."""

from typing import Annotated, Any

from pydantic import Field
from starlette.datastructures import Headers

from haystack_osa_memory.auth import caller_for
from haystack_osa_memory.tool_wrapper import AssignmentArgument, MemoryToolWrapper


class PipelineWrapper(MemoryToolWrapper):
    def setup(self) -> None:
        super().setup()
        self.pipeline = self.memory.recall_pipeline

    def run_api(
        self,
        query: Annotated[str, Field(min_length=1, max_length=1000)],
        limit: Annotated[int, Field(ge=1, le=20)] = 8,
        assignment: AssignmentArgument = None,
        headers: Headers | None = None,
    ) -> dict[str, Any]:
        """Recall facts stored earlier in the memory of the assignment you are working on, best match first.

        Only this assignment's facts are searched. Returns {"assignment_id": ..., "facts": [{"document_id",
        "content", "topic", "score", "stored_at"}]}, plus "degraded" when only keyword search could answer.

        Args:
            query: What you want to remember, 1 to 1000 characters (a question or keywords).
            limit: How many facts to return, 1 to 20 (default 8).
            assignment: Optional assignment to act on, one granted to your token (default: its first).
        """
        return self.memory.recall(query, limit, caller=caller_for(assignment, headers))
