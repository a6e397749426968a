"""The trusted caller of a request, carried in a context variable set by the server's auth layer.

Tools never take the scope as an argument: the MCP host verifies the bearer token, then runs the
tool inside :func:`caller_scope`; a tool that finds no caller there refuses to run (fail closed).

The token check of a served call also reads whether a kill switch has turned the token's scope off
(`SwitchReading`, one statement for both); the host runs the tool inside :func:`switch_reading_scope`, and
the tool uses that reading instead of asking the database again (`switch_read_for`).
"""

from __future__ import annotations

import time
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


#: A switch reading is used only this long after it was taken: the token check and the tool run of one request
#: are milliseconds apart; a call that waited longer (queued behind others) asks the database itself.
SWITCH_READING_MAX_AGE_S = 1.0


@dataclass(frozen=True)
class SwitchReading:
    """Whether a kill switch had turned a scope off, read with the request's token (`TokenStore.verify_call`),
    and when (``time.monotonic()``)."""

    org_id: str
    assignment_id: str
    off: bool
    at: float


_switch: ContextVar[SwitchReading | None] = ContextVar("osa_memory_switch_reading", default=None)


@contextmanager
def switch_reading_scope(reading: SwitchReading | None) -> Iterator[None]:
    """Run a block with the kill-switch reading of its request's token check (the server's auth layer)."""
    token = _switch.set(reading)
    try:
        yield
    finally:
        _switch.reset(token)


def switch_read_for(caller: Caller) -> bool | None:
    """Whether ``caller``'s scope is switched off, as this request's token check read it; ``None`` (ask the
    database) when there is no reading, it is of another scope (a granted assignment other than the token's
    own), or it is older than `SWITCH_READING_MAX_AGE_S`."""
    reading = _switch.get()
    if (
        reading is None
        or (reading.org_id, reading.assignment_id) != (caller.org_id, caller.assignment_id)
        or not 0 <= time.monotonic() - reading.at <= SWITCH_READING_MAX_AGE_S
    ):
        return None
    return reading.off
