"""What the Hayhooks wrappers in `pipelines/` share: the process-wide `Memory` and the `assignment` argument.

Hayhooks builds each MCP tool's input schema from its wrapper's `run_api` signature, so every tool
keeps its own `run_api`; the setup and the argument constraints live here once.
"""

from __future__ import annotations

from typing import Annotated

from hayhooks import BasePipelineWrapper
from pydantic import Field

from haystack_osa_memory.memory import Memory, shared_memory

#: The optional `assignment` argument of a tool: one of the assignments the caller's token grants.
AssignmentArgument = Annotated[str | None, Field(min_length=1, max_length=128)]


class MemoryToolWrapper(BasePipelineWrapper):  # type: ignore[misc]
    """A Hayhooks pipeline wrapper that serves one memory tool from the process-wide `Memory`."""

    memory: Memory

    def setup(self) -> None:
        self.memory = shared_memory()
        self.memory.warm_up()
