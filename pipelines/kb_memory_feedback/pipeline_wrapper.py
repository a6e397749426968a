"""MCP tool `kb_memory_feedback`: confirm or flag a fact."""

from typing import Annotated, Any, Literal

from pydantic import Field
from starlette.datastructures import Headers

from haystack_osa_memory.auth import caller_for
from haystack_osa_memory.tool_wrapper import AssignmentArgument, MemoryToolWrapper


class PipelineWrapper(MemoryToolWrapper):
    def run_api(
        self,
        document_id: Annotated[str, Field(min_length=64, max_length=64)],
        verdict: Literal["confirm", "flag"],
        note: Annotated[str | None, Field(min_length=1, max_length=500)] = None,
        assignment: AssignmentArgument = None,
        headers: Headers | None = None,
    ) -> dict[str, Any]:
        """Confirm a fact that proved right, or flag one that proved wrong; one vote per run and fact.

        Args:
            document_id: The fact's 64-character id.
            verdict: confirm or flag.
            note: Optional reason, at most 500 characters, without secrets.
            assignment: Optional assignment to act on, one granted to your token (default: its first).
        """
        return self.memory.feedback(document_id, verdict, note, caller=caller_for(assignment, headers))
