"""MCP tool `kb_memory_read`: one fact with its provenance."""

from typing import Annotated, Any

from pydantic import Field
from starlette.datastructures import Headers

from haystack_osa_memory.auth import caller_for
from haystack_osa_memory.tool_wrapper import AssignmentArgument, MemoryToolWrapper


class PipelineWrapper(MemoryToolWrapper):
    def run_api(
        self,
        document_id: Annotated[str, Field(min_length=64, max_length=64)],
        assignment: AssignmentArgument = None,
        headers: Headers | None = None,
    ) -> dict[str, Any]:
        """Read one fact of this assignment in full, with provenance, status and trust.

        Args:
            document_id: The 64-character id returned by kb_memory_store, kb_memory_recall or kb_memory_list.
            assignment: Optional assignment to act on, one granted to your token (default: its first).
        """
        return self.memory.read(document_id, caller=caller_for(assignment, headers))
