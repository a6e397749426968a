"""The app `osa-memory serve` builds in each serving process copies pipeline inputs with
`copy_component_inputs` and opens component spans with `lean_component_span`, and its recall pipeline answers
through them as before."""

from __future__ import annotations

import pytest
from haystack.core.pipeline import base as pipeline_base
from haystack.core.pipeline import pipeline as pipeline_module
from haystack.core.pipeline.base import PipelineBase
from haystack.core.pipeline.utils import _deepcopy_with_exceptions as haystack_copy

from haystack_osa_memory import Caller
from haystack_osa_memory import memory as memory_module
from haystack_osa_memory.mcp.server import create_app
from haystack_osa_memory.pipeline_inputs import copy_component_inputs
from haystack_osa_memory.pipeline_spans import _HAYSTACK_SPAN, lean_component_span

pytestmark = pytest.mark.integration


@pytest.mark.usefixtures("served_env")
def test_the_served_app_copies_inputs_the_lean_way(alice: Caller, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_module, "_deepcopy_with_exceptions", haystack_copy)
    monkeypatch.setattr(pipeline_base, "_deepcopy_with_exceptions", haystack_copy)
    monkeypatch.setattr(PipelineBase, "_create_component_span", staticmethod(_HAYSTACK_SPAN))

    create_app(lambda token: alice)

    assert pipeline_module._deepcopy_with_exceptions is copy_component_inputs
    assert pipeline_base._deepcopy_with_exceptions is copy_component_inputs
    assert PipelineBase.__dict__["_create_component_span"].__func__ is lean_component_span
    memory = memory_module.shared_memory()
    memory.store("Staging deploys need the blue VPN profile", "ops", caller=alice)
    facts = memory.recall("which VPN profile for staging?", limit=3, caller=alice)["facts"]
    assert [f["content"] for f in facts] == ["Staging deploys need the blue VPN profile"]
