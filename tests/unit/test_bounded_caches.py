"""The in-process memories that need no database stay bounded: the console's sign-in rate limit forgets a
client address once its window has passed and past its number of addresses; the MCP server's token cache
serves a token only for its grace period during an outage, and remembers at most its number of tokens."""

from __future__ import annotations

import psycopg
import pytest

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.console.security import RateLimiter
from haystack_osa_memory.errors import AuthenticationError, DatabaseError
from haystack_osa_memory.mcp.server import CachingVerifier


class Clock:
    """A clock that moves only when told (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TokenCheck:
    """Verifies any token not ``revoked`` while ``up``; while down, fails as an unreachable database does."""

    def __init__(self) -> None:
        self.up = True
        self.revoked: set[str] = set()

    def __call__(self, token: str) -> Caller:
        if not self.up:
            raise DatabaseError("database unreachable") from psycopg.OperationalError("connection refused")
        if token in self.revoked:
            raise AuthenticationError("invalid, expired or revoked token")
        return Caller(org_id="org", assignment_id=f"asg-{token}")


# -- the console's sign-in rate limit ----------------------------------------------------------------------
def test_attempts_count_for_the_window_only() -> None:
    clock = Clock()
    limiter = RateLimiter(2, 60, timer=clock)
    assert [limiter.allow("10.0.0.1") for _ in range(3)] == [True, True, False]
    assert limiter.allow("10.0.0.2") is True  # per address
    clock.now += 59
    assert limiter.allow("10.0.0.1") is False
    clock.now += 2
    assert limiter.allow("10.0.0.1") is True


def test_the_rate_limit_remembers_at_most_its_number_of_addresses() -> None:
    clock = Clock()
    limiter = RateLimiter(1, 60, max_keys=3, timer=clock)
    assert limiter.allow("first") is True
    assert limiter.allow("first") is False
    for n in range(100):
        assert limiter.allow(f"other-{n}") is True
        assert len(limiter._events) <= 3
    # The least recently seen address was forgotten for the newer ones: its attempt counts afresh.
    assert limiter.allow("first") is True


def test_an_idle_address_is_forgotten_after_the_window() -> None:
    clock = Clock()
    limiter = RateLimiter(5, 60, timer=clock)
    for n in range(10):
        limiter.allow(f"client-{n}")
    clock.now += 61
    limiter.allow("another")
    assert len(limiter._events) == 1


# -- the MCP server's token cache ---------------------------------------------------------------------------
def test_a_token_is_served_from_the_cache_only_within_its_grace() -> None:
    clock, check = Clock(), TokenCheck()
    verify = CachingVerifier(check, grace_seconds=600, timer=clock)
    assert verify("alpha").assignment_id == "asg-alpha"
    check.up = False
    clock.now += 599
    assert verify("alpha").assignment_id == "asg-alpha"  # verified 599 s ago: accepted during the outage
    with pytest.raises(DatabaseError):
        verify("never-seen")
    clock.now += 2
    with pytest.raises(DatabaseError):
        verify("alpha")  # 601 s: the grace has passed


def test_the_token_cache_remembers_at_most_its_number_of_tokens() -> None:
    clock, check = Clock(), TokenCheck()
    verify = CachingVerifier(check, grace_seconds=600, max_tokens=2, timer=clock)
    for token in ("alpha", "beta", "gamma"):
        verify(token)
    check.up = False
    with pytest.raises(DatabaseError):
        verify("alpha")  # the least recently verified one was forgotten for gamma
    assert verify("beta").assignment_id == "asg-beta"
    assert verify("gamma").assignment_id == "asg-gamma"


def test_a_refusal_evicts_a_cached_token_before_its_grace_ends() -> None:
    clock, check = Clock(), TokenCheck()
    verify = CachingVerifier(check, grace_seconds=600, timer=clock)
    verify("alpha")
    verify("beta")
    check.revoked.add("alpha")
    with pytest.raises(AuthenticationError):
        verify("alpha")
    check.up = False
    clock.now += 10
    with pytest.raises(DatabaseError):
        verify("alpha")
    assert verify("beta").assignment_id == "asg-beta"
