"""`supersession_suggestions`: the judge's verdict applied to the suggestions, and its fallbacks."""

from __future__ import annotations

from typing import Any

import pytest
from haystack import component
from haystack.components.generators.chat.mock import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_osa_memory import SupersessionJudge
from haystack_osa_memory.supersession_suggestions import as_judge, judge_predecessors

POSSIBLE = [
    {"document_id": "d1", "content": "The API listens on 8080"},
    {"document_id": "d2", "content": "The API listens on 8081"},
    {"document_id": "d3", "content": "The API listens on 8082"},
]
FACT = "The API listens on 9090"


@component
class Failing:
    """A chat generator whose provider is down."""

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
        raise ConnectionError("provider down")


def test_a_chat_generator_is_wrapped_and_a_judge_kept() -> None:
    generator = MockChatGenerator("no")
    wrapped = as_judge(generator)
    assert isinstance(wrapped, SupersessionJudge)
    assert wrapped.chat_generator is generator
    assert as_judge(wrapped) is wrapped
    assert as_judge(None) is None


def test_confirmed_ids_are_superseded_and_the_undecided_stay_suggested() -> None:
    judge = SupersessionJudge(chat_generator=MockChatGenerator(["yes", "no", "yes"]), max_calls=2)
    written: list[list[str]] = []
    superseded, still = judge_predecessors(judge, FACT, POSSIBLE, written.append, document_id="new")
    assert written == [["d1"]]
    assert superseded == ["d1"]
    # d2 was judged (no), d3 was past max_calls: only d3 is still offered.
    assert still == [POSSIBLE[2]]


def test_nothing_confirmed_writes_nothing() -> None:
    judge = SupersessionJudge(chat_generator=MockChatGenerator("no"))
    written: list[list[str]] = []
    assert judge_predecessors(judge, FACT, POSSIBLE, written.append, document_id="new") == ([], [])
    assert written == []


def test_a_failing_judge_leaves_every_suggestion(caplog: pytest.LogCaptureFixture) -> None:
    judge = SupersessionJudge(chat_generator=Failing())
    written: list[list[str]] = []
    assert judge_predecessors(judge, FACT, POSSIBLE, written.append, document_id="new") == ([], POSSIBLE)
    assert written == []
    assert "judge failed: ConnectionError" in caplog.text


def test_a_failed_supersession_leaves_every_suggestion(caplog: pytest.LogCaptureFixture) -> None:
    judge = SupersessionJudge(chat_generator=MockChatGenerator("yes"))

    def refuse(ids: list[str]) -> None:
        raise RuntimeError("the write failed")

    assert judge_predecessors(judge, FACT, POSSIBLE, refuse, document_id="new") == ([], POSSIBLE)
    assert "store new: the judge's supersession failed (RuntimeError)" in caplog.text
