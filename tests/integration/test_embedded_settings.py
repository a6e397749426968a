"""The embedded PostgreSQL starts with shared buffers sized for big assignments (`embedded_shared_buffers`):
from the environment when set, else an eighth of the machine's memory within 128 MB and 1 GB."""

from __future__ import annotations

import psutil  # type: ignore[import-untyped]
import psycopg
import pytest

from haystack_osa_memory.errors import ConfigurationError
from haystack_osa_memory.store import database
from haystack_osa_memory.store.database import (
    SHARED_BUFFERS_ENV,
    SHARED_BUFFERS_MAX_MB,
    SHARED_BUFFERS_MIN_MB,
    embedded_shared_buffers,
    scratch_database,
)

pytestmark = pytest.mark.integration


def test_without_the_variable_an_eighth_of_the_memory_within_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHARED_BUFFERS_ENV, raising=False)
    eighth = psutil.virtual_memory().total // 8 // 2**20
    expected = max(SHARED_BUFFERS_MIN_MB, min(SHARED_BUFFERS_MAX_MB, eighth))
    assert embedded_shared_buffers() == f"{expected}MB"


@pytest.mark.parametrize("value", ["512MB", "2GB", "65536kB"])
def test_the_variable_wins(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(SHARED_BUFFERS_ENV, value)
    assert embedded_shared_buffers() == value


@pytest.mark.parametrize("value", ["lots", "512", "0MB", "1TB", "512 MB", "-1GB", "1e3MB"])
def test_a_malformed_size_is_refused_before_any_server_starts(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(SHARED_BUFFERS_ENV, value)
    monkeypatch.delenv("PG_CONN_STR", raising=False)
    with pytest.raises(ConfigurationError, match=SHARED_BUFFERS_ENV), scratch_database(prefix="osa-sb-"):
        pytest.fail("a server started with a malformed shared_buffers")


def test_a_fresh_embedded_server_runs_with_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its own server: the session's may be the team's PostgreSQL (PG_CONN_STR), whose settings are theirs.
    monkeypatch.delenv("PG_CONN_STR", raising=False)
    monkeypatch.setenv(SHARED_BUFFERS_ENV, "160MB")
    with scratch_database(prefix="osa-sb-") as uri, psycopg.connect(uri) as conn:
        row = conn.execute("SELECT setting::int * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'").fetchone()
    assert row == (160,)


def test_the_start_command_is_wrapped_once() -> None:
    calls: list[list[str]] = []

    def pg_ctl(args: list[str], **kwargs: object) -> str:
        calls.append(args)
        return ""

    wrapped = database._with_server_settings(pg_ctl)
    assert database._with_server_settings(wrapped) is wrapped
    wrapped(["-w", "-o", '-h ""', "start"], pgdata="x")
    wrapped(["stop"], pgdata="x")
    assert calls[0][-3:] == ["-o", f"-c shared_buffers={embedded_shared_buffers()}", "start"]
    assert calls[1] == ["stop"]
