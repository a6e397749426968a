"""Docs match the code: every setting and every tool is documented."""

from __future__ import annotations

import re
from pathlib import Path

from haystack_osa_memory.config import ENVIRONMENT

REPO = Path(__file__).resolve().parents[2]


def test_every_environment_variable_is_documented() -> None:
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [name for name in ENVIRONMENT if f"`{name}`" not in text]
    assert missing == []


def test_every_environment_variable_the_package_reads_is_documented() -> None:
    # Beside MemoryConfig's: the ones other modules read themselves (the embedded server's, serve's own).
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    named = {
        m.group(1)
        for path in (REPO / "haystack_osa_memory").rglob("*.py")
        for m in re.finditer(r'"(OSA_MEMORY_[A-Z0-9_]+)"', path.read_text(encoding="utf-8"))
    }
    assert "OSA_MEMORY_PG_SHARED_BUFFERS" in named
    assert sorted(name for name in named if f"`{name}`" not in text) == []


def test_every_tool_is_documented_and_has_a_wrapper() -> None:
    tools = sorted(p.name for p in (REPO / "pipelines").iterdir() if (p / "pipeline_wrapper.py").exists())
    assert len(tools) == 10
    docs = (REPO / "docs" / "security.md").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert [t for t in tools if f"`{t}`" not in docs] == []
    assert [t for t in tools if f"`{t}`" not in readme] == []


def test_the_offline_grace_default_is_the_one_documented() -> None:
    from haystack_osa_memory.config import MemoryConfig

    default = MemoryConfig.model_fields["offline_grace"].default
    operations = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    configuration = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert f"`OSA_MEMORY_OFFLINE_GRACE` seconds (default {default:g})" in operations
    assert re.search(rf"\| `OSA_MEMORY_OFFLINE_GRACE` \| `offline_grace` \| `{default:g}` \|", configuration)
    assert re.findall(r"OFFLINE_GRACE`[^.]{0,40}default (\d+)", operations) == [f"{default:g}"]


def test_every_error_kind_of_the_metrics_is_documented() -> None:
    import inspect

    from haystack_osa_memory import errors

    kinds = [
        name
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.OsaMemoryError) and cls is not errors.OsaMemoryError
    ]
    operations = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    sentence = operations[operations.index("`kind` is the class name of the typed error") :].split("`internal`")[0]
    assert "SupersessionError" in kinds
    assert [kind for kind in kinds if f"`{kind}`" not in sentence] == []
