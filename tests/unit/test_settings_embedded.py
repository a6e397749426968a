"""The embedded server's `shared_buffers` follows the configuration it is started with: a `MemoryConfig`
built in code is never overridden by `OSA_MEMORY_PG_SHARED_BUFFERS`; without a config the loader reads it."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.store import database
from haystack_osa_memory.store.database import SHARED_BUFFERS_ENV, embedded_shared_buffers, start_embedded


def test_a_config_decides_and_only_no_config_reads_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHARED_BUFFERS_ENV, raising=False)
    sized = embedded_shared_buffers()
    other = "2GB" if sized != "2GB" else "1GB"
    monkeypatch.setenv(SHARED_BUFFERS_ENV, other)
    assert embedded_shared_buffers() == other
    assert embedded_shared_buffers(MemoryConfig()) == sized
    assert embedded_shared_buffers(MemoryConfig(pg_shared_buffers="256MB")) == "256MB"
    assert embedded_shared_buffers(MemoryConfig.from_env()) == other


def test_a_code_config_with_a_malformed_variable_still_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SHARED_BUFFERS_ENV, "lots")
    assert embedded_shared_buffers(MemoryConfig(pg_shared_buffers="144MB")) == "144MB"


@pytest.mark.integration
def test_the_started_server_has_the_configured_size(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    monkeypatch.setenv(SHARED_BUFFERS_ENV, "160MB")
    # A short path: the server's socket lives in the data directory (docs/traps.md).
    data_dir = Path(tmp_path_factory.mktemp("sb"))
    uri = start_embedded(data_dir, MemoryConfig(pg_shared_buffers="144MB"))
    try:
        with psycopg.connect(uri) as conn:
            row = conn.execute(
                "SELECT setting::int * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'"
            ).fetchone()
        assert row == (144,)
    finally:
        database._embedded.pop((data_dir / "pgdata").resolve()).cleanup()
