"""The trusted caller of a request, carried in a context variable set by the server's auth layer.

Tools never take the scope as an argument: the MCP host verifies the bearer token, then runs the
tool inside :func:`caller_scope`; :func:`require_caller` fails closed when no scope is set.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from haystack_osa_memory.errors import ScopeError
from haystack_osa_memory.markers import check_identifier


@dataclass(frozen=True)
class Caller:
    """The trusted scope of a request: which org and assignment, which specialist, which token."""

    org_id: str
    assignment_id: str
    specialist_id: str | None = None
    token_id: str | None = None

    @property
    def run_id(self) -> str:
        """Who acts, for votes, reads and the audit: the token id, else `local:<specialist or org>`."""
        return self.token_id or f"local:{self.specialist_id or self.org_id}"

    def __post_init__(self) -> None:
        check_identifier(self.org_id, "org")
        check_identifier(self.assignment_id, "assignment")
        if self.specialist_id is not None:
            check_identifier(self.specialist_id, "specialist")


_current: ContextVar[Caller | None] = ContextVar("osa_memory_caller", default=None)


def current_caller() -> Caller | None:
    """The caller of the running request, or ``None`` outside an authenticated request."""
    return _current.get()


def require_caller() -> Caller:
    """The caller of the running request.

    Raises:
        ScopeError: no authenticated caller (fail closed: nothing runs without a scope).
    """
    caller = _current.get()
    if caller is None:
        msg = "no authenticated caller: memory tools run only behind the osa-memory server's bearer-token auth"
        raise ScopeError(msg)
    return caller


@contextmanager
def caller_scope(caller: Caller) -> Iterator[Caller]:
    """Run a block as ``caller`` (the server's auth layer; tests and notebooks)."""
    token = _current.set(caller)
    try:
        yield caller
    finally:
        _current.reset(token)
