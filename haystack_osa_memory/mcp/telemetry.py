"""Traces and metrics of each MCP tool call, through Haystack's own tracer, with no content in any span.

A tool call becomes one span ``osa_memory.tool.<name>`` (attributes ``osa_memory.tool.name``,
``osa_memory.tool.status``, ``osa_memory.tool.error_kind``, ``osa_memory.tool.result_count``,
``osa_memory.tool.degraded``), the parent of Hayhooks' and Haystack's own pipeline and component spans.

Haystack 3 has no tracing backend in core (its OpenTelemetry tracer moved to the `opentelemetry-haystack`
integration) and no auto-detection (`auto_enable_tracing` is gone): :func:`configure_tracing` keeps a
Haystack tracer that something else enabled, else uses an OpenTelemetry tracer provider already set on
the process (``opentelemetry-instrument``), else sets one up from the standard ``OTEL_EXPORTER_OTLP_*``
variables (the `tracing` extra), and enables :class:`OtelTracer` through `haystack.tracing.enable_tracing`.

Whatever the tracer, it is wrapped in a :class:`ContentFreeTracer`: Haystack puts a pipeline's whole
input (fact text, queries) in a plain tag of its ``haystack.pipeline.run`` span (not a content tag, so
``HAYSTACK_CONTENT_TRACING_ENABLED`` does not gate it), and OpenTelemetry records an exception's message
on its span. The wrapper passes only allow-listed attributes, drops every content tag, and reports a
failure by its class name only. Content tracing is kept off in the server.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from haystack.tracing.tracer import NullTracer, Span, Tracer, enable_tracing
from haystack.tracing.tracer import tracer as haystack_tracer
from haystack.tracing.utils import coerce_tag_value

from haystack_osa_memory.mcp import metrics

logger = logging.getLogger(__name__)

SPAN_PREFIX = "osa_memory.tool."
DEFAULT_SERVICE_NAME = "osa-memory"

#: Attributes other libraries set that carry names, types, counts and flags only.
ALLOWED_TAGS = frozenset(
    {
        "haystack.component.name",
        "haystack.component.type",
        "haystack.component.fully_qualified_type",
        "haystack.component.input_types",
        "haystack.component.input_spec",
        "haystack.component.output_spec",
        "haystack.component.visits",
        "haystack.pipeline.max_runs_per_component",
        "haystack.pipeline.execution_mode",
        "hayhooks.transport",
        "hayhooks.pipeline.name",
        "hayhooks.mcp.arguments.count",
        "hayhooks.action",
        "hayhooks.success",
        "hayhooks.error.type",
        "hayhooks.elapsed_ms",
        "hayhooks.http.status_code",
    }
)
#: Our own attributes (set by this module: names, statuses, kinds and counts).
OWN_PREFIX = "osa_memory."
ERROR_TYPE_TAG = "osa_memory.error.type"


def allowed_tag(key: str) -> bool:
    return key in ALLOWED_TAGS or key.startswith(OWN_PREFIX)


def _mark_failed(span: Span, error: BaseException) -> None:
    """The failure's class name on the span (and an OpenTelemetry span's status), never its message."""
    name = type(error).__name__
    span.set_tag(ERROR_TYPE_TAG, name)
    raw = span.raw_span()
    if hasattr(raw, "set_status"):
        try:
            from opentelemetry.trace import Status, StatusCode
        except ImportError:  # pragma: no cover - a span with set_status comes from OpenTelemetry
            return
        raw.set_status(Status(StatusCode.ERROR, name))


class ContentFreeSpan(Span):
    """A span that keeps allow-listed attributes only and never takes content."""

    def __init__(self, inner: Span) -> None:
        self.inner = inner

    def set_tag(self, key: str, value: Any) -> None:
        if allowed_tag(key):
            self.inner.set_tag(key, value)

    def set_content_tag(self, key: str, value: Any) -> None:
        return  # content (queries, documents, answers) never goes to a trace

    def raw_span(self) -> Any:
        return self.inner.raw_span()

    def get_correlation_data_for_logs(self) -> dict[str, Any]:
        return self.inner.get_correlation_data_for_logs()


class ContentFreeTracer(Tracer):
    """Wraps any Haystack tracer: allow-listed attributes only, no content tags, failures by class name.

    An exception is caught inside the inner span and raised again outside it, so the inner tracer never
    sees it (OpenTelemetry would record its message and stack trace as a span event).
    """

    def __init__(self, inner: Tracer) -> None:
        self.inner = inner

    @contextmanager
    def trace(
        self, operation_name: str, tags: dict[str, Any] | None = None, parent_span: Span | None = None
    ) -> Iterator[Span]:
        parent = parent_span.inner if isinstance(parent_span, ContentFreeSpan) else parent_span
        kept = {k: v for k, v in (tags or {}).items() if allowed_tag(k)}
        failure: BaseException | None = None
        with self.inner.trace(operation_name, tags=kept, parent_span=parent) as span:
            try:
                yield ContentFreeSpan(span)
            except BaseException as e:
                failure = e
                _mark_failed(span, e)
        if failure is not None:
            raise failure

    def current_span(self) -> Span | None:
        span = self.inner.current_span()
        return None if span is None else ContentFreeSpan(span)


class OtelSpan(Span):
    """A Haystack span over an OpenTelemetry span."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def set_tag(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, coerce_tag_value(value))

    def raw_span(self) -> Any:
        return self.span

    def get_correlation_data_for_logs(self) -> dict[str, Any]:
        context = self.span.get_span_context()
        return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


class OtelTracer(Tracer):
    """Haystack's tracer interface over an OpenTelemetry tracer (Haystack 3 has none in core).

    Exceptions are not recorded by OpenTelemetry here (their messages may quote arguments): a failed
    span gets status ERROR with the exception's class name.
    """

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer

    @contextmanager
    def trace(
        self, operation_name: str, tags: dict[str, Any] | None = None, parent_span: Span | None = None
    ) -> Iterator[Span]:
        from opentelemetry import trace as otel_trace

        context = otel_trace.set_span_in_context(parent_span.raw_span()) if parent_span is not None else None
        with self.tracer.start_as_current_span(
            operation_name, context=context, record_exception=False, set_status_on_exception=False
        ) as raw:
            span = OtelSpan(raw)
            if tags:
                span.set_tags(tags)
            try:
                yield span
            except BaseException as e:
                _mark_failed(span, e)
                raise

    def current_span(self) -> Span | None:
        from opentelemetry import trace as otel_trace

        raw = otel_trace.get_current_span()
        return OtelSpan(raw) if raw.get_span_context().is_valid else None


def ensure_content_free() -> None:
    """Wrap Haystack's current tracer in a :class:`ContentFreeTracer` unless it is already (or no-op).

    Called on every tool call as well: Hayhooks (re)configures Haystack's tracer while the app is built.
    """
    actual = haystack_tracer.actual_tracer
    if type(actual) is NullTracer or isinstance(actual, ContentFreeTracer):
        return
    enable_tracing(ContentFreeTracer(actual))


def _otlp_exporter() -> Any | None:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    )
    try:
        if protocol.strip().lower() == "grpc":
            exporter_module = "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
        else:
            exporter_module = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
        exporter_class = importlib.import_module(exporter_module).OTLPSpanExporter
    except ImportError:
        logger.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed: no traces "
            "(pip install 'haystack-osa-memory[tracing]')"
        )
        return None
    return exporter_class()


def _opentelemetry_tracer() -> Any | None:
    """An OpenTelemetry tracer: of the provider already set on the process, else of one set up from the
    ``OTEL_EXPORTER_OTLP_*`` variables; None when neither (or ``OTEL_SDK_DISABLED``)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    try:
        from opentelemetry import trace as otel_trace
    except ImportError:
        return None
    provider = otel_trace.get_tracer_provider()
    if not isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider):
        return provider.get_tracer("haystack_osa_memory")
    if not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed: no traces "
            "(pip install 'haystack-osa-memory[tracing]')"
        )
        return None
    exporter = _otlp_exporter()
    if exporter is None:
        return None
    sdk_provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME})
    )
    sdk_provider.add_span_processor(BatchSpanProcessor(exporter))  # flushed at exit by the provider
    otel_trace.set_tracer_provider(sdk_provider)
    return otel_trace.get_tracer("haystack_osa_memory")


def configure_tracing() -> str:
    """Make Haystack's tracer trace this process's tool calls, content-free; idempotent.

    Returns what traces: ``haystack`` (a tracer enabled by someone else), ``opentelemetry`` (ours, over
    an OpenTelemetry provider) or ``off``.
    """
    if haystack_tracer.is_content_tracing_enabled:
        logger.warning("HAYSTACK_CONTENT_TRACING_ENABLED is ignored by the memory server: spans never carry content")
    haystack_tracer.is_content_tracing_enabled = False
    actual = haystack_tracer.actual_tracer
    inner = actual.inner if isinstance(actual, ContentFreeTracer) else actual
    if isinstance(inner, OtelTracer):
        mode = "opentelemetry"
    elif not isinstance(inner, NullTracer):  # Hayhooks' span buffer without a backend is a NullTracer
        mode = "haystack"
    elif (otel := _opentelemetry_tracer()) is not None:
        enable_tracing(OtelTracer(otel))
        mode = "opentelemetry"
    else:
        mode = "off"
    ensure_content_free()
    if mode != "off":
        logger.info("tracing MCP tool calls (%s tracer, no content in spans)", mode)
    return mode


ToolHandler = Callable[[str, dict[str, Any] | None], Awaitable[Any]]
H = TypeVar("H", bound=ToolHandler)


def _outcome(result: Any) -> dict[str, Any]:
    """Counts and flags of a tool's structured result (never its text)."""
    structured = getattr(result, "structuredContent", None)
    if not isinstance(structured, Mapping):
        return {}
    tags: dict[str, Any] = {}
    facts = structured.get("facts")
    if isinstance(facts, list):
        tags["osa_memory.tool.result_count"] = len(facts)
    if "degraded" in structured:
        tags["osa_memory.tool.degraded"] = bool(structured["degraded"])
    return tags


def instrument_tool_call(served: Collection[str]) -> Callable[[H], H]:
    """Decorate the MCP server's tool-call handler: one span and one latency observation per call.

    Turns this process's metrics on when `serve --metrics-port` asked for them, and configures tracing.
    ``served``: the tools this server serves (any other name is labelled ``unknown``).
    """
    metrics.start_worker(sorted(served))
    configure_tracing()

    def decorate(handler: H) -> H:
        @functools.wraps(handler)
        async def call_tool(name: str, arguments: dict[str, Any] | None) -> Any:
            tool = metrics.tool_label(name, served)
            ensure_content_free()
            started = time.perf_counter()
            error: BaseException | None = None
            try:
                with haystack_tracer.trace(SPAN_PREFIX + tool, tags={"osa_memory.tool.name": tool}) as span:
                    try:
                        result = await handler(name, arguments)
                    except BaseException as e:
                        error = e
                        kind = metrics.error_kind(e)
                        span.set_tags({"osa_memory.tool.status": "error", "osa_memory.tool.error_kind": kind})
                        raise
                    span.set_tags({"osa_memory.tool.status": "ok", **_outcome(result)})
                    return result
            finally:
                metrics.record_tool_call(tool, time.perf_counter() - started, error)

        return call_tool  # type: ignore[return-value]

    return decorate
