"""`lean_component_span` builds no span tags while Haystack's tracer is its null one, and records every span and
tag Haystack's own builder records once a tracer is enabled; `use_lean_component_spans` puts it in Haystack's
pipeline class, idempotently, and leaves another replacement alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from haystack import Pipeline
from haystack.core.pipeline import base as pipeline_base
from haystack.core.pipeline.base import PipelineBase
from haystack.tracing.tracer import NullTracer, Span, Tracer, disable_tracing, enable_tracing
from haystack.tracing.tracer import tracer as haystack_tracer

from haystack_osa_memory import ScopeMarkerStripper, use_lean_component_spans
from haystack_osa_memory.components.fact_document import FactDocument
from haystack_osa_memory.markers import add_marker
from haystack_osa_memory.pipeline_spans import _HAYSTACK_SPAN, lean_component_span


class RecordedSpan(Span):
    def __init__(self, name: str, tags: dict[str, Any]) -> None:
        self.name, self.tags = name, dict(tags)

    def set_tag(self, key: str, value: Any) -> None:
        self.tags[key] = value


class RecordingTracer(Tracer):
    """Keeps every span's name and tags (content tags included)."""

    def __init__(self) -> None:
        self.spans: list[RecordedSpan] = []

    @contextlib.contextmanager
    def trace(
        self, operation_name: str, tags: dict[str, Any] | None = None, parent_span: Span | None = None
    ) -> Iterator[Span]:
        span = RecordedSpan(operation_name, tags or {})
        self.spans.append(span)
        yield span

    def current_span(self) -> Span | None:
        return self.spans[-1] if self.spans else None


@pytest.fixture
def haystack_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Haystack's own span builder and no tracer, put back after the test."""
    monkeypatch.setattr(PipelineBase, "_create_component_span", staticmethod(_HAYSTACK_SPAN))
    disable_tracing()
    yield
    disable_tracing()


def _pipeline() -> tuple[Pipeline, list[FactDocument]]:
    pipe = Pipeline()
    pipe.add_component("strip", ScopeMarkerStripper())
    docs = [FactDocument(id=f"d{i}", content=add_marker(f"fact {i}", "asg-1"), meta={"i": i}) for i in range(3)]
    return pipe, docs


@pytest.mark.usefixtures("haystack_spans")
def test_no_tags_are_built_without_a_tracer_and_the_answer_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe, docs = _pipeline()
    before = pipe.run({"strip": {"documents": docs}})
    assert use_lean_component_spans() is True
    assert use_lean_component_spans() is True  # idempotent
    assert type(haystack_tracer.actual_tracer) is NullTracer

    def no_tags(*args: Any) -> str:
        raise AssertionError("a span's tags were built for the null tracer")

    monkeypatch.setattr(pipeline_base, "generate_qualified_class_name", no_tags)
    assert pipe.run({"strip": {"documents": docs}}) == before
    with lean_component_span("strip", ScopeMarkerStripper(), {}) as span:
        span.set_tag("ignored", True)  # the null span takes tags and keeps none


@pytest.mark.usefixtures("haystack_spans")
def test_with_a_tracer_every_span_and_tag_is_haystacks() -> None:
    pipe, docs = _pipeline()
    recorded = []
    for lean in (False, True):
        if lean:
            assert use_lean_component_spans() is True
        tracer = RecordingTracer()
        enable_tracing(tracer)
        pipe.run({"strip": {"documents": docs}})
        disable_tracing()
        recorded.append([(s.name, s.tags) for s in tracer.spans])
    assert [name for name, _ in recorded[0]] == ["haystack.pipeline.run", "haystack.component.run"]
    assert recorded[1] == recorded[0]
    assert recorded[0][1][1]["haystack.component.input_types"] == {"documents": "list"}


@pytest.mark.usefixtures("haystack_spans")
def test_a_subclass_of_the_null_tracer_gets_haystacks_spans() -> None:
    """Hayhooks' live trace buffer is a null tracer that records: its spans carry their tags."""
    seen: list[dict[str, Any]] = []

    class BufferingNullTracer(NullTracer):
        @contextlib.contextmanager
        def trace(
            self, operation_name: str, tags: dict[str, Any] | None = None, parent_span: Span | None = None
        ) -> Iterator[Span]:
            seen.append(dict(tags or {}))
            with super().trace(operation_name, tags, parent_span) as span:
                yield span

    use_lean_component_spans()
    enable_tracing(BufferingNullTracer())
    pipe, docs = _pipeline()
    pipe.run({"strip": {"documents": docs}})
    assert any(t.get("haystack.component.name") == "strip" for t in seen)


@pytest.mark.usefixtures("haystack_spans")
def test_another_replacement_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def theirs(component_name: str, instance: Any, inputs: dict[str, Any], parent_span: Span | None = None) -> Any:
        return contextlib.nullcontext()

    monkeypatch.setattr(PipelineBase, "_create_component_span", staticmethod(theirs))
    assert use_lean_component_spans() is False
    assert PipelineBase.__dict__["_create_component_span"].__func__ is theirs
