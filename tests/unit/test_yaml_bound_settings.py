"""Values of the store and recall YAML that the server's configuration decides: the shipped files leave
them out, an edited value equal to the server's loads, any other is refused at load with the setting
that decides it (an edit with no effect never passes silently)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from haystack_osa_memory import ConfigurationError, MemoryConfig, build_recall_pipeline, build_store_pipeline
from haystack_osa_memory.store.memory_store import MemoryStore
from haystack_osa_memory.yaml_pipelines import PipelineDefinitions, load_pipeline
from tests.conftest import REPO

CONFIG = MemoryConfig(embedder="minilm", chunk_table="kb_chunks")
BOUND_KEYS = {"store", "dataset", "status", "admitted_statuses", "enabled_classes", "timeout", "runtime"}


def shipped() -> PipelineDefinitions:
    found = PipelineDefinitions.find(REPO / "pipelines")
    assert found is not None
    return found


def load(text: str, config: MemoryConfig = CONFIG) -> Any:
    return load_pipeline(text, config=config, store=MemoryStore.from_config(config), origin="edited.yml")


def edited(which: str, change: Callable[[dict[str, Any]], None]) -> str:
    data = yaml.safe_load(getattr(shipped(), which))
    change(data["components"])
    return yaml.safe_dump(data)


def test_the_shipped_yaml_states_no_bound_value() -> None:
    for text in (shipped().store, shipped().recall):
        for component in yaml.safe_load(text)["components"].values():
            params = component["init_parameters"]
            inner = (params.get("embedder") or {}).get("init_parameters", {})
            assert not (BOUND_KEYS & (set(params) | set(inner))), component["type"]


def test_the_shipped_yaml_loads_with_the_server_settings() -> None:
    config = CONFIG.model_copy(update={"embedder": "none", "dataset": "team-kb", "redaction_off": ("private_ip",)})
    store = load(shipped().store, config)
    assert store.get_component("mark").dataset == "team-kb"
    assert "private_ip" not in store.get_component("redact").enabled_classes
    assert store.get_component("write").store.chunk_table == "kb_chunks"


def test_the_document_precision_is_the_server_setting() -> None:
    """Stored vectors are written alike by the server and the command line (import, reflect), which
    builds its embedder from the same setting; the query embedder's precision stays the YAML's."""
    assert "precision" not in yaml.safe_load(shipped().store)["components"]["embed"]["init_parameters"]
    for precision in ("int8", "float32", "float16"):
        config = CONFIG.model_copy(update={"document_precision": precision})
        assert load(shipped().store, config).get_component("embed").precision == precision
        recall = load(shipped().recall, config).get_component("embed")
        assert recall.embedder.precision == "int8"  # the shipped recall YAML's


def test_values_equal_to_the_server_settings_load() -> None:
    """A pipeline saved from the same configuration states every bound value: it loads as it is."""
    config = CONFIG.model_copy(update={"embedder": "none"})
    for pipe in (build_store_pipeline(config), build_recall_pipeline(config)):
        assert load(pipe.dumps(), config).to_dict() == pipe.to_dict()


def _set(component: str, param: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(components: dict[str, Any]) -> None:
        components[component]["init_parameters"][param] = value

    return change


def _store_block(component: str, param: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(components: dict[str, Any]) -> None:
        block = MemoryStore.from_config(CONFIG).to_dict()
        block["init_parameters"][param] = value
        components[component]["init_parameters"]["store"] = block

    return change


REFUSED = [
    (
        "store",
        _set("mark", "dataset", "other-dataset"),
        "components.mark.init_parameters.dataset",
        "OSA_MEMORY_DATASET",
    ),
    ("store", _set("mark", "status", "proposed"), "mark.init_parameters.status", "MemoryConfig.admitted_statuses"),
    ("store", _set("redact", "enabled_classes", ["secret"]), "enabled_classes", "OSA_MEMORY_REDACTION_OFF"),
    ("recall", _set("embed", "timeout", 30.0), "embed.init_parameters.timeout", "OSA_MEMORY_EMBEDDER_TIMEOUT"),
    ("store", _set("embed", "precision", "int8"), "embed.init_parameters.precision", "OSA_MEMORY_DOCUMENT_PRECISION"),
    (
        "recall",
        _set("retrieve", "admitted_statuses", ["approved", "proposed"]),
        "retrieve.init_parameters.admitted_statuses",
        "MemoryConfig.admitted_statuses",
    ),
    ("recall", _set("acl", "admitted_statuses", ["flagged"]), "acl.init_parameters.admitted_statuses", "admitted"),
    (
        "store",
        _store_block("write", "chunk_table", "haystack_documents"),
        "store.init_parameters.chunk_table",
        "OSA_MEMORY_CHUNK_TABLE",
    ),
    ("recall", _store_block("retrieve", "kb_schema", "kb"), "init_parameters.kb_schema", "OSA_MEMORY_KB_SCHEMA"),
    (
        "recall",
        _store_block("acl", "statement_timeout_ms", 100),
        "statement_timeout_ms",
        "OSA_MEMORY_STATEMENT_TIMEOUT_MS",
    ),
    ("store", _store_block("write", "embedding_dimension", 768), "embedding_dimension", "OSA_MEMORY_EMBEDDING_DIM"),
]


@pytest.mark.parametrize(("which", "change", "where", "setting"), REFUSED, ids=[r[2] for r in REFUSED])
def test_a_value_other_than_the_server_binds_is_refused(
    which: str, change: Callable[[dict[str, Any]], None], where: str, setting: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        load(edited(which, change))
    message = str(refused.value)
    assert message.startswith("edited.yml: ")
    assert where in message
    assert setting in message
    assert "docs/configuration.md" in message


def test_a_store_block_naming_another_connection_is_refused_without_echoing_it() -> None:
    secret = {"type": "env_var", "env_vars": ["TEAM_DB_URL_hunter2"], "strict": True}
    text = edited("store", _store_block("write", "connection_string", secret))
    with pytest.raises(ConfigurationError, match="must name the variable PG_CONN_STR") as refused:
        load(text)
    assert "hunter2" not in str(refused.value)


def test_an_unknown_store_parameter_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"pool_size is not a MemoryStore parameter; allowed: \["):
        load(edited("store", _store_block("write", "pool_size", 99)))


def test_the_embedders_runtime_is_the_server_setting() -> None:
    """Store and recall (its embedder wrapped in `GuardedTextEmbedder`) run the runtime the server names; a YAML
    stating another is refused, naming the setting."""
    for runtime in ("onnx", "torch"):
        config = CONFIG.model_copy(update={"embedder_runtime": runtime})
        assert load(shipped().store, config).get_component("embed").runtime == runtime
        assert load(shipped().recall, config).get_component("embed").embedder.runtime == runtime

    def torch_in_recall(components: dict[str, Any]) -> None:
        components["embed"]["init_parameters"]["embedder"]["init_parameters"]["runtime"] = "torch"

    with pytest.raises(ConfigurationError, match="OSA_MEMORY_EMBEDDER_RUNTIME") as refused:
        load(edited("recall", torch_in_recall))
    assert "components.embed.init_parameters.embedder.init_parameters.runtime" in str(refused.value)
    assert load(edited("recall", torch_in_recall), CONFIG.model_copy(update={"embedder_runtime": "torch"}))
