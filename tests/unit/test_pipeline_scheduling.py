"""`lean_priority` gives every component state the priority Haystack's `_calculate_priority` gives it,
`lean_receivers` lists what Haystack's `_find_receivers_from` lists, and with `use_lean_scheduling` pipelines
with branches, variadic joins, defaults and loops run the same components in the same order to the same result."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.joiners import BranchJoiner
from haystack.core.component.types import GreedyVariadic, InputSocket, Variadic
from haystack.core.pipeline.base import PipelineBase
from haystack.core.pipeline.component_checks import _NoOutputProduced
from haystack.testing.sample_components import (
    AddFixedValue,
    Double,
    Parity,
    Remainder,
    Repeat,
    Subtract,
    Sum,
    Threshold,
)

from haystack_osa_memory import ScopeMarkerStripper, use_lean_scheduling
from haystack_osa_memory.components.fact_document import FactDocument
from haystack_osa_memory.markers import add_marker
from haystack_osa_memory.pipeline_scheduling import (
    _HAYSTACK_PRIORITY,
    _HAYSTACK_RECEIVERS,
    HAYSTACK_SOURCES,
    haystack_sources,
    lean_priority,
    lean_receivers,
)

SENDERS = ("a", "b", "c")


@pytest.fixture
def haystack_scheduling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Haystack's own priority and receivers for the test (whatever the process had is put back after it)."""
    monkeypatch.setattr(PipelineBase, "_calculate_priority", staticmethod(_HAYSTACK_PRIORITY))
    monkeypatch.setattr(PipelineBase, "_find_receivers_from", _HAYSTACK_RECEIVERS)


def _socket(rnd: random.Random, name: str) -> InputSocket:
    kind = rnd.choice([int, int, Variadic[int], GreedyVariadic[int]])
    socket = InputSocket(name, kind) if rnd.random() < 0.6 else InputSocket(name, kind, default_value=0)
    socket.senders = rnd.sample(SENDERS, rnd.choice([0, 0, 1, 1, 2, 3]))
    return socket


def _inputs(rnd: random.Random) -> list[dict[str, Any]]:
    return [
        {
            "sender": rnd.choice([None, *SENDERS, "z"]),
            "value": _NoOutputProduced() if rnd.random() < 0.3 else rnd.randrange(5),
        }
        for _ in range(rnd.choice([0, 1, 1, 2, 3]))
    ]


def _state(rnd: random.Random) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    sockets = {f"s{i}": _socket(rnd, f"s{i}") for i in range(rnd.choice([0, 1, 1, 2, 3, 4]))}
    names = [*sockets, "other"]  # a key no socket has: Haystack's user-input check reads it too
    inputs = {name: _inputs(rnd) for name in names if rnd.random() < 0.7}
    return {"input_sockets": sockets, "visits": rnd.choice([0, 0, 1, 2])}, inputs


def test_every_component_state_gets_haystacks_priority() -> None:
    rnd = random.Random(29)
    seen = set()
    for _ in range(30_000):
        comp, inputs = _state(rnd)
        expected = _HAYSTACK_PRIORITY(comp, inputs)
        assert lean_priority(comp, inputs) == expected, (comp, inputs)
        seen.add(expected)
    assert len(seen) == 4  # BLOCKED, HIGHEST, READY and DEFER all came up


def _looping_pipeline() -> tuple[Pipeline, dict[str, Any]]:
    """Haystack's own looping sample: a value goes round until it passes a threshold."""
    pipe = Pipeline(max_runs_per_component=10)
    pipe.add_component("add_one", AddFixedValue(add=1))
    pipe.add_component("merge", Sum())
    pipe.add_component("below_10", Threshold(threshold=10))
    pipe.add_component("double", Double())
    pipe.connect("add_one.result", "merge.values")
    pipe.connect("merge.total", "below_10.value")
    pipe.connect("below_10.below", "double.value")
    pipe.connect("double.value", "merge.values")
    return pipe, {"add_one": {"value": 3}}


def _branching_pipeline() -> tuple[Pipeline, dict[str, Any]]:
    """Parity routes to one of two branches; a greedy join (`BranchJoiner`) and a lazy sum join them; defaults
    fill the rest."""
    pipe = Pipeline()
    pipe.add_component("parity", Parity())
    pipe.add_component("add_ten", AddFixedValue(add=10))
    pipe.add_component("double", Double())
    pipe.add_component("repeat", Repeat(outputs=["first", "second"]))
    pipe.add_component("greedy", BranchJoiner(int))
    pipe.add_component("lazy", Sum())
    pipe.add_component("remainder", Remainder(divisor=3))
    pipe.add_component("subtract", Subtract())
    pipe.connect("parity.even", "add_ten.value")
    pipe.connect("parity.odd", "double.value")
    pipe.connect("add_ten.result", "greedy.value")
    pipe.connect("double.value", "greedy.value")
    pipe.connect("greedy.value", "repeat.value")
    pipe.connect("repeat.first", "lazy.values")
    pipe.connect("repeat.second", "lazy.values")
    pipe.connect("repeat.second", "remainder.value")
    pipe.connect("lazy.total", "subtract.first_value")
    pipe.connect("remainder.remainder_is_0", "subtract.second_value")
    return pipe, {"parity": {"value": 7}}


def _stripping_pipeline() -> tuple[Pipeline, dict[str, Any]]:
    pipe = Pipeline()
    pipe.add_component("strip", ScopeMarkerStripper())
    docs = [FactDocument(id=f"d{i}", content=add_marker(f"fact {i}", "asg-1"), meta={"i": i}) for i in range(3)]
    return pipe, {"strip": {"documents": docs}}


def _runs(build: Callable[[], tuple[Pipeline, dict[str, Any]]], data_change: dict[str, Any] | None = None) -> Any:
    """The pipeline's outputs (every component's) and the order its components ran in."""
    pipe, data = build()
    if data_change:
        data = data_change
    order: list[str] = []
    for name, instance in pipe.walk():
        run = instance.run

        def recorded(*args: Any, _run: Any = run, _name: str = name, **kwargs: Any) -> Any:
            order.append(_name)
            return _run(*args, **kwargs)

        instance.run = recorded
    outputs = pipe.run(data, include_outputs_from=set(pipe.graph.nodes))
    return outputs, order


CASES = [
    (_looping_pipeline, None),
    (_branching_pipeline, None),
    (_branching_pipeline, {"parity": {"value": 8}}),
    (_stripping_pipeline, None),
]


@pytest.mark.usefixtures("haystack_scheduling")
@pytest.mark.parametrize(("build", "data"), CASES)
def test_pipelines_run_the_same_components_in_the_same_order(
    build: Callable[[], tuple[Pipeline, dict[str, Any]]], data: dict[str, Any] | None
) -> None:
    before = _runs(build, data)
    assert len(before[1]) >= 1
    assert use_lean_scheduling() is True
    assert PipelineBase.__dict__["_calculate_priority"].__func__ is lean_priority
    assert _runs(build, data) == before


def test_the_looping_pipeline_loops() -> None:
    """The loop case really goes round (so the comparison above covers a component run more than once)."""
    outputs, order = _runs(_looping_pipeline)
    assert order.count("merge") > 1
    assert outputs["below_10"]  # it ended


@pytest.mark.parametrize("build", [_looping_pipeline, _branching_pipeline, _stripping_pipeline])
def test_receivers_are_haystacks(build: Callable[[], tuple[Pipeline, dict[str, Any]]]) -> None:
    pipe, _ = build()
    for name in [*pipe.graph.nodes, "not a component"]:
        assert lean_receivers(pipe, name) == _HAYSTACK_RECEIVERS(pipe, name)
    assert sum(len(lean_receivers(pipe, name)) for name in pipe.graph.nodes) == len(pipe.graph.edges)


def test_the_installed_haystack_is_the_one_checked() -> None:
    """A Haystack upgrade that changes these methods fails here: compare again, then update the digests."""
    assert haystack_sources() == HAYSTACK_SOURCES


@pytest.mark.usefixtures("haystack_scheduling")
def test_idempotent_and_left_alone_when_replaced_or_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert use_lean_scheduling() is True
    assert use_lean_scheduling() is True  # idempotent
    assert PipelineBase.__dict__["_find_receivers_from"] is lean_receivers

    def other(comp: dict[str, Any], inputs: dict[str, Any]) -> Any:
        return _HAYSTACK_PRIORITY(comp, inputs)

    monkeypatch.setattr(PipelineBase, "_calculate_priority", staticmethod(other))
    monkeypatch.setattr(PipelineBase, "_find_receivers_from", _HAYSTACK_RECEIVERS)
    assert use_lean_scheduling() is False  # another library's replacement stays
    assert PipelineBase.__dict__["_calculate_priority"].__func__ is other

    monkeypatch.setattr(PipelineBase, "_calculate_priority", staticmethod(_HAYSTACK_PRIORITY))
    monkeypatch.setattr("haystack_osa_memory.pipeline_scheduling.HAYSTACK_SOURCES", ("x", "y", "z"))
    assert use_lean_scheduling() is False  # a Haystack whose scheduling changed keeps its own
    assert PipelineBase.__dict__["_calculate_priority"].__func__ is _HAYSTACK_PRIORITY
