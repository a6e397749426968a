"""MCP tool `kb_memory_store`: a thin Hayhooks wrapper over the package's store pipeline."""

from typing import Annotated, Any, Literal

from pydantic import Field
from starlette.datastructures import Headers

from haystack_osa_memory.auth import caller_for
from haystack_osa_memory.tool_wrapper import AssignmentArgument, MemoryToolWrapper


class PipelineWrapper(MemoryToolWrapper):
    def setup(self) -> None:
        super().setup()
        self.pipeline = self.memory.store_pipeline

    def run_api(
        self,
        fact: Annotated[str, Field(min_length=1, max_length=2000)],
        topic: Annotated[str | None, Field(min_length=1, max_length=120)] = None,
        kind: Literal["fact", "procedure", "pitfall", "preference", "reference"] = "fact",
        ttl_days: Annotated[int | None, Field(ge=1, le=3650)] = None,
        assignment: AssignmentArgument = None,
        headers: Headers | None = None,
    ) -> dict[str, Any]:
        """Store a durable fact in the memory of the assignment you are working on, for later sessions.

        Storing the same fact again updates it in place. The assignment comes from your access token.
        Returns identifiers only: {"stored": true, "assignment_id": ..., "document_id": ...}.

        Args:
            fact: The fact to remember, 1 to 2000 characters, self-contained (who/what/why).
            topic: Optional short topic to group facts, at most 120 characters.
            kind: What sort of knowledge this is: fact, procedure, pitfall, preference or reference.
            ttl_days: Optional time to live in days; afterwards the fact is returned marked stale.
            assignment: Optional assignment to act on, one granted to your token (default: its first).
        """
        return self.memory.store(fact, topic, kind=kind, ttl_days=ttl_days, caller=caller_for(assignment, headers))
