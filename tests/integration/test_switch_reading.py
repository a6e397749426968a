"""A served call's token check reads its scope's kill switch in the same statement (`TokenStore.verify_call`),
and the tool uses that reading instead of asking the database again (`caller.switch_read_for`):

- the reading says what `LifecycleRepository.is_off` says, for a switch on the scope, on its org, on every org,
  and for switches on other scopes;
- with a reading of its own scope, a call runs no switch statement, and a reading that says off refuses it;
- a reading of another scope (a granted assignment other than the token's) or one taken too long ago is not
  used: the database is asked, and a switch it holds refuses the call;
- the token cache (the database away) hands out no reading.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.caller import SWITCH_READING_MAX_AGE_S, SwitchReading, caller_scope, switch_reading_scope
from haystack_osa_memory.errors import MemoryOffError
from haystack_osa_memory.mcp.server import CachingVerifier
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.store.tokens import TokenStore

pytestmark = pytest.mark.integration

#: Switches turned off, and whether they turn acme/asg-alpha off.
SWITCHES = [
    ([], False),
    ([("acme", "asg-alpha")], True),
    ([("acme", "*")], True),
    ([("*", "*")], True),
    ([("*", "asg-alpha")], True),
    ([("acme", "asg-beta")], False),
    ([("other", "asg-alpha"), ("other", "*")], False),
]


@contextmanager
def switch_statements() -> Iterator[list[str]]:
    """The statements that read the switches table, as they are sent."""
    seen: list[str] = []
    original = psycopg.Cursor.execute

    def traced(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query if isinstance(query, bytes) else str(query).encode()
        if b".switches" in text:
            seen.append(text.decode(errors="replace"))
        return original(self, query, params, **kwargs)

    psycopg.Cursor.execute = traced  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


@pytest.mark.parametrize(("switches", "off"), SWITCHES, ids=[str(s) for s, _ in SWITCHES])
def test_the_token_check_reads_the_switch_as_is_off_does(
    config: MemoryConfig, switches: list[tuple[str, str]], off: bool
) -> None:
    assert config.pg_conn_str is not None
    tokens, repo = TokenStore(config.pg_conn_str, config), LifecycleRepository(config.pg_conn_str, config)
    issued = tokens.create(org_id="acme", assignment_id="asg-alpha", extra_assignments=["asg-beta"])
    for org, assignment in switches:
        repo.set_switch(org, assignment, enabled=False, actor="cli:test", reason="incident")
    caller, _, reading = tokens.verify_call(issued.token)
    assert (reading.org_id, reading.assignment_id) == (caller.org_id, caller.assignment_id) == ("acme", "asg-alpha")
    assert reading.off is off is repo.is_off("acme", "asg-alpha")
    assert 0 <= time.monotonic() - reading.at < 5
    verified, _ = CachingVerifier(tokens, grace_seconds=60).verify_call(issued.token)
    assert verified == caller


def test_a_call_with_its_scope_s_reading_asks_nothing_more(memory: Memory, alice: Caller) -> None:
    memory.store("The VPN profile is stg-eu", caller=alice)
    with switch_statements() as seen:
        memory.recall("vpn profile", caller=alice)
    assert len(seen) == 1  # without a reading: the switch is asked
    on = SwitchReading(alice.org_id, alice.assignment_id, off=False, at=time.monotonic())
    with switch_statements() as seen, caller_scope(alice), switch_reading_scope(on):
        assert memory.recall("vpn profile", caller=alice)["facts"]
        memory.store("The VPN profile is stg-eu2", caller=alice)
    assert seen == []
    off = SwitchReading(alice.org_id, alice.assignment_id, off=True, at=time.monotonic())
    with switch_statements() as seen, switch_reading_scope(off), pytest.raises(MemoryOffError):
        memory.recall("vpn profile", caller=alice)
    assert seen == []


@pytest.mark.parametrize("stale", ["another scope", "too old", "taken later"])
def test_a_reading_of_another_scope_or_time_is_not_used(
    memory: Memory, alice: Caller, config: MemoryConfig, stale: str
) -> None:
    assert config.pg_conn_str is not None
    memory.store("The VPN profile is stg-eu", caller=alice)
    LifecycleRepository(config.pg_conn_str, config).set_switch(
        alice.org_id, alice.assignment_id, enabled=False, actor="cli:test", reason="incident"
    )
    now = time.monotonic()
    reading = {
        "another scope": SwitchReading(alice.org_id, "asg-beta", off=False, at=now),
        "too old": SwitchReading(alice.org_id, alice.assignment_id, off=False, at=now - SWITCH_READING_MAX_AGE_S - 1),
        "taken later": SwitchReading(alice.org_id, alice.assignment_id, off=False, at=now + 60),
    }[stale]
    with switch_statements() as seen, switch_reading_scope(reading), pytest.raises(MemoryOffError):
        memory.recall("vpn profile", caller=alice)
    assert len(seen) == 1  # the database was asked, and its switch refused the call
