"""`copy_component_inputs` returns what Haystack's own input copy returns, and `use_lean_input_copies` puts it
where Haystack's pipelines call it."""

from __future__ import annotations

import logging
import threading
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
from haystack import Document, Pipeline
from haystack.core.pipeline import base as pipeline_base
from haystack.core.pipeline import pipeline as pipeline_module
from haystack.core.pipeline.utils import _deepcopy_with_exceptions as haystack_copy

from haystack_osa_memory import ScopeMarkerStripper, use_lean_input_copies
from haystack_osa_memory.components.fact_document import FactDocument
from haystack_osa_memory.markers import add_marker
from haystack_osa_memory.pipeline_inputs import copy_component_inputs

Point = namedtuple("Point", ["x", "y"])
LOCK = type(threading.Lock())


class Flagged(int):
    """An int subclass: not an exact atom, so Haystack's helper copies it."""


def zoo() -> dict[str, Any]:
    fact = FactDocument(id="d1", content="VPN first", meta={"topic": "ops", "tags": ["a"]}, score=0.5)
    return {
        "query": "which VPN?",
        "top_k": 5,
        "weight": 0.5,
        "flag": True,
        "none": None,
        "raw": b"bytes",
        "flagged": Flagged(3),
        "documents": [fact, Document(id="d2", content="plain", meta={"n": [1, 2]})],
        "embedding": np.arange(4, dtype=np.float32),
        "pair": (1, [2, 3]),
        "point": Point(1, [2]),
        "set": {1, 2},
        "nested": [{"a": [1, {"b": 2}]}],
        "component": ScopeMarkerStripper(),
        "lock": threading.Lock(),  # cannot be deep-copied: kept as it is
    }


def leaves(value: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [(path, value)] + [leaf for k, v in value.items() for leaf in leaves(v, f"{path}.{k}")]
    if isinstance(value, list | tuple):
        return [(path, value)] + [leaf for i, v in enumerate(value) for leaf in leaves(v, f"{path}[{i}]")]
    return [(path, value)]


def test_the_copy_equals_haystacks_and_keeps_what_haystack_keeps(caplog: pytest.LogCaptureFixture) -> None:
    given = zoo()
    with caplog.at_level(logging.INFO):
        ours, theirs = copy_component_inputs(given), haystack_copy(given)
    assert ours.keys() == theirs.keys() == given.keys()
    for (path, mine), (_, other), (_, original) in zip(leaves(ours), leaves(theirs), leaves(given), strict=True):
        assert type(mine) is type(other), path
        if isinstance(mine, np.ndarray):
            assert np.array_equal(mine, other), path
        elif not isinstance(mine, dict | list | tuple | LOCK):  # containers: by their leaves
            assert mine == other, path
        # The same object where Haystack keeps it (atoms, components, what cannot be copied), a copy where it copies.
        assert (mine is original) == (other is original), path
    assert ours["component"] is given["component"]
    assert ours["lock"] is given["lock"]


def test_the_copy_is_deep() -> None:
    given = zoo()
    copied = copy_component_inputs(given)
    copied["documents"][0].meta["tags"].append("b")
    copied["documents"][1].meta["n"].append(3)
    copied["nested"][0]["a"].append(4)
    copied["embedding"][0] = 9
    assert given["documents"][0].meta["tags"] == ["a"]
    assert given["documents"][1].meta["n"] == [1, 2]
    assert given["nested"] == [{"a": [1, {"b": 2}]}]
    assert given["embedding"][0] == 0


@pytest.fixture
def haystack_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Haystack's helper in its pipeline modules, put back after the test."""
    monkeypatch.setattr(pipeline_module, "_deepcopy_with_exceptions", haystack_copy)
    monkeypatch.setattr(pipeline_base, "_deepcopy_with_exceptions", haystack_copy)


@pytest.mark.usefixtures("haystack_helper")
def test_pipelines_use_it_once_put_in_place_with_the_same_answers() -> None:
    pipe = Pipeline()
    pipe.add_component("strip", ScopeMarkerStripper())
    docs = [FactDocument(id=f"d{i}", content=add_marker(f"fact {i}", "asg-1"), meta={"i": i}) for i in range(3)]
    before = pipe.run({"strip": {"documents": docs}})
    assert use_lean_input_copies() is True
    assert use_lean_input_copies() is True  # idempotent
    assert pipeline_module._deepcopy_with_exceptions is copy_component_inputs
    assert pipeline_base._deepcopy_with_exceptions is copy_component_inputs
    after = pipe.run({"strip": {"documents": docs}})
    assert after == before
    assert [d.content for d in after["strip"]["documents"]] == ["fact 0", "fact 1", "fact 2"]
    assert [d.content for d in docs] == [add_marker(f"fact {i}", "asg-1") for i in range(3)]  # inputs untouched


@pytest.mark.usefixtures("haystack_helper")
def test_another_replacement_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def theirs(obj: Any) -> Any:
        return obj

    monkeypatch.setattr(pipeline_module, "_deepcopy_with_exceptions", theirs)
    assert use_lean_input_copies() is False
    assert pipeline_module._deepcopy_with_exceptions is theirs
    assert pipeline_base._deepcopy_with_exceptions is haystack_copy


def documents() -> list[Document]:
    from datetime import UTC, datetime

    from haystack.dataclasses import ByteStream, SparseEmbedding

    when = datetime(2026, 12, 5, tzinfo=UTC)
    return [
        Document(content="plain"),
        Document(content="fact", meta={"at": when, "tags": ["a", {"b": [1.5]}]}, score=0.25, embedding=[0.5, -1.0]),
        Document(content="vector of numpy floats", embedding=list(np.arange(3, dtype=np.float32))),  # not floats
        Document(
            blob=ByteStream(data=b"\x00\x01", meta={"k": ["v"]}, mime_type="application/octet-stream"),
            sparse_embedding=SparseEmbedding(indices=[1, 4], values=[0.5, 0.25]),
            meta={"n": 1},
        ),
    ]


@pytest.mark.parametrize("index", range(4))
def test_a_document_is_copied_as_deepcopy_copies_it(index: int) -> None:
    import copy

    original = documents()[index]
    ours, theirs = copy_component_inputs(original), copy.deepcopy(original)
    assert type(ours) is Document
    assert ours == theirs == original
    assert ours.__dict__.keys() == theirs.__dict__.keys()
    for name, value in ours.__dict__.items():
        assert type(value) is type(theirs.__dict__[name]), name
        if isinstance(value, dict | list) or hasattr(value, "__dataclass_fields__"):
            assert value is not original.__dict__[name], name  # a copy, as deepcopy makes one
    if original.embedding is not None:
        assert [type(v) for v in ours.embedding or []] == [type(v) for v in original.embedding]


def test_a_copied_document_is_deep() -> None:
    original = documents()[1]
    copied = copy_component_inputs(original)
    copied.meta["tags"][1]["b"].append(2.5)
    assert copied.embedding is not None
    copied.embedding[0] = 9.0
    assert original.meta["tags"] == ["a", {"b": [1.5]}]
    assert original.embedding == [0.5, -1.0]


def test_a_document_holding_what_cannot_be_copied_is_kept_as_haystack_keeps_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    original = Document(content="odd", meta={"lock": threading.Lock()})
    with caplog.at_level(logging.INFO):
        assert copy_component_inputs(original) is haystack_copy(original) is original
