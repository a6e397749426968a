from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import AuthenticationError, InvalidInputError, MemoryConfig
from haystack_osa_memory.store.tokens import TokenStore, parse_duration

pytestmark = pytest.mark.integration


@pytest.fixture
def tokens(pg_conn_str: str, config: MemoryConfig) -> TokenStore:
    return TokenStore(pg_conn_str, config)


def test_create_and_verify(tokens: TokenStore) -> None:
    issued = tokens.create(org_id="acme", assignment_id="asg-1", specialist_id="sp", expires_in=timedelta(hours=1))
    caller = tokens.verify(issued.token)
    assert (caller.org_id, caller.assignment_id, caller.specialist_id, caller.token_id) == (
        "acme",
        "asg-1",
        "sp",
        issued.token_id,
    )


def test_only_a_hash_is_stored(tokens: TokenStore, pg_conn_str: str, config: MemoryConfig) -> None:
    issued = tokens.create(org_id="acme", assignment_id="asg-1")
    secret = issued.token.rsplit("_", 1)[-1] if issued.token.count("_") == 2 else issued.token[22:]
    with psycopg.connect(pg_conn_str) as conn:
        rows = conn.execute(sql.SQL("SELECT * FROM {}.tokens").format(sql.Identifier(config.memory_schema))).fetchall()
    dumped = repr(rows)
    assert issued.token not in dumped
    assert secret not in dumped


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # wrong secret
        lambda t: "osam_0000000000000000_" + t.split("_", 2)[2],  # unknown id
        lambda t: "garbage",
        lambda t: "",
    ],
)
def test_wrong_tokens_refused(tokens: TokenStore, mangle: object) -> None:
    issued = tokens.create(org_id="acme", assignment_id="asg-1")
    with pytest.raises(AuthenticationError, match="invalid, expired or revoked"):
        tokens.verify(mangle(issued.token))  # type: ignore[operator]


def test_revoked_token_refused(tokens: TokenStore) -> None:
    issued = tokens.create(org_id="acme", assignment_id="asg-1")
    assert tokens.revoke(issued.token_id) is True
    with pytest.raises(AuthenticationError):
        tokens.verify(issued.token)
    assert tokens.revoke("0123456789abcdef") is False


def test_expired_token_refused(tokens: TokenStore) -> None:
    issued = tokens.create(org_id="acme", assignment_id="asg-1", expires_in=timedelta(seconds=-1))
    with pytest.raises(AuthenticationError):
        tokens.verify(issued.token)


def test_list_shows_no_secret(tokens: TokenStore) -> None:
    issued = tokens.create(org_id="acme", assignment_id="asg-1")
    listed = tokens.list()
    assert [t["token_id"] for t in listed] == [issued.token_id]
    assert issued.token not in repr(listed)


@pytest.mark.parametrize("bad", ["0s", "8", "h", "-1h", "1w", "999999999h"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(InvalidInputError, match="duration"):
        parse_duration(bad)


def test_good_durations() -> None:
    assert parse_duration("8h") == timedelta(hours=8)
    assert parse_duration("30m") == timedelta(minutes=30)
    assert parse_duration("2d") == timedelta(days=2)
