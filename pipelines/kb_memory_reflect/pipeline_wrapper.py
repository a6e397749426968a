"""MCP tool `kb_memory_reflect`: consolidate repeated facts of the assignment."""

from typing import Annotated, Any

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
        assignment: Annotated[str | None, Field(min_length=1, max_length=128)] = None,
        headers: Headers | None = None,
    ) -> dict[str, Any]:
        """Consolidate near-duplicate and repeated facts of this assignment into observations; reports what changed.

        Args:
            assignment: Optional assignment to act on, one granted to your token (default: its first).
        """
        return self.memory.reflect(caller=caller_for(assignment, headers))
