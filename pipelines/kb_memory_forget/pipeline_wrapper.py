"""MCP tool `kb_memory_forget`: retract a fact."""

from typing import Annotated, Any

from pydantic import Field
from starlette.datastructures import Headers

from haystack_osa_memory.auth import caller_for
from haystack_osa_memory.tool_wrapper import AssignmentArgument, MemoryToolWrapper


class PipelineWrapper(MemoryToolWrapper):
    def run_api(
        self,
        document_id: Annotated[str, Field(min_length=64, max_length=64)],
        reason: Annotated[str, Field(min_length=1, max_length=500)],
        assignment: AssignmentArgument = None,
        headers: Headers | None = None,
    ) -> dict[str, Any]:
        """Retract a fact of this assignment for good: it is never recalled, read or listed again.

        Args:
            document_id: The fact's 64-character id.
            reason: Why it is retracted (kept for the audit), at most 500 characters.
            assignment: Optional assignment to act on, one granted to your token (default: its first).
        """
        return self.memory.forget(document_id, reason, caller=caller_for(assignment, headers))
