"""MCP tool `kb_memory_scopes`: the assignments the caller's token grants."""

from typing import Any

from hayhooks import BasePipelineWrapper
from starlette.datastructures import Headers

from haystack_osa_memory.auth import caller_for


class PipelineWrapper(BasePipelineWrapper):
    def setup(self) -> None:
        self.pipeline = None

    def run_api(
        self,
        headers: Headers | None = None,
    ) -> dict[str, Any]:
        """List the assignments your token may use; pass one as `assignment` to the other memory tools.

        Returns {"org_id", "default_assignment", "assignments"}.
        """
        caller = caller_for(None, headers)
        return {
            "org_id": caller.org_id,
            "default_assignment": caller.assignment_id,
            "assignments": list(caller.grants),
        }
