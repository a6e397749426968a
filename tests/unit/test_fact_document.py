"""`FactDocument`: what recall returns is a Document in every way a pipeline sees, and cheap to deep-copy."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest
from haystack import Document
from haystack.core.pipeline.utils import _deepcopy_with_exceptions

from haystack_osa_memory.components.fact_document import FactDocument


def fact() -> FactDocument:
    meta = {
        "document_id": "d1",
        "topic": "deploy",
        "conflicts_with": ["d2"],
        "scores": {"lexical": 1.5, "vector": None},
        "at": datetime(2026, 1, 1, tzinfo=UTC),
        "nested": [{"a": [1, 2]}],
    }
    return FactDocument(id="d1", content="Staging deploys need the VPN", meta=meta, score=0.5, embedding=[0.1, 0.2])


def test_equal_to_a_document_with_the_same_fields_either_way_round() -> None:
    f = fact()
    plain = Document(id=f.id, content=f.content, meta=copy.deepcopy(f.meta), score=f.score, embedding=f.embedding)
    assert f == plain
    assert plain == f
    assert f != Document(id=f.id, content="other", meta=f.meta)
    assert isinstance(f, Document)
    assert Document.from_dict(f.to_dict()) == f


def test_the_pipeline_copy_is_deep_and_equal() -> None:
    f = fact()
    (c,) = _deepcopy_with_exceptions({"documents": [f]})["documents"]
    assert type(c) is FactDocument
    assert c == f
    assert c is not f
    c.meta["conflicts_with"].append("d3")
    c.meta["scores"]["lexical"] = 0.0
    c.meta["nested"][0]["a"].append(3)
    c.embedding.append(0.3)  # type: ignore[union-attr]
    assert f.meta["conflicts_with"] == ["d2"]
    assert f.meta["scores"]["lexical"] == 1.5
    assert f.meta["nested"] == [{"a": [1, 2]}]
    assert f.embedding == [0.1, 0.2]


def test_built_directly_it_is_the_document_the_constructor_makes() -> None:
    meta = {"document_id": "d1", "topic": "deploy"}
    direct = FactDocument.of(id="d1", content="Staging deploys need the VPN", meta=meta, score=0.25)
    built = FactDocument(id="d1", content="Staging deploys need the VPN", meta=meta, score=0.25)
    assert type(direct) is FactDocument
    assert direct.__dict__ == built.__dict__
    assert direct == built
    assert direct.meta is meta  # as the constructor keeps it
    # An empty id is made from the fields, and content that is not text is refused, as by the constructor.
    assert FactDocument.of(id="", content="x", meta={}).id == FactDocument(content="x").id
    with pytest.raises(ValueError, match="must be a string"):
        FactDocument.of(id="d2", content=3, meta={})  # type: ignore[arg-type]


def test_with_content_is_dataclasses_replace() -> None:
    import dataclasses

    f = fact()
    direct, replaced = f.with_content("new text"), dataclasses.replace(f, content="new text")
    assert type(direct) is FactDocument
    assert direct.__dict__ == replaced.__dict__
    assert direct.meta is f.meta  # shared, as `replace` shares it
    assert f.content == "Staging deploys need the VPN"  # the original is untouched
