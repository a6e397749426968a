"""Traces of tool calls (`haystack_osa_memory.mcp.telemetry`) through Haystack's tracer, exported with the
OpenTelemetry SDK's in-memory exporter: one span per call with its outcome, Haystack's pipeline and
component spans beneath it, and no fact text, query or secret anywhere in them."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from haystack import Pipeline, component
from haystack.tracing.tracer import Span, Tracer, disable_tracing, enable_tracing
from haystack.tracing.tracer import tracer as haystack_tracer
from mcp.types import CallToolResult, TextContent
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from haystack_osa_memory.errors import NotFoundError
from haystack_osa_memory.mcp import telemetry

SECRET = "the staging VPN password is hunter2-Zebra"
SERVED = {"kb_memory_recall": None, "kb_memory_store": None, "kb_memory_forget": None}


@component
class Echo:
    """Stands for a pipeline component that receives the fact or the query."""

    @component.output_types(text=str)
    def run(self, text: str) -> dict[str, Any]:
        return {"text": text}


def pipeline() -> Pipeline:
    pipe = Pipeline()
    pipe.add_component("echo", Echo())
    return pipe


async def handler(name: str, arguments: dict[str, Any] | None) -> Any:
    """A tool-call handler as Hayhooks runs it: the pipeline in a worker thread, with the text."""
    text = (arguments or {})["text"]
    await anyio.to_thread.run_sync(lambda: pipeline().run({"echo": {"text": text}}))
    if name == "kb_memory_forget":
        raise NotFoundError(f"no fact like {text!r} in your scope")
    if name == "kb_memory_store":
        raise RuntimeError(f"boom while storing {text!r}")
    result = {"facts": [{"content": text}, {"content": "other"}], "degraded": None}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(result))], structuredContent=result)


class ExceptionRecordingTracer(Tracer):
    """A Haystack tracer as third-party ones are: every tag kept, exceptions recorded by OpenTelemetry."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer

    @contextlib.contextmanager
    def trace(
        self, operation_name: str, tags: dict[str, Any] | None = None, parent_span: Span | None = None
    ) -> Iterator[Span]:
        with self.tracer.start_as_current_span(operation_name) as raw:
            span = telemetry.OtelSpan(raw)
            span.set_tags(tags or {})
            yield span

    def current_span(self) -> Span | None:
        return telemetry.OtelSpan(otel_trace.get_current_span())


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An OpenTelemetry provider with an in-memory exporter, seen as the process's provider; Haystack's
    tracer as it was before the test afterwards."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(otel_trace, "get_tracer_provider", lambda: provider)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    saved = (haystack_tracer.actual_tracer, haystack_tracer.is_content_tracing_enabled)
    disable_tracing()
    try:
        yield memory
    finally:
        haystack_tracer.actual_tracer, haystack_tracer.is_content_tracing_enabled = saved
        provider.shutdown()


def call(instrumented: Any, name: str) -> tuple[bool, Any]:
    async def main() -> tuple[bool, Any]:
        try:
            return False, await instrumented(name, {"text": SECRET})
        except Exception as e:
            return True, e

    return anyio.run(main)


def dump(spans: tuple[ReadableSpan, ...]) -> str:
    """Everything exported about the spans: names, attributes, events, status, links."""
    return "\n".join(span.to_json() for span in spans)


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_haystack_puts_pipeline_input_in_a_plain_tag(exporter: InMemorySpanExporter) -> None:
    """Why every tracer is wrapped: without it, the pipeline's input (the fact) is exported even with
    content tracing off."""
    enable_tracing(telemetry.OtelTracer(otel_trace.get_tracer_provider().get_tracer("test")))
    assert haystack_tracer.is_content_tracing_enabled is False
    pipeline().run({"echo": {"text": SECRET}})
    assert SECRET in dump(exporter.get_finished_spans())


def test_each_tool_call_is_one_span_with_its_outcome(exporter: InMemorySpanExporter) -> None:
    instrumented = telemetry.instrument_tool_call(SERVED)(handler)
    assert isinstance(haystack_tracer.actual_tracer, telemetry.ContentFreeTracer)

    failed, result = call(instrumented, "kb_memory_recall")
    assert not failed
    assert result.structuredContent["facts"][0]["content"] == SECRET
    assert call(instrumented, "kb_memory_forget")[0]
    assert call(instrumented, "kb_memory_store")[0]
    assert call(instrumented, SECRET)[0] is False  # the fake handler answers any name; the span is bounded

    spans = exporter.get_finished_spans()
    recall = by_name(spans, "osa_memory.tool.kb_memory_recall")
    forget = by_name(spans, "osa_memory.tool.kb_memory_forget")
    store = by_name(spans, "osa_memory.tool.kb_memory_store")
    unknown = by_name(spans, "osa_memory.tool.unknown")
    assert [len(recall), len(forget), len(store), len(unknown)] == [1, 1, 1, 1]
    assert dict(recall[0].attributes or {}) == {
        "osa_memory.tool.name": "kb_memory_recall",
        "osa_memory.tool.status": "ok",
        "osa_memory.tool.result_count": 2,
        "osa_memory.tool.degraded": False,
    }
    assert recall[0].status.status_code == otel_trace.StatusCode.UNSET
    assert forget[0].attributes is not None
    assert forget[0].attributes["osa_memory.tool.status"] == "error"
    assert forget[0].attributes["osa_memory.tool.error_kind"] == "NotFoundError"
    assert forget[0].status.status_code == otel_trace.StatusCode.ERROR
    assert forget[0].status.description == "NotFoundError"
    assert store[0].attributes is not None
    assert store[0].attributes["osa_memory.tool.error_kind"] == "internal"
    assert unknown[0].attributes is not None
    assert unknown[0].attributes["osa_memory.tool.name"] == "unknown"

    # Haystack's own spans run beneath the tool's span (in the worker thread), without their inputs.
    runs = by_name(spans, "haystack.pipeline.run")
    components = by_name(spans, "haystack.component.run")
    assert len(runs) == len(components) == 4
    assert runs[0].parent is not None
    assert runs[0].parent.span_id == recall[0].context.span_id
    assert components[0].attributes is not None
    assert components[0].attributes["haystack.component.name"] == "echo"
    assert "haystack.pipeline.input_data" not in (runs[0].attributes or {})
    assert all(event.name != "exception" for span in spans for event in span.events)

    text = dump(spans)
    assert SECRET not in text
    assert "hunter2" not in text


def test_a_tracer_enabled_elsewhere_is_wrapped(exporter: InMemorySpanExporter) -> None:
    """A third-party tracer (every tag, exceptions recorded with their message) gets nothing to leak."""
    enable_tracing(ExceptionRecordingTracer(otel_trace.get_tracer_provider().get_tracer("third-party")))
    instrumented = telemetry.instrument_tool_call(SERVED)(handler)
    assert telemetry.configure_tracing() == "haystack"
    assert call(instrumented, "kb_memory_forget")[0]
    assert call(instrumented, "kb_memory_recall")[0] is False

    spans = exporter.get_finished_spans()
    assert len(by_name(spans, "osa_memory.tool.kb_memory_forget")) == 1
    assert len(by_name(spans, "haystack.pipeline.run")) == 2
    assert SECRET not in dump(spans)


def test_content_tracing_stays_off(exporter: InMemorySpanExporter) -> None:
    haystack_tracer.is_content_tracing_enabled = True  # as HAYSTACK_CONTENT_TRACING_ENABLED=true would
    assert telemetry.configure_tracing() == "opentelemetry"
    assert haystack_tracer.is_content_tracing_enabled is False
    haystack_tracer.is_content_tracing_enabled = True  # even if something turns it on again later
    call(telemetry.instrument_tool_call(SERVED)(handler), "kb_memory_recall")
    components = by_name(exporter.get_finished_spans(), "haystack.component.run")
    assert components
    assert "haystack.component.input" not in (components[0].attributes or {})
    assert SECRET not in dump(exporter.get_finished_spans())


def test_no_provider_and_no_endpoint_means_no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otel_trace, "get_tracer_provider", otel_trace.ProxyTracerProvider)
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    saved = haystack_tracer.actual_tracer
    disable_tracing()
    try:
        assert telemetry.configure_tracing() == "off"
        assert type(haystack_tracer.actual_tracer).__name__ == "NullTracer"
    finally:
        haystack_tracer.actual_tracer = saved


def test_only_names_counts_and_flags_pass_the_wrapper() -> None:
    assert telemetry.allowed_tag("osa_memory.tool.name")
    assert telemetry.allowed_tag("haystack.component.name")
    for key in (
        "haystack.pipeline.input_data",
        "haystack.pipeline.output_data",
        "haystack.component.input",
        "haystack.component.output",
        "haystack.pipeline.metadata",
        "hayhooks.error.message",
        "hayhooks.error.stack",
        "haystack.agent.input",
    ):
        assert not telemetry.allowed_tag(key), key


def test_hayhooks_mirrors_no_span_into_its_unserved_trace_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hayhooks' own tracing set-up (run as it builds the MCP app) leaves Haystack's tracer as it found it
    once `server.without_trace_buffer` ran: without it, a live-buffer tracer wraps every span."""
    from hayhooks.server.tracing import configure_tracing as hayhooks_configure_tracing
    from hayhooks.settings import settings as hayhooks_settings

    from haystack_osa_memory.mcp.server import without_trace_buffer

    monkeypatch.setattr(hayhooks_settings, "tracing_include_haystack_spans", True)
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    try:
        disable_tracing()
        hayhooks_configure_tracing()
        assert type(haystack_tracer.actual_tracer).__name__ == "_LiveBufferNullTracer"  # what it does by default
        disable_tracing()
        without_trace_buffer()
        hayhooks_configure_tracing()
        assert type(haystack_tracer.actual_tracer).__name__ == "NullTracer"
    finally:
        disable_tracing()
