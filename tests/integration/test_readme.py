"""The README's Python examples run as printed."""

from __future__ import annotations

import re

import pytest

from haystack_osa_memory import MemoryConfig
from haystack_osa_memory import memory as memory_module
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import REPO, drop_schema

pytestmark = pytest.mark.integration


def _python_blocks() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_examples_run(pg_conn_str: str, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _python_blocks()
    assert len(blocks) >= 2
    monkeypatch.setenv("PG_CONN_STR", pg_conn_str)
    monkeypatch.setenv("OSA_MEMORY_KB_SCHEMA", "readme_kb")
    monkeypatch.setenv("OSA_MEMORY_SCHEMA", "readme_kb")
    monkeypatch.setattr(memory_module, "_shared", None)
    # With PG_CONN_STR the README has `osa-memory init` run first (memory itself runs no DDL there).
    ensure_schema(pg_conn_str, MemoryConfig.from_env())
    try:
        for block in blocks:
            exec(compile(block, "README.md", "exec"), {})  # noqa: S102 - our own documentation
    finally:
        drop_schema(pg_conn_str, "readme_kb")
