"""The pipelines the product builds can be saved and loaded back by a Haystack user: `dumps()` writes the
connection as an environment-variable secret (never its value), `Pipeline.loads()` gives back an equal
pipeline, and the loaded pipeline reaches the database that variable names."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from haystack import Pipeline
from haystack.components.embedders import MockDocumentEmbedder, MockTextEmbedder

from haystack_osa_memory import ALLOWED_MODULES, Caller, ConfigurationError, Memory, MemoryConfig
from haystack_osa_memory.builders import build_customer_search_pipeline
from haystack_osa_memory.store import database
from haystack_osa_memory.yaml_pipelines import PipelineDefinitions
from tests.conftest import REPO

pytestmark = pytest.mark.integration

ME = Caller(org_id="acme", assignment_id="asg-saved")


def saved_and_loaded(pipe: Pipeline) -> tuple[str, Pipeline]:
    text = pipe.dumps()
    return text, Pipeline.loads(text, allowed_modules=ALLOWED_MODULES)


def leave_embedded(data: Path) -> None:
    """Stop the embedded server of ``data`` (closing this process's pools to it) and delete the folder."""
    server = database._embedded.pop((data / "pgdata").resolve(), None)
    with database._pools_lock:
        for key in [k for k in database._pools if "host=" + str((data / "pgdata").resolve()) in k[0]]:
            database._pools.pop(key).close()
    if server is not None:
        server.cleanup()
    shutil.rmtree(data, ignore_errors=True)


def recall_with(pipe: Pipeline, query: str) -> list[str]:
    data = {"retrieve": {"query": query, "org_id": ME.org_id, "assignment_id": ME.assignment_id}}
    data["acl"] = {"org_id": ME.org_id, "assignment_id": ME.assignment_id}
    if "embed" in {name for name, _ in pipe.walk()}:
        data["embed"] = {"text": query}
    return [d.content or "" for d in pipe.run(data)["strip"]["documents"]]


@pytest.mark.parametrize("hybrid", [False, True], ids=["lexical", "hybrid"])
def test_memory_pipelines_save_and_load_back_equal(pg_conn_str: str, config: MemoryConfig, hybrid: bool) -> None:
    embedders = (
        {"document_embedder": MockDocumentEmbedder(dimension=384), "text_embedder": MockTextEmbedder(dimension=384)}
        if hybrid
        else {"use_default_embedders": False}
    )
    memory = Memory(config, **embedders)  # type: ignore[arg-type]
    memory.store("The nightly backup runs at 02:00 UTC", caller=ME)
    assert memory.store_pipeline is not None
    assert memory.recall_pipeline is not None
    for pipe in (memory.store_pipeline, memory.recall_pipeline):
        text, loaded = saved_and_loaded(pipe)
        assert "PG_CONN_STR" in text
        assert pg_conn_str not in text
        assert loaded == pipe
    _, recall = saved_and_loaded(memory.recall_pipeline)
    assert recall_with(recall, "nightly backup") == ["The nightly backup runs at 02:00 UTC"]


def test_yaml_memory_pipelines_save_and_load_back_equal(config: MemoryConfig) -> None:
    shipped = PipelineDefinitions.find(REPO / "pipelines")
    assert shipped is not None
    memory = Memory(config, definitions=shipped)
    memory.warm_up()
    for pipe in (memory.store_pipeline, memory.recall_pipeline):
        assert pipe is not None
        assert saved_and_loaded(pipe)[1] == pipe


def test_customer_search_pipeline_saves(pg_conn_str: str, config: MemoryConfig) -> None:
    memory = Memory(config, use_default_embedders=False)
    memory.warm_up()
    pipe = build_customer_search_pipeline(config, store=memory.kb)
    text, loaded = saved_and_loaded(pipe)
    assert pg_conn_str not in text
    assert loaded == pipe


def test_a_saved_pipeline_never_points_at_another_database(
    pg_conn_str: str, config: MemoryConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection given in code while PG_CONN_STR names another database: saving is refused, since the
    loaded pipeline would read and write that other database."""
    memory = Memory(config, use_default_embedders=False)
    memory.warm_up()
    assert memory.recall_pipeline is not None
    monkeypatch.setenv("PG_CONN_STR", "postgresql://someone@elsewhere.invalid/other")
    with pytest.raises(ConfigurationError, match="PG_CONN_STR names another database"):
        memory.recall_pipeline.dumps()


@pytest.mark.slow
def test_embedded_memory_pipelines_name_pg_conn_str(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the embedded database (no PG_CONN_STR): the pipelines save with the variable's name; loaded
    elsewhere they need PG_CONN_STR set to the embedded URI, and say so when it is not."""
    monkeypatch.delenv("PG_CONN_STR", raising=False)
    # A short folder of its own: the server's socket path must fit the Unix limit (docs/traps.md).
    data = Path(tempfile.mkdtemp(prefix="osa-saved-"))
    try:
        memory = Memory(MemoryConfig(data_dir=data, embedder="none"))
        memory.store("The embedded database keeps its data under the data dir", caller=ME)
        assert memory.recall_pipeline is not None
        assert memory.conn_str is not None
        text, loaded = saved_and_loaded(memory.recall_pipeline)
        assert "PG_CONN_STR" in text
        assert memory.conn_str not in text
        assert loaded == memory.recall_pipeline
        with pytest.raises(Exception, match="set PG_CONN_STR to the database's URI") as raised:
            recall_with(loaded, "embedded database")
        assert memory.conn_str not in str(raised.value)
        monkeypatch.setenv("PG_CONN_STR", memory.conn_str)
        _, fresh = saved_and_loaded(memory.recall_pipeline)
        assert recall_with(fresh, "embedded database") == ["The embedded database keeps its data under the data dir"]
    finally:
        leave_embedded(data)
