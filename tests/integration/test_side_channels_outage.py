"""Outage side channels on a real PostgreSQL that is stopped and started again mid-test.

- a token revoked (or expired) before its buffered stores are replayed gets no write in, even when the
  server accepted it from its verification cache during the outage;
- `status` counts only the caller's scope and never shows how the server connects to the database.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.errors import DatabaseError
from haystack_osa_memory.mcp.server import CachingVerifier
from haystack_osa_memory.store.database import close_pools
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.store.tokens import TokenStore, parse_duration
from tests.conftest import new_schema_config
from tests.e2e.test_offline_buffer import pgdata_dir, start_pg, stop_pg

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass
class OutageDb:
    pgdata: Path
    uri: str
    config: MemoryConfig

    @property
    def socket_dir(self) -> str:
        return parse_qs(urlsplit(self.uri).query)["host"][0]

    def down(self) -> None:
        stop_pg(self.pgdata)

    def up(self) -> None:
        """Start the database again and wait until the process-wide pool reaches it (it backs off)."""
        assert start_pg(self.pgdata) == self.uri
        tokens = TokenStore(self.uri, self.config)
        deadline = time.monotonic() + 60
        while True:
            try:
                tokens.list()
                return
            except DatabaseError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def contents(self) -> list[str]:
        """Every chunk's text in the test's knowledge base."""
        query = sql.SQL("SELECT content FROM {}.{} ORDER BY content").format(
            sql.Identifier(self.config.kb_schema), sql.Identifier(self.config.chunk_table)
        )
        with psycopg.connect(self.uri) as conn:
            return [row[0] for row in conn.execute(query).fetchall()]


@pytest.fixture
def outage_db(tmp_path: Path) -> Iterator[OutageDb]:
    """A PostgreSQL of its own (stoppable), a fresh schema, and the offline buffer in ``tmp_path``."""
    pgdata = pgdata_dir()
    uri = start_pg(pgdata)
    config = new_schema_config(uri, data_dir=tmp_path / "data", pool_timeout=1.0, statement_timeout_ms=3000)
    ensure_schema(uri, config)
    try:
        yield OutageDb(pgdata, uri, config)
    finally:
        close_pools()
        stop_pg(pgdata, check=False)
        shutil.rmtree(pgdata.parent, ignore_errors=True)


def test_a_token_revoked_or_expired_before_the_replay_gets_no_write_in(
    outage_db: OutageDb, caplog: pytest.LogCaptureFixture
) -> None:
    config = outage_db.config
    tokens = TokenStore(outage_db.uri, config)
    good = tokens.create(org_id="acme", assignment_id="asg-one")
    revoked = tokens.create(org_id="acme", assignment_id="asg-one")
    # long enough to be valid when the outage starts (the cache never serves an expired token)
    expiring = tokens.create(org_id="acme", assignment_id="asg-one", expires_in=parse_duration("20s"))
    verify = CachingVerifier(tokens, grace_seconds=600)
    for issued in (good, revoked, expiring):
        verify(issued.token)  # each token was used while the database was up: it is in the cache
    # revoked while the database is up; the token makes no call before the outage
    assert tokens.revoke(revoked.token_id) is True
    memory = Memory(config, use_default_embedders=False)
    memory.warm_up()

    outage_db.down()
    # the cache still accepts all three (it cannot know about the revocation): the buffer must re-check
    callers = {name: verify(issued.token) for name, issued in [("good", good), ("revoked", revoked), ("exp", expiring)]}
    local = Caller(org_id="acme", assignment_id="asg-one")  # library use, no token
    facts = {
        "good": "Replaycheck alpha: the good token stored this during the outage",
        "revoked": "Replaycheck beta: a revoked token tried to store this",
        "exp": "Replaycheck gamma: a token that expired before the replay stored this",
    }
    for name, fact in facts.items():
        answer = memory.store(fact, caller=callers[name])
        assert (answer["stored"], answer["queued"]) == (False, True), answer
    assert memory.store("Replaycheck delta: stored locally without a token", caller=local)["queued"] is True
    assert len(memory.offline.queue.items()) == 4

    assert expiring.expires_at is not None
    time.sleep(max(0.0, (expiring.expires_at - datetime.now(UTC)).total_seconds()) + 0.5)
    outage_db.up()
    caplog.set_level(logging.WARNING, logger="haystack_osa_memory")
    assert memory.flush() == 2

    stored = [c for c in outage_db.contents() if "Replaycheck" in c]
    assert len(stored) == 2
    assert any("alpha" in c for c in stored)
    assert any("delta" in c for c in stored)
    assert not any("beta" in c or "gamma" in c for c in stored)
    # refused items are kept aside, not lost: in the rejected file next to the buffer, in queue order
    assert memory.offline.queue.items() == []
    rejected = [json.loads(line) for line in memory.offline.queue.rejected_path.read_text().splitlines()]
    assert [(r["fact"], r["token_id"]) for r in rejected] == [
        (facts["revoked"], revoked.token_id),
        (facts["exp"], expiring.token_id),
    ]
    assert {r["rejected_reason"] for r in rejected} == {"token revoked or expired before the replay"}
    assert oct(memory.offline.queue.rejected_path.stat().st_mode & 0o777) == "0o600"
    # reported: the scope's status counts them, the log names the items and tokens but not the facts
    status = memory.status(caller=callers["good"])
    assert (status["database"], status["pending"], status["rejected"]) == ("ok", 0, 2)
    warnings = [r.getMessage() for r in caplog.records if "refused at replay" in r.getMessage()]
    assert len(warnings) == 2
    assert revoked.token_id in warnings[0]
    assert expiring.token_id in warnings[1]
    assert not any("Replaycheck" in r.getMessage() for r in caplog.records)
    # a second flush has nothing left to replay and writes nothing
    assert memory.flush() == 0
    assert len([c for c in outage_db.contents() if "Replaycheck" in c]) == 2


def test_status_and_queue_answers_count_only_the_callers_scope_and_hide_the_connection(outage_db: OutageDb) -> None:
    memory = Memory(outage_db.config, use_default_embedders=False)
    memory.warm_up()
    one = Caller(org_id="acme", assignment_id="asg-one")
    two = Caller(org_id="acme", assignment_id="asg-two")
    elsewhere = Caller(org_id="globex", assignment_id="asg-one")  # same assignment name, another org
    assert memory.status(caller=one)["database_detail"] is None

    outage_db.down()
    answers = [
        memory.store("Scopecount one: first", caller=one),
        memory.store("Scopecount two: first", caller=two),
        memory.store("Scopecount globex: first", caller=elsewhere),
        memory.store("Scopecount one: second", caller=one),
    ]
    assert [a["pending"] for a in answers] == [1, 1, 1, 2]
    statuses = {name: memory.status(caller=c) for name, c in [("one", one), ("two", two), ("elsewhere", elsewhere)]}
    assert {name: s["pending"] for name, s in statuses.items()} == {"one": 2, "two": 1, "elsewhere": 1}
    assert {s["database"] for s in statuses.values()} == {"unreachable"}
    assert statuses["one"]["database_detail"] == "the database cannot be reached"
    recalled = memory.recall("scopecount first", caller=one)
    shown = json.dumps([statuses, answers, recalled])
    assert outage_db.socket_dir not in shown
    assert str(outage_db.pgdata) not in shown
    assert ".s.PGSQL" not in shown
    assert "socket" not in shown


def test_a_connection_refusal_is_reported_without_the_role_or_socket(pg_conn_str: str, alice: Caller) -> None:
    parts = urlsplit(pg_conn_str)
    role = "osa_no_such_role_x"
    wrong_role = parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}").geturl()
    cfg = new_schema_config(wrong_role)
    status = Memory(cfg, use_default_embedders=False, init_schema=False).status(caller=alice)
    assert status["database"] == "unauthorised"
    detail = status["database_detail"]
    assert detail == "the database refused the server's connection (credentials or permissions)"
    socket_dir = parse_qs(parts.query).get("host", [parts.hostname or ""])[0]
    assert role not in detail
    assert socket_dir not in detail


def test_is_active_looks_a_token_up_by_id(pg_conn_str: str, config: MemoryConfig) -> None:
    tokens = TokenStore(pg_conn_str, config)
    active = tokens.create(org_id="acme", assignment_id="asg-1", expires_in=parse_duration("1h"))
    revoked = tokens.create(org_id="acme", assignment_id="asg-1")
    expired = tokens.create(org_id="acme", assignment_id="asg-1", expires_in=parse_duration("1s"))
    assert tokens.revoke(revoked.token_id) is True
    time.sleep(1.2)
    assert tokens.is_active(active.token_id) is True
    assert tokens.is_active(revoked.token_id) is False
    assert tokens.is_active(expired.token_id) is False
    assert tokens.is_active("0123456789abcdef") is False  # unknown
    assert tokens.is_active("tok-1") is False  # not a token id at all
