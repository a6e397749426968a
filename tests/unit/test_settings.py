"""One settings model: a `MemoryConfig` built in code never reads the environment, `MemoryConfig.from_env()`
reads every variable of the model, the store's defaults are the model's, and docs/configuration.md is
what the model generates."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from haystack_osa_memory import ConfigurationError, MemoryConfig, build_store_pipeline
from haystack_osa_memory.config import ENVIRONMENT, enabled_redaction_classes
from haystack_osa_memory.config_docs import BEGIN, END, configuration_markdown, with_generated_section
from haystack_osa_memory.privacy.gate import redact_field
from haystack_osa_memory.privacy.redaction import CLASSES
from haystack_osa_memory.settings import load_config
from haystack_osa_memory.store.memory_store import STORE_FIELDS, MemoryStore
from tests.conftest import REPO

#: Per variable: a valid value other than the default, and the setting it gives.
EXAMPLES: dict[str, tuple[str, object]] = {
    "PG_CONN_STR": ("postgresql://u:p@db.example:5432/kb", "postgresql://u:p@db.example:5432/kb"),
    "OSA_MEMORY_CONSOLE_PG_CONN_STR": ("postgresql://console@db/kb", "postgresql://console@db/kb"),
    "OSA_MEMORY_DATA_DIR": ("/srv/osa", Path("/srv/osa")),
    "OSA_MEMORY_PG_SHARED_BUFFERS": ("512MB", "512MB"),
    "OSA_MEMORY_KB_SCHEMA": ("kb", "kb"),
    "OSA_MEMORY_CHUNK_TABLE": ("kb_chunks", "kb_chunks"),
    "OSA_MEMORY_GOVERNING_TABLE": ("kb_documents", "kb_documents"),
    "OSA_MEMORY_SCHEMA": ("memory", "memory"),
    "OSA_MEMORY_EMBEDDING_DIM": ("768", 768),
    "OSA_MEMORY_LANGUAGE": ("german", "german"),
    "OSA_MEMORY_EMBEDDER": ("none", "none"),
    "OSA_MEMORY_EMBEDDER_TIMEOUT": ("2.5", 2.5),
    "OSA_MEMORY_QUERY_PRECISION": ("float32", "float32"),
    "OSA_MEMORY_DOCUMENT_PRECISION": ("int8", "int8"),
    "OSA_MEMORY_EMBEDDER_RUNTIME": ("torch", "torch"),
    "OSA_MEMORY_DATASET": ("team-kb", "team-kb"),
    "OSA_MEMORY_STATEMENT_TIMEOUT_MS": ("2000", 2000),
    "OSA_MEMORY_POOL_TIMEOUT": ("1.5", 1.5),
    "OSA_MEMORY_PREPARED_STATEMENTS": ("false", False),
    "OSA_MEMORY_ENABLED": ("false", False),
    "OSA_MEMORY_TRUST_FLOOR": ("0.5", 0.5),
    "OSA_MEMORY_SUGGEST_SUPERSEDES": ("false", False),
    "OSA_MEMORY_BUFFER": ("/srv/osa/buffer.jsonl", Path("/srv/osa/buffer.jsonl")),
    "OSA_MEMORY_OFFLINE_GRACE": ("60", 60.0),
    "OSA_MEMORY_CALL_SLOTS": ("0", 0),
    "OSA_MEMORY_CALL_LEASE": ("0.2", 0.2),
    "OSA_MEMORY_REDACTION_OFF": ("private_ip, user_path", ("private_ip", "user_path")),
    "OSA_MEMORY_SCOPE_CACHE_FACTS": ("0", 0),
    "OSA_MEMORY_TOKEN": (" osa_tok_123 ", "osa_tok_123"),
    "OSA_MEMORY_PIPELINES_DIR": ("/srv/pipelines", Path("/srv/pipelines")),
    "OSA_MEMORY_METRICS_DIR": ("/run/osa-metrics", Path("/run/osa-metrics")),
}


def test_every_variable_has_an_example() -> None:
    assert sorted(EXAMPLES) == sorted(ENVIRONMENT)


@pytest.mark.parametrize("variable", sorted(EXAMPLES))
def test_a_config_built_in_code_ignores_the_environment_the_loader_reads_it(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    raw, expected = EXAMPLES[variable]
    name = ENVIRONMENT[variable]
    monkeypatch.setenv(variable, raw)
    default = MemoryConfig.model_fields[name].get_default(call_default_factory=True)
    assert default != expected
    assert getattr(MemoryConfig(), name) == default
    assert getattr(MemoryConfig(admitted_statuses=("approved", "draft")), name) == default
    assert getattr(MemoryConfig.from_env(), name) == expected


def test_a_given_mapping_replaces_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSA_MEMORY_DATASET", "from-process")
    monkeypatch.setenv("OSA_MEMORY_LANGUAGE", "german")
    config = MemoryConfig.from_env({"OSA_MEMORY_DATASET": "from-mapping", "OSA_MEMORY_CHUNK_TABLE": ""})
    assert (config.dataset, config.language, config.chunk_table) == ("from-mapping", "english", "haystack_documents")


def test_overrides_win_over_the_environment_and_none_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSA_MEMORY_DATASET", "from-env")
    monkeypatch.setenv("OSA_MEMORY_LANGUAGE", "german")
    config = MemoryConfig.from_env(dataset="override", language=None, admitted_statuses=("approved", "draft"))
    assert (config.dataset, config.language, config.admitted_statuses) == ("override", "german", ("approved", "draft"))


def test_empty_and_lowercase_names_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSA_MEMORY_DATASET", "")
    monkeypatch.setenv("osa_memory_language", "german")
    config = MemoryConfig.from_env()
    assert (config.dataset, config.language) == ("osa-memory", "english")


def test_an_invalid_value_names_its_variable_and_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSA_MEMORY_EMBEDDING_DIM", "0")
    with pytest.raises(ConfigurationError, match=r"OSA_MEMORY_EMBEDDING_DIM \(embedding_dimension\)"):
        MemoryConfig.from_env()


@pytest.mark.parametrize(
    ("variable", "value"),
    [("OSA_MEMORY_CALL_SLOTS", "-1"), ("OSA_MEMORY_CALL_SLOTS", "two"), ("OSA_MEMORY_CALL_LEASE", "0")],
)
def test_call_slots_and_lease_out_of_range_are_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=variable):
        MemoryConfig.from_env()


def test_a_process_that_reads_one_setting_is_not_stopped_by_another(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSA_MEMORY_LANGUAGE", "not a language")
    monkeypatch.setenv("OSA_MEMORY_TOKEN", "tok")
    assert load_config(only=("token",)).token == "tok"
    with pytest.raises(ConfigurationError, match="OSA_MEMORY_LANGUAGE"):
        load_config()


def test_the_store_defaults_are_the_models() -> None:
    parameters = inspect.signature(MemoryStore.__init__).parameters
    store = MemoryStore()
    for name in STORE_FIELDS:
        default = MemoryConfig.model_fields[name].get_default()
        assert getattr(store.config, name) == default, name
        if parameters[name].default is not None:
            assert parameters[name].default == default, name


def test_the_enabled_redaction_classes_are_computed_once() -> None:
    config = MemoryConfig(redaction_off=("private_ip", "jwt"))
    expected = [c for c in CLASSES if c not in ("private_ip", "jwt")]
    assert config.enabled_redaction_classes == expected
    assert enabled_redaction_classes(config.redaction_off) == expected
    assert MemoryConfig().enabled_redaction_classes == list(CLASSES)
    redactor = build_store_pipeline(config).get_component("redact")
    assert redactor.enabled_classes == expected
    text = "reach 10.1.2.3 from /home/alice/x"
    assert redact_field(text, config.redaction_off).text.startswith("reach 10.1.2.3 from ")
    assert "alice" not in redact_field(text, config.redaction_off).text


def test_the_configuration_page_is_what_the_model_generates() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page.count(BEGIN) == page.count(END) == 1
    assert configuration_markdown() in page, "run: python -m haystack_osa_memory.config_docs --write"
    assert with_generated_section(page) == page


def test_the_generated_section_lists_every_variable_default_and_description() -> None:
    section = configuration_markdown()
    for variable, name in ENVIRONMENT.items():
        field = MemoryConfig.model_fields[name]
        assert field.description
        row = next(line for line in section.splitlines() if line.startswith(f"| `{variable}` | `{name}` |"))
        assert " ".join(field.description.split()) in row
    assert "| `OSA_MEMORY_STATEMENT_TIMEOUT_MS` | `statement_timeout_ms` | `15000` |" in section
    assert "`admitted_statuses`" in section


def test_a_drifted_page_is_rewritten() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    drifted = page.replace(
        "| `OSA_MEMORY_DATASET` | `dataset` | `osa-memory` |", "| `OSA_MEMORY_DATASET` | `dataset` | `x` |"
    )
    assert drifted != page
    assert with_generated_section(drifted) == page
    with pytest.raises(ValueError, match="generated section"):
        with_generated_section("# no markers\n")
