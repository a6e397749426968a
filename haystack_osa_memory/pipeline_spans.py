"""Haystack's span for each component run, with its tags worked out only when a tracer will record them.

`Pipeline.run` opens a span around every component it runs (``PipelineBase._create_component_span``) and
builds the span's tags first: the component's qualified class name, its inputs' types and its input and output
sockets, every run, even when no tracer is enabled and the span goes to Haystack's `NullTracer`, which drops
them. That was ~0.05 ms of a ~1.6 ms lexical recall in process (benchmarks/README.md, "Lean serving").
`lean_component_span` hands out the null tracer's span directly while Haystack's tracer is exactly its
`NullTracer`, and Haystack's own span, with every tag, whenever another tracer is enabled (`osa-memory serve`
with OpenTelemetry, `mcp/telemetry.py`; Hayhooks' trace buffer; one of your own, before or after this).

`use_lean_component_spans` puts it in Haystack's pipeline class. ``osa-memory serve`` does so in every
process that serves tools; a notebook may call it too. The pipelines, their components and what they receive
stay Haystack's.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from typing import Any

from haystack.core.pipeline.base import PipelineBase
from haystack.tracing.tracer import NullSpan, NullTracer, Span
from haystack.tracing.tracer import tracer as haystack_tracer

logger = logging.getLogger(__name__)

#: Haystack's own span builder, as the pipeline class had it when this module was imported.
_HAYSTACK_SPAN = PipelineBase.__dict__["_create_component_span"].__func__
#: What `NullTracer.trace` yields, handed out as it is (a span that records nothing holds no state).
_NULL_SPAN = contextlib.nullcontext(NullSpan())


def lean_component_span(
    component_name: str, instance: Any, inputs: dict[str, Any], parent_span: Span | None = None
) -> AbstractContextManager[Span]:
    """The span `PipelineBase._create_component_span` opens around a component run: Haystack's own while a
    tracer is enabled, else the null span without building its tags.

    Usage example:
    ```python
    from haystack_osa_memory.pipeline_spans import lean_component_span

    with lean_component_span("strip", component, {"documents": []}) as span:
        span.set_tag("ignored", True)  # no tracer enabled: a span that records nothing
    ```
    """
    # Exactly Haystack's null tracer: a subclass of it may record (Hayhooks' live trace buffer does).
    if type(haystack_tracer.actual_tracer) is NullTracer:
        return _NULL_SPAN
    span: AbstractContextManager[Span] = _HAYSTACK_SPAN(component_name, instance, inputs, parent_span)
    return span


def use_lean_component_spans() -> bool:
    """Let Haystack's pipelines open component spans with `lean_component_span` (idempotent).

    Returns whether it is in use. Where another library already replaced Haystack's span builder, that
    replacement is left alone (and this returns ``False``).

    Usage example:
    ```python
    from haystack_osa_memory import use_lean_component_spans

    use_lean_component_spans()  # then run pipelines as usual
    ```
    """
    current = PipelineBase.__dict__["_create_component_span"].__func__
    if current is lean_component_span:
        return True
    if current is not _HAYSTACK_SPAN:
        logger.info("Haystack's component span was already replaced elsewhere; left as it is")
        return False
    PipelineBase._create_component_span = staticmethod(lean_component_span)  # type: ignore[method-assign]
    return True
