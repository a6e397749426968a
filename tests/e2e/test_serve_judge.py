"""`osa-memory serve` with a supersession judge named in its store YAML: the server process asks a small
OpenAI-compatible HTTP server on 127.0.0.1 through Haystack's `OpenAIChatGenerator`, and a tool call's
answer says what it superseded."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import REPO, drop_schema, new_schema_config
from tests.e2e.conftest import OSA_MEMORY, Server, call, env_for, wait_for_status
from tests.integration.test_judge_http import KEY, NEW, OLD, ChatServer, judge_block

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


@pytest.fixture
def config(pg_conn_str: str) -> Iterator[MemoryConfig]:
    cfg = new_schema_config(pg_conn_str)
    ensure_schema(pg_conn_str, cfg)
    yield cfg
    drop_schema(pg_conn_str, cfg.kb_schema)


def test_serve_asks_the_judge_its_yaml_names(pg_conn_str: str, config: MemoryConfig, tmp_path: Path) -> None:
    chat = ChatServer()
    folder = shutil.copytree(REPO / "pipelines", tmp_path / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    store_yml = folder / "kb_memory_store" / "store.yml"
    store = yaml.safe_load(store_yml.read_text(encoding="utf-8"))
    store["components"]["judge"] = judge_block(chat.url)
    store_yml.write_text(yaml.safe_dump(store), encoding="utf-8")
    server = Server(config, pg_conn_str, tmp_path / "serve.log", workers=1)
    with server.log.open("ab") as log:
        server.proc = subprocess.Popen(
            [*OSA_MEMORY, "serve", "--port", str(server.port), "--workers", "1", "--pipelines-dir", str(folder)],
            env=env_for(config, pg_conn_str, OSA_MEMORY_JUDGE_API_KEY=KEY, OSA_MEMORY_EMBEDDER="none"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_status(server.proc, server.port, server.log, 120, "osa-memory serve")
        token = server.token("asg-judge")["token"]
        failed, old = call(server.url, token, "kb_memory_store", {"fact": OLD})
        assert not failed, old
        failed, new = call(server.url, token, "kb_memory_store", {"fact": NEW})
        assert not failed, new
        assert new["superseded"] == [old["document_id"]]
        assert new["possibly_supersedes"] == []
        assert chat.requests
        assert chat.headers[-1]["authorization"] == f"Bearer {KEY}"
        failed, read = call(server.url, token, "kb_memory_read", {"document_id": old["document_id"]})
        assert not failed, read
        assert read["status"] == "superseded"
    finally:
        server.stop()
        chat.close()
