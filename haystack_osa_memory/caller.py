"""The trusted caller of a request, carried in a context variable set by the server's auth layer.

Tools never take the scope as an argument: the MCP host verifies the bearer token, then runs the
tool inside :func:`caller_scope`; a tool that finds no caller there refuses to run (fail closed).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

from haystack_osa_memory.errors import ScopeError
from haystack_osa_memory.markers import check_identifier


@dataclass(frozen=True)
class Caller:
    """The trusted scope of a request: which org and assignment, which specialist, which token."""

    org_id: str
    assignment_id: str
    specialist_id: str | None = None
    token_id: str | None = None
    #: Every assignment the token grants (the default ``assignment_id`` included).
    grants: tuple[str, ...] = field(default=())

    @property
    def run_id(self) -> str:
        """Who acts, for votes, reads and the audit: the token id, else `local:<specialist or org>`."""
        return self.token_id or f"local:{self.specialist_id or self.org_id}"

    def __post_init__(self) -> None:
        check_identifier(self.org_id, "org")
        check_identifier(self.assignment_id, "assignment")
        if self.specialist_id is not None:
            check_identifier(self.specialist_id, "specialist")
        grants = tuple(dict.fromkeys((self.assignment_id, *self.grants)))
        for grant in grants:
            check_identifier(grant, "assignment")
        object.__setattr__(self, "grants", grants)

    def for_assignment(self, assignment: str | None) -> Caller:
        """This caller acting on ``assignment`` (``None``: the default one), if the token grants it.

        Raises:
            ScopeError: the assignment is not granted (nothing is revealed about it).
        """
        if assignment is None or assignment == self.assignment_id:
            return self
        if assignment not in self.grants:
            msg = f"assignment {assignment!r} is not granted to this token; allowed: {list(self.grants)}"
            raise ScopeError(msg)
        return replace(self, assignment_id=assignment)


_current: ContextVar[Caller | None] = ContextVar("osa_memory_caller", default=None)


def current_caller() -> Caller | None:
    """The caller of the running request, or ``None`` outside an authenticated request."""
    return _current.get()


@contextmanager
def caller_scope(caller: Caller) -> Iterator[Caller]:
    """Run a block as ``caller`` (the server's auth layer; tests and notebooks)."""
    token = _current.set(caller)
    try:
        yield caller
    finally:
        _current.reset(token)
