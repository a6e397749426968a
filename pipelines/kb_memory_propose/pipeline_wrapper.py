"""MCP tool `kb_memory_propose`: propose a fact for human review."""

from typing import Annotated, Any, Literal

from pydantic import Field
from starlette.datastructures import Headers

from haystack_osa_memory.auth import caller_for
from haystack_osa_memory.tool_wrapper import AssignmentArgument, MemoryToolWrapper

Path = Annotated[str, Field(min_length=1, max_length=300)]
Persona = Annotated[str, Field(min_length=1, max_length=60)]


class PipelineWrapper(MemoryToolWrapper):
    def setup(self) -> None:
        super().setup()
        self.pipeline = self.memory.store_pipeline

    def run_api(
        self,
        kind: Literal["fact", "procedure", "pitfall", "preference", "reference"],
        title: Annotated[str, Field(min_length=1, max_length=120)],
        body: Annotated[str, Field(min_length=1, max_length=2000)],
        paths: Annotated[list[Annotated[str, Field(min_length=1, max_length=300)]] | None, Field(max_length=20)] = None,
        personas: Annotated[
            list[Annotated[str, Field(min_length=1, max_length=60)]] | None, Field(max_length=10)
        ] = None,
        assignment: AssignmentArgument = None,
        headers: Headers | None = None,
    ) -> dict[str, Any]:
        """Propose knowledge for this assignment; it is recalled only after a human accepts it.

        Args:
            kind: fact, procedure, pitfall, preference or reference.
            title: Short title, at most 120 characters.
            body: The knowledge itself, at most 2000 characters, without secrets.
            paths: Optional files or folders it concerns (at most 20).
            personas: Optional roles it is meant for (at most 10).
            assignment: Optional assignment to act on, one granted to your token (default: its first).
        """
        return self.memory.propose(kind, title, body, paths, personas, caller=caller_for(assignment, headers))
