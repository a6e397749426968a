"""Haystack's choice of the next component to run, with the same result in one pass over a component's sockets.

`Pipeline.run` works out every component's priority (`PipelineBase._calculate_priority`) when it starts and
again after each component that leaves its queue stale: twelve times in a run of a three-component chain such
as recall's. Each time, Haystack's checks (``haystack.core.pipeline.component_checks``) walk the component's
sockets and their inputs six times over, through nested generators, and ``_find_receivers_from`` builds a
networkx edge view per component per run: together about a fifth of what `Pipeline.run` itself costs per run
of the recall and store pipelines (`benchmarks/scheduling.py`). `lean_priority` decides the same priority in one
pass, and `lean_receivers` lists the same receivers, in the same order, from the graph's successors.

`use_lean_scheduling` puts both in Haystack's pipeline class, only while Haystack's own versions are the
ones these were checked against (`HAYSTACK_SOURCES`: a digest of their source); after an upgrade that
changes them, Haystack's stay in place until these are checked again. ``osa-memory serve`` calls it in every
process that serves tools; a notebook may call it too. The pipelines, their components and the order they
run in stay Haystack's.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from typing import Any

from haystack.core.pipeline import component_checks
from haystack.core.pipeline.base import ComponentPriority, PipelineBase
from haystack.core.pipeline.component_checks import _NoOutputProduced

logger = logging.getLogger(__name__)

#: Haystack's own priority and receivers, as the pipeline class had them when this module was imported.
_HAYSTACK_PRIORITY = PipelineBase.__dict__["_calculate_priority"].__func__
_HAYSTACK_RECEIVERS = PipelineBase.__dict__["_find_receivers_from"]
#: sha256 of the source of Haystack's `_calculate_priority`, of the module of checks it calls, and of
#: `_find_receivers_from`, as `lean_priority` and `lean_receivers` were checked against them (haystack-ai 3.4.1;
#: `tests/unit/test_pipeline_scheduling.py` compares them on every kind of socket).
HAYSTACK_SOURCES = (
    "25502ee5ab8f1372af9b213048c15c238bc50c1dcb1eaf081261e5ce57ec0301",
    "e3c1081c60b21924f4d2611fe50f05bab34d2fb96e9e25a8895b1cefc1686150",
    "9d4b2c0c37430adf2cf7f213a37da7a62d6957011818d73cbee6b7588a97b938",
)

_NO_OUTPUT = _NoOutputProduced
_NONE: list[dict[str, Any]] = []  # a socket without inputs (never written to)
_BLOCKED, _HIGHEST = ComponentPriority.BLOCKED, ComponentPriority.HIGHEST
_READY, _DEFER = ComponentPriority.READY, ComponentPriority.DEFER


def haystack_sources() -> tuple[str, str, str]:
    """The digests `HAYSTACK_SOURCES` holds, of the Haystack installed here."""
    parts = (_HAYSTACK_PRIORITY, component_checks, _HAYSTACK_RECEIVERS)
    return tuple(hashlib.sha256(inspect.getsource(p).encode()).hexdigest() for p in parts)  # type: ignore[return-value]


def lean_priority(comp: dict[str, Any], comp_inputs: dict[str, list[dict[str, Any]]]) -> ComponentPriority:
    """The priority `PipelineBase._calculate_priority` gives a component (``comp``: its graph metadata and
    ``visits``; ``comp_inputs``: its inputs in the pipeline's internal form, ``{socket: [{"sender", "value"}]}``).

    Haystack's rules, each socket looked at once: BLOCKED unless every mandatory socket is filled and the
    component has a trigger (a value from a predecessor; on its first visit, a value from outside the
    pipeline or no socket any component sends to); HIGHEST when a greedy variadic socket has its input and
    every socket that is mandatory or has senders is filled; READY when every sender of every socket has
    sent; DEFER otherwise.

    Usage example:
    ```python
    from haystack_osa_memory.pipeline_scheduling import lean_priority

    comp = pipe._get_component_with_graph_metadata_and_visits("strip", 0)
    lean_priority(comp, {"documents": [{"sender": None, "value": []}]})   # ComponentPriority.READY
    ```
    """
    mandatory_filled = all_filled = executed = no_senders = True
    from_predecessor = greedy_ready = False
    get = comp_inputs.get
    for name, socket in comp["input_sockets"].items():
        inputs = get(name) or _NONE
        senders = socket.senders
        if socket.is_greedy or socket.is_lazy_variadic:
            produced = [i for i in inputs if not isinstance(i["value"], _NO_OUTPUT)]
            sent = {i["sender"] for i in produced if i["sender"] is not None}
            # `has_socket_received_all_inputs` for a variadic socket
            received = bool(inputs) and (
                (socket.is_greedy and bool(produced)) or (socket.is_lazy_variadic and set(senders) == sent)
            )
            filled = received or (socket.is_lazy_variadic and bool(produced))
            from_predecessor = from_predecessor or bool(sent)
            greedy_ready = greedy_ready or (socket.is_greedy and received)
        elif inputs:
            filled = not isinstance(inputs[0]["value"], _NO_OUTPUT)
            if not from_predecessor:
                for i in inputs:
                    if i["sender"] is not None and not isinstance(i["value"], _NO_OUTPUT):
                        from_predecessor = True
                        break
        else:
            filled = False
        if not filled:
            if socket.is_mandatory:
                mandatory_filled = all_filled = False
            elif senders:
                all_filled = False
        if senders:
            no_senders = False
            if executed:
                if len(senders) == 1 and len(inputs) <= 1:  # the usual socket: one sender, one value or none
                    executed = bool(inputs) and inputs[0]["sender"] == senders[0]
                else:
                    executed = set(senders) == {i["sender"] for i in inputs if i["sender"] is not None}
        elif executed:
            for i in inputs:
                if i["sender"] is not None:
                    executed = False
                    break
    first_visit = comp["visits"] == 0
    triggered = from_predecessor or (
        first_visit and (no_senders or any(i for values in comp_inputs.values() for i in values if i["sender"] is None))
    )
    if not (mandatory_filled and triggered):
        return _BLOCKED
    if greedy_ready and all_filled:
        return _HIGHEST
    return _READY if executed else _DEFER


def lean_receivers(self: PipelineBase, component_name: str) -> list[tuple[str, Any, Any, Any]]:
    """What `PipelineBase._find_receivers_from` returns: for each connection from ``component_name``, in the
    graph's order, the receiver's name, the sender's output socket, the receiver's input socket and the
    conversion strategy (``None`` when none)."""
    if component_name not in self.graph:  # Haystack's reads a name that is no node as a bunch of nodes
        return list(_HAYSTACK_RECEIVERS(self, component_name))
    return [
        (receiver, data["from_socket"], data["to_socket"], data.get("conversion_strategy"))
        for receiver, connections in self.graph.succ[component_name].items()
        for data in connections.values()
    ]


def use_lean_scheduling() -> bool:
    """Let Haystack's pipelines work out priorities with `lean_priority` and receivers with `lean_receivers`
    (idempotent).

    Returns whether they are in use. Where another library already replaced Haystack's methods, or the
    installed Haystack's differ from those these were checked against (`HAYSTACK_SOURCES`), Haystack's stay
    (and this returns ``False``).

    Usage example:
    ```python
    from haystack_osa_memory import use_lean_scheduling

    use_lean_scheduling()  # then run pipelines as usual
    ```
    """
    priority = PipelineBase.__dict__["_calculate_priority"].__func__
    receivers = PipelineBase.__dict__["_find_receivers_from"]
    if priority is lean_priority and receivers is lean_receivers:
        return True
    if priority is not _HAYSTACK_PRIORITY or receivers is not _HAYSTACK_RECEIVERS:
        logger.info("Haystack's pipeline scheduling was already replaced elsewhere; left as it is")
        return False
    try:
        sources = haystack_sources()
    except (OSError, TypeError):  # no source installed: nothing to check against
        sources = ("", "", "")
    if sources != HAYSTACK_SOURCES:
        logger.info("Haystack's pipeline scheduling differs from the one lean_priority was checked against; kept")
        return False
    PipelineBase._calculate_priority = staticmethod(lean_priority)  # type: ignore[method-assign]
    PipelineBase._find_receivers_from = lean_receivers  # type: ignore[method-assign]
    return True
