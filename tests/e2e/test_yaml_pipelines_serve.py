"""An edited YAML pipeline is what `osa-memory serve` runs: a copy of `pipelines/` whose store and
recall YAML use another embedder (Haystack's mock embedders), served with `--pipelines-dir`."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from haystack import Document
from haystack.components.embedders import MockDocumentEmbedder

from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.yaml_pipelines import PipelineDefinitions
from tests.conftest import REPO, drop_schema, new_schema_config
from tests.e2e.conftest import OSA_MEMORY, Server, call, env_for, wait_for_status
from tests.integration.test_yaml_pipelines import chunk_embedding, with_mock_embedders, write

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


@pytest.fixture
def config(pg_conn_str: str) -> Iterator[MemoryConfig]:
    cfg = new_schema_config(pg_conn_str, embedder="auto")
    ensure_schema(pg_conn_str, cfg)
    yield cfg
    drop_schema(pg_conn_str, cfg.kb_schema)


def test_serve_runs_the_edited_yaml(pg_conn_str: str, config: MemoryConfig, tmp_path: Path) -> None:
    folder = shutil.copytree(REPO / "pipelines", tmp_path / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    shipped = PipelineDefinitions.find(folder)
    assert shipped is not None
    write(with_mock_embedders(shipped), folder)
    server = Server(config, pg_conn_str, tmp_path / "serve.log")
    with server.log.open("ab") as log:
        server.proc = subprocess.Popen(
            [
                *OSA_MEMORY,
                "serve",
                "--port",
                str(server.port),
                "--pipelines-dir",
                str(folder),
                "--log-level",
                "warning",
            ],
            env=env_for(config, pg_conn_str),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_status(server.proc, server.port, server.log, 60, "osa-memory serve")
        token = server.token("asg-yaml")["token"]
        fact = "Canary deploys go to the eu-west-3 pool first"
        failed, stored = call(server.url, token, "kb_memory_store", {"fact": fact})
        assert not failed, stored
        expected = MockDocumentEmbedder(dimension=384).run(documents=[Document(content=fact)])["documents"][0].embedding
        assert chunk_embedding(pg_conn_str, config, stored["document_id"]) == pytest.approx(expected, abs=1e-6)
        failed, status = call(server.url, token, "kb_memory_status", {})
        assert not failed, status
        assert status["embedder"]["mode"] == "hybrid"
        failed, recalled = call(server.url, token, "kb_memory_recall", {"query": "where do canary deploys go?"})
        assert not failed, recalled
        assert recalled["facts"][0]["document_id"] == stored["document_id"]
    finally:
        server.stop()
