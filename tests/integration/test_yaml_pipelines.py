"""The store and recall pipelines as YAML (`pipelines/kb_memory_store/store.yml`,
`pipelines/kb_memory_recall/recall.yml`): what ships is the built-in pipeline, an edited YAML is what
runs, the module allow-list applies, and the server's configuration is bound to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from haystack import Document
from haystack.components.embedders import MockDocumentEmbedder
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.errors import ConfigurationError
from haystack_osa_memory.yaml_pipelines import PipelineDefinitions, default_definitions
from tests.conftest import REPO

pytestmark = pytest.mark.integration

ME = Caller(org_id="acme", assignment_id="asg-yaml")
SHIPPED = REPO / "pipelines"


def with_mock_embedders(definitions: PipelineDefinitions, dimension: int = 384) -> PipelineDefinitions:
    """The shipped YAML with the MiniLM embedders swapped for Haystack's mock ones, as a team edits it."""
    store, recall = yaml.safe_load(definitions.store), yaml.safe_load(definitions.recall)
    store["components"]["embed"] = {
        "type": "haystack.components.embedders.mock_document_embedder.MockDocumentEmbedder",
        "init_parameters": {"dimension": dimension},
    }
    recall["components"]["embed"]["init_parameters"]["embedder"] = {
        "type": "haystack.components.embedders.mock_text_embedder.MockTextEmbedder",
        "init_parameters": {"dimension": dimension},
    }
    return PipelineDefinitions(yaml.safe_dump(store), yaml.safe_dump(recall), "edited")


def write(definitions: PipelineDefinitions, folder: Path) -> Path:
    """``definitions`` as the two files of a pipelines folder."""
    for name, text in (("kb_memory_store", definitions.store), ("kb_memory_recall", definitions.recall)):
        path = folder / name / ("store.yml" if name == "kb_memory_store" else "recall.yml")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return folder


def chunk_embedding(pg_conn_str: str, config: MemoryConfig, document_id: str) -> Any:
    with psycopg.connect(pg_conn_str) as conn:
        row = conn.execute(
            sql.SQL("SELECT embedding::text FROM {schema}.{chunk} WHERE id = %s").format(**config.sql_names()),
            (document_id,),
        ).fetchone()
    assert row is not None
    return None if row[0] is None else [float(x) for x in row[0].strip("[]").split(",")]


@pytest.mark.embeddings
def test_the_shipped_yaml_is_the_built_in_pipeline() -> None:
    shipped = PipelineDefinitions.find(SHIPPED)
    assert shipped is not None
    built = default_definitions()
    assert (shipped.store, shipped.recall) == (built.store, built.recall)


def test_an_edited_yaml_embedder_is_what_memory_runs(pg_conn_str: str, config: MemoryConfig) -> None:
    shipped = PipelineDefinitions.find(SHIPPED)
    assert shipped is not None
    memory = Memory(config.model_copy(update={"embedder": "auto"}), definitions=with_mock_embedders(shipped))
    fact = "The release train leaves every second Tuesday"
    stored = memory.store(fact, caller=ME)
    expected = MockDocumentEmbedder(dimension=384).run(documents=[Document(content=fact)])["documents"][0].embedding
    assert chunk_embedding(pg_conn_str, config, stored["document_id"]) == pytest.approx(expected, abs=1e-6)
    assert memory.hybrid
    assert type(memory.text_embedder).__name__ == "GuardedTextEmbedder"
    recalled = memory.recall("when does the release train leave?", caller=ME)
    assert recalled["facts"][0]["document_id"] == stored["document_id"]
    assert "degraded" not in recalled


def test_embedder_none_serves_the_yaml_lexically(pg_conn_str: str, config: MemoryConfig) -> None:
    shipped = PipelineDefinitions.find(SHIPPED)
    assert shipped is not None
    memory = Memory(config, definitions=with_mock_embedders(shipped))  # config.embedder == "none"
    stored = memory.store("Lexical recall still works from YAML", caller=ME)
    assert not memory.hybrid
    assert chunk_embedding(pg_conn_str, config, stored["document_id"]) is None
    assert memory.recall("lexical recall yaml", caller=ME)["facts"][0]["document_id"] == stored["document_id"]
    assert "embed" not in {name for name, _ in memory.store_pipeline.walk()}  # type: ignore[union-attr]


def test_the_server_settings_bind_to_the_yaml(config: MemoryConfig) -> None:
    """Tables, redaction classes and statuses come from the configuration, whatever the YAML says."""
    shipped = PipelineDefinitions.find(SHIPPED)
    assert shipped is not None
    memory = Memory(config.model_copy(update={"redaction_off": ("private_ip",)}), definitions=shipped)
    memory.warm_up()
    assert memory.store_pipeline is not None
    assert memory.recall_pipeline is not None
    writer, retriever = memory.store_pipeline.get_component("write"), memory.recall_pipeline.get_component("retrieve")
    assert writer.store.kb_schema == retriever.store.kb_schema == config.kb_schema  # type: ignore[attr-defined]
    assert "private_ip" not in memory.store_pipeline.get_component("redact").enabled_classes  # type: ignore[attr-defined]
    stored = memory.store("The build box is at 10.1.2.3", caller=ME)
    assert memory.read(stored["document_id"], caller=ME)["content"] == "The build box is at 10.1.2.3"


def test_a_module_outside_the_allow_list_is_refused(config: MemoryConfig) -> None:
    shipped = PipelineDefinitions.find(SHIPPED)
    assert shipped is not None
    store = yaml.safe_load(shipped.store)
    store["components"]["redact"] = {"type": "subprocess.Popen", "init_parameters": {"args": ["true"]}}
    memory = Memory(config, definitions=PipelineDefinitions(yaml.safe_dump(store), shipped.recall, "hostile"))
    with pytest.raises(ConfigurationError, match=r"hostile: the pipeline could not be loaded.*subprocess"):
        memory.warm_up()


def test_both_files_or_neither(tmp_path: Path) -> None:
    assert PipelineDefinitions.find(tmp_path) is None
    (tmp_path / "kb_memory_store").mkdir()
    (tmp_path / "kb_memory_store" / "store.yml").write_text("components: {}\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="needs both"):
        PipelineDefinitions.find(tmp_path)
