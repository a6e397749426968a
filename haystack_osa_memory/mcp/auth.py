"""Who is calling a tool: the MCP server's verified caller, or a bearer token on a REST request.

Under `osa-memory serve` the auth middleware has already verified the token and set the caller.
Under plain `hayhooks run` (REST), Hayhooks hands the request headers to the wrapper, and the token
in `Authorization: Bearer ...` is verified here. Either way the scope comes from the token, never
from a tool argument, and no token means nothing runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from haystack_osa_memory.caller import Caller, current_caller
from haystack_osa_memory.errors import AuthenticationError, ScopeError


def caller_for(assignment: str | None = None, headers: Mapping[str, str] | None = None) -> Caller:
    """The authenticated caller acting on ``assignment`` (default: the token's first), if granted.

    Raises:
        AuthenticationError: a REST request's bearer token is missing, wrong, expired or revoked.
        ScopeError: no authenticated caller at all, or the assignment is not granted.
    """
    caller = current_caller()
    if caller is None and headers is not None:
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            msg = "missing bearer token: send 'Authorization: Bearer <token>'"
            raise AuthenticationError(msg)
        from haystack_osa_memory.memory import shared_memory

        memory = shared_memory()
        memory.warm_up()
        assert memory.kb is not None
        caller = memory.kb.tokens.verify(token.strip())
    if caller is None:
        msg = "no authenticated caller: memory tools run only behind bearer-token auth"
        raise ScopeError(msg)
    return caller.for_assignment(assignment)
