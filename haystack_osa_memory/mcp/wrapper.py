"""What the Hayhooks wrappers in `pipelines/` share: the process-wide `Memory` and the spec-derived `run_api`.

Hayhooks builds each MCP tool's input schema from its wrapper's `run_api` signature (type hints and
defaults) and docstring (description and `Args:`). :func:`tool_api` gives a wrapper's `run_api` the
signature and docstring of the tool's :class:`~haystack_osa_memory.tools.ToolSpec`, so the declaration in
`tools.py` is the only place a tool's arguments, limits and descriptions are written.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

from hayhooks import BasePipelineWrapper
from pydantic import BaseModel
from starlette.datastructures import Headers

from haystack_osa_memory.memory import Memory, shared_memory
from haystack_osa_memory.tools import ToolSpec

__all__ = ["MemoryToolWrapper", "run_api_signature", "tool_api"]

A = TypeVar("A", bound=BaseModel)

#: A wrapper's implementation: ``(self, arguments, headers) -> result`` (arguments as the spec's model).
ToolImplementation = Callable[[Any, A, Headers | None], dict[str, Any]]


class MemoryToolWrapper(BasePipelineWrapper):  # type: ignore[misc]
    """A Hayhooks pipeline wrapper that serves one memory tool from the process-wide `Memory`."""

    memory: Memory

    def setup(self) -> None:
        # The pipelines folder this wrapper was loaded from: its YAML store and recall pipelines serve.
        self.memory = shared_memory(Path(inspect.getfile(type(self))).resolve().parents[1])
        self.memory.warm_up()


def run_api_signature(spec: ToolSpec[Any, Any]) -> inspect.Signature:
    """``(self, *, <one keyword per argument of the spec>, headers: Headers | None = None) -> dict[str, Any]``.

    Each argument's annotation carries the spec's constraints (``Annotated[type, MinLen(1), ...]``) and its
    default; Hayhooks adds the description from the docstring's ``Args:`` (see ``ToolSpec.docstring``).
    """
    annotated: Any = Annotated
    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name, field in spec.Arguments.model_fields.items():
        annotation = annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
        default = inspect.Parameter.empty if field.is_required() else field.default
        parameters.append(inspect.Parameter(name, keyword, default=default, annotation=annotation))
    parameters.append(inspect.Parameter("headers", keyword, default=None, annotation=Headers | None))
    return inspect.Signature(parameters, return_annotation=dict[str, Any])


def tool_api(spec: ToolSpec[A, Any]) -> Callable[[ToolImplementation[A]], Callable[..., dict[str, Any]]]:
    """Decorate a wrapper's ``run_api(self, args, headers)``: Hayhooks then sees the spec's signature and docstring.

    The arguments reach the implementation as ``spec.Arguments`` with its defaults filled in, unvalidated:
    the MCP server validated them against the same model, and `Memory` checks every value itself (with the
    messages callers know), also for direct Python calls.
    """

    def decorate(implementation: ToolImplementation[A]) -> Callable[..., dict[str, Any]]:
        signature = run_api_signature(spec)

        def run_api(self: Any, headers: Headers | None = None, **arguments: Any) -> dict[str, Any]:
            return implementation(self, spec.Arguments.model_construct(**arguments), headers)

        run_api.__signature__ = signature  # type: ignore[attr-defined]
        run_api.__annotations__ = {
            **{name: p.annotation for name, p in signature.parameters.items() if name != "self"},
            "return": signature.return_annotation,
        }
        run_api.__doc__ = spec.docstring
        run_api.__name__ = implementation.__name__
        run_api.__qualname__ = implementation.__qualname__
        run_api.__module__ = implementation.__module__
        return run_api

    return decorate
