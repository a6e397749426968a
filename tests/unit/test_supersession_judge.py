"""`SupersessionJudge`: its budget, its fallback and its serialisation (a YAML names it)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from haystack import component
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.components.generators.chat.mock import MockChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.utils import Secret

from haystack_osa_memory import SupersessionJudge

CANDIDATES = [
    {"document_id": "d1", "content": "The API listens on 8080"},
    {"document_id": "d2", "content": "The API listens on 8081"},
]


@component
class Stuck:
    """A chat generator that never answers until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
        self.release.wait(10)
        return {"replies": [ChatMessage.from_assistant("yes")]}


def test_yes_supersedes_anything_else_does_not() -> None:
    judge = SupersessionJudge(chat_generator=MockChatGenerator(["Yes, it does.", "No"]))
    assert judge.run(fact="The API listens on 9090", candidates=CANDIDATES) == {
        "superseded": ["d1"],
        "undecided": [],
        "degraded": None,
    }


def test_past_max_calls_the_rest_stays_undecided() -> None:
    judge = SupersessionJudge(chat_generator=MockChatGenerator("yes"), max_calls=1)
    out = judge.run(fact="The API listens on 9090", candidates=CANDIDATES)
    assert (out["superseded"], out["undecided"], out["degraded"]) == (["d1"], ["d2"], None)


def test_past_its_budget_nothing_is_decided() -> None:
    stuck = Stuck()
    judge = SupersessionJudge(chat_generator=stuck, timeout=0.3)
    out = judge.run(fact="The API listens on 9090", candidates=CANDIDATES)
    stuck.release.set()
    assert out["superseded"] == []
    assert out["undecided"] == ["d1", "d2"]
    assert "0.30 s budget" in out["degraded"]


def test_a_failure_decides_nothing_and_names_only_its_type() -> None:
    @component
    class Broken:
        @component.output_types(replies=list[ChatMessage])
        def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
            raise RuntimeError("provider said: " + messages[-1].text)  # type: ignore[operator]

    out = SupersessionJudge(chat_generator=Broken()).run(fact="password hunter2", candidates=CANDIDATES)
    assert out == {"superseded": [], "undecided": ["d1", "d2"], "degraded": "judge failed: RuntimeError"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chat_generator": object()}, "chat generator component"),
        ({"chat_generator": MockChatGenerator("yes"), "timeout": 0}, "timeout must be positive"),
        ({"chat_generator": MockChatGenerator("yes"), "max_calls": 0}, "max_calls must be at least 1"),
    ],
)
def test_invalid_settings_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SupersessionJudge(**kwargs)


def test_to_dict_from_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "k")
    generator = OpenAIChatGenerator(
        model="llama3.2", api_base_url="http://127.0.0.1:9/v1", api_key=Secret.from_env_var("JUDGE_KEY"), timeout=3.0
    )
    data = SupersessionJudge(chat_generator=generator, timeout=4.0, max_calls=2).to_dict()
    assert data["init_parameters"]["chat_generator"]["init_parameters"]["api_key"]["env_vars"] == ["JUDGE_KEY"]
    restored = SupersessionJudge.from_dict(data)
    assert (restored.timeout, restored.max_calls) == (4.0, 2)
    assert isinstance(restored.chat_generator, OpenAIChatGenerator)
    assert restored.chat_generator.api_base_url == "http://127.0.0.1:9/v1"
    assert restored.to_dict() == data
