"""Kill switches and outages on a real PostgreSQL that is stopped and started again mid-test.

- a scope known to be switched off refuses at once during an outage (store, recall, status), with the
  switch's message; scopes that were on keep buffering;
- the replay never blocks on one item: an item whose scope is off now is kept (and stored once the switch
  is back on), the items of other scopes are stored; an item whose token is gone is set aside;
- the connection pool reaches the database again within seconds of its return;
- the token cache never serves an expired token, nor a token it has not re-checked since the database
  came back.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from haystack_osa_memory import Caller, Memory
from haystack_osa_memory.errors import AuthenticationError, DatabaseError, MemoryOffError
from haystack_osa_memory.mcp.server import CachingVerifier
from haystack_osa_memory.offline import KEPT_RETRY_S
from haystack_osa_memory.store.database import get_pool, transaction
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.store.tokens import TokenStore, parse_duration
from tests.e2e.test_offline_buffer import start_pg
from tests.integration import test_side_channels_outage
from tests.integration.test_side_channels_outage import OutageDb

pytestmark = [pytest.mark.integration, pytest.mark.slow]

outage_db = test_side_channels_outage.outage_db  # the fixture: a PostgreSQL of the test's own

OFF = MemoryOffError.MESSAGE


def switch(db: OutageDb, org: str, assignment: str, *, on: bool) -> None:
    """Flip a kill switch as `osa-memory assignment disable|enable` does (its own repository)."""
    LifecycleRepository(db.uri, db.config).set_switch(org, assignment, enabled=on, actor="operator", reason=None)


def stored(db: OutageDb) -> list[str]:
    """The texts of the test's facts in the knowledge base (without their scope marker line)."""
    return sorted(c.rsplit("\n", 1)[-1] for c in db.contents() if "Replaykeep" in c)


def test_a_scope_known_to_be_off_refuses_at_once_during_an_outage(outage_db: OutageDb) -> None:
    memory = Memory(outage_db.config, use_default_embedders=False)
    killed = Caller(org_id="orgC", assignment_id="killme")
    org_off = Caller(org_id="orgE", assignment_id="any")  # switched off for its whole org, never called
    working = Caller(org_id="orgD", assignment_id="works")
    switch(outage_db, "orgC", "killme", on=False)
    switch(outage_db, "orgE", "*", on=False)
    with pytest.raises(MemoryOffError):
        memory.store("Killswitch gamma: refused while the database is up", caller=killed)
    assert memory.store("Killswitch delta: stored before the outage", caller=working)["stored"] is True

    outage_db.down()
    for caller in (killed, org_off):
        with pytest.raises(MemoryOffError) as refused:
            memory.store("Killswitch gamma: written while the switch is off", caller=caller)
        assert str(refused.value) == OFF
        with pytest.raises(MemoryOffError):
            memory.recall("killswitch gamma", caller=caller)
        with pytest.raises(MemoryOffError):
            memory.status(caller=caller)
    queued = memory.store("Killswitch delta: written during the outage", caller=working)
    assert (queued["stored"], queued["queued"], queued["pending"]) == (False, True, 1)
    # nothing was queued that would be refused later
    assert [(i["org_id"], i["assignment_id"]) for i in memory.offline.queue.items()] == [("orgD", "works")]
    assert memory.recall("killswitch delta", caller=working)["facts"][0]["content"].startswith("Killswitch delta")


def test_the_replay_keeps_a_switched_off_scope_and_stores_the_others(outage_db: OutageDb) -> None:
    config = outage_db.config
    tokens = TokenStore(outage_db.uri, config)
    c_token = tokens.create(org_id="orgC", assignment_id="killme")
    d_token = tokens.create(org_id="orgD", assignment_id="works")
    gone = tokens.create(org_id="orgC", assignment_id="killme")
    verify = CachingVerifier(tokens, grace_seconds=600)
    callers = {name: verify(t.token) for name, t in [("c", c_token), ("d", d_token), ("gone", gone)]}
    memory = Memory(config, use_default_embedders=False)
    memory.warm_up()

    outage_db.down()
    # scope C is on when these are held: they are buffered
    assert memory.store("Replaykeep one: orgC first fact", caller=callers["c"])["queued"] is True
    assert memory.store("Replaykeep two: orgC by a token revoked later", caller=callers["gone"])["queued"] is True
    assert memory.store("Replaykeep three: orgC second fact", caller=callers["c"])["queued"] is True
    assert memory.store("Replaykeep four: orgD fact", caller=callers["d"])["queued"] is True
    outage_db.up()
    # while the server was away from the database, an operator switched scope C off and revoked a token
    switch(outage_db, "orgC", "killme", on=False)
    assert tokens.revoke(gone.token_id) is True

    assert memory.flush() == 1  # orgD's fact, behind orgC's
    assert stored(outage_db) == ["Replaykeep four: orgD fact"]
    kept = memory.offline.queue.items()
    assert [i["fact"] for i in kept] == ["Replaykeep one: orgC first fact", "Replaykeep three: orgC second fact"]
    rejected = memory.offline.queue.rejected()
    assert [(r["fact"], r["token_id"]) for r in rejected] == [
        ("Replaykeep two: orgC by a token revoked later", gone.token_id)
    ]
    assert rejected[0]["rejected_reason"] == "token revoked or expired before the replay"
    assert memory.flush() == 0  # within KEPT_RETRY_S of the last replay, an unchanged buffer waits
    time.sleep(KEPT_RETRY_S)
    assert memory.flush() == 0  # still off: kept again, nothing rejected, nothing lost
    assert len(memory.offline.queue.items()) == 2
    assert len(memory.offline.queue.rejected()) == 1

    switch(outage_db, "orgC", "killme", on=True)
    time.sleep(KEPT_RETRY_S)
    assert memory.flush() == 2
    assert stored(outage_db) == [
        "Replaykeep four: orgD fact",
        "Replaykeep one: orgC first fact",
        "Replaykeep three: orgC second fact",
    ]
    assert memory.offline.queue.items() == []
    audit = memory.lifecycle.audit(org_id="orgC", assignment_id="killme") if memory.lifecycle else []
    assert [r["action"] for r in audit if r["action"].startswith("store")] == ["store-replay", "store-replay"]


def test_the_pool_reconnects_within_seconds_after_the_database_returns(outage_db: OutageDb) -> None:
    config = outage_db.config
    tokens = TokenStore(outage_db.uri, config)

    def busy(_: int) -> None:
        with transaction(outage_db.uri, config) as conn:
            conn.execute("SELECT pg_sleep(0.3)")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(busy, range(4)))  # several pooled connections, all lost with the server
    assert get_pool(outage_db.uri, config).get_stats()["pool_size"] >= 2

    outage_db.down()
    # A long outage with steady traffic: every call fails, as it must.
    until = time.monotonic() + 45
    while time.monotonic() < until:
        with pytest.raises(DatabaseError):
            tokens.list()
        time.sleep(0.5)
    assert start_pg(outage_db.pgdata) == outage_db.uri
    back = time.monotonic()
    while True:
        try:
            tokens.list()
            break
        except DatabaseError:
            assert time.monotonic() - back < 30, "the pool did not reconnect within 30 s"
            time.sleep(0.1)
    reconnected = time.monotonic() - back
    print(f"reconnected {reconnected:.2f} s after the database returned")  # the figure docs/operations.md quotes
    assert reconnected < 4.0, f"the pool reconnected {reconnected:.1f} s after the database returned"


def test_the_token_cache_never_serves_an_expired_token(outage_db: OutageDb) -> None:
    tokens = TokenStore(outage_db.uri, outage_db.config)
    lasting = tokens.create(org_id="acme", assignment_id="asg-one")
    expiring = tokens.create(org_id="acme", assignment_id="asg-one", expires_in=parse_duration("2s"))
    verify = CachingVerifier(tokens, grace_seconds=600)
    _, reading = verify.verify_call(lasting.token)
    assert reading is not None  # read with the token: the kill switch of its scope
    assert not reading.off
    verify(expiring.token)
    outage_db.down()
    assert verify(expiring.token).token_id == expiring.token_id  # not expired yet: buffered stores go on
    # from the cache: no switch reading (the tool asks for the switch itself, and the outage rules apply)
    assert verify.verify_call(lasting.token) == (verify(lasting.token), None)
    time.sleep(2.2)
    with pytest.raises(AuthenticationError):
        verify(expiring.token)  # its expiry is known without the database
    assert verify(lasting.token).token_id == lasting.token_id


def test_the_token_cache_serves_nothing_it_has_not_rechecked_since_the_database_came_back(
    outage_db: OutageDb,
) -> None:
    tokens = TokenStore(outage_db.uri, outage_db.config)
    first = tokens.create(org_id="acme", assignment_id="asg-one")
    second = tokens.create(org_id="acme", assignment_id="asg-one")
    verify = CachingVerifier(tokens, grace_seconds=600)
    verify(first.token)
    verify(second.token)
    outage_db.down()
    assert verify(first.token).token_id == first.token_id
    outage_db.up()
    assert verify(first.token).token_id == first.token_id  # re-checked since the database came back
    outage_db.down()
    # during this second outage only what was re-checked after the first one is served
    assert verify(first.token).token_id == first.token_id
    with pytest.raises(DatabaseError):
        verify(second.token)
    outage_db.up()
    assert json.dumps(verify(second.token).token_id) == json.dumps(second.token_id)


def test_a_busy_pool_is_not_an_outage_for_the_token_cache(outage_db: OutageDb) -> None:
    """Every pooled connection taken (the pool times out as if the database were away) while the database
    answers: a token revoked since it was cached must not pass from the cache."""
    config = outage_db.config
    tokens = TokenStore(outage_db.uri, config)
    revoked = tokens.create(org_id="acme", assignment_id="asg-one")
    verify = CachingVerifier(tokens, grace_seconds=600)
    verify(revoked.token)
    assert tokens.revoke(revoked.token_id) is True
    pool = get_pool(outage_db.uri, config)
    held = [pool.getconn() for _ in range(pool.max_size)]
    try:
        with pytest.raises(DatabaseError, match="did not answer"):
            verify(revoked.token)
    finally:
        for conn in held:
            pool.putconn(conn)
    with pytest.raises(AuthenticationError):
        verify(revoked.token)
