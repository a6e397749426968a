"""A supersession judge named in the store YAML, as a team running `serve` names it: Haystack's own
`OpenAIChatGenerator` pointed (`api_base_url`) at a small OpenAI-compatible HTTP server on 127.0.0.1.
Real HTTP, the real generator class; a server that answers, one that is too slow for the budget, and one
that fails. Whatever the judge does, the fact is stored; without an answer its suggestions are returned."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from haystack_osa_memory import Caller, ConfigurationError, Memory, MemoryConfig
from haystack_osa_memory.components.supersession_judge import SupersessionJudge
from haystack_osa_memory.yaml_pipelines import PipelineDefinitions
from tests.conftest import REPO

pytestmark = pytest.mark.integration

ME = Caller(org_id="acme", assignment_id="asg-judge")
OLD = "Staging uses the VPN profile stg-eu"
NEW = "Staging now uses the VPN profile stg-eu2"
KEY = "judge-key-for-tests"


class ChatServer:
    """An OpenAI-compatible `/v1/chat/completions` on 127.0.0.1: answers *yes* when the NEW fact names
    ``stg-eu2``, after ``delay`` seconds, or fails with ``status``."""

    def __init__(self, delay: float = 0.0, status: int = 200) -> None:
        self.delay, self.status = delay, status
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, **body})
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                time.sleep(server.delay)
                if server.status != 200:
                    self._send(server.status, {"error": {"message": "the model is overloaded", "type": "server"}})
                    return
                prompt = body["messages"][-1]["content"]
                answer = "Yes." if "NEW: " in prompt and "stg-eu2" in prompt.split("NEW: ")[1] else "no"
                self._send(200, completion(body["model"], answer))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the slow server's case)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21},
    }


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ChatServer]:
    chat = ChatServer(**getattr(request, "param", {}))
    yield chat
    chat.close()


def judge_block(url: str, *, timeout: float = 5.0, max_calls: int = 8) -> dict[str, Any]:
    """What a team writes in store.yml: the judge and the chat generator it asks."""
    return {
        "type": "haystack_osa_memory.components.supersession_judge.SupersessionJudge",
        "init_parameters": {
            "timeout": timeout,
            "max_calls": max_calls,
            "chat_generator": {
                "type": "haystack.components.generators.chat.openai.OpenAIChatGenerator",
                "init_parameters": {
                    "model": "local-judge",
                    "api_base_url": url,
                    "api_key": {"type": "env_var", "env_vars": ["OSA_MEMORY_JUDGE_API_KEY"], "strict": True},
                    "timeout": 30.0,
                    "max_retries": 0,
                },
            },
        },
    }


def folder_with_judge(tmp_path: Path, judge: dict[str, Any]) -> Path:
    """A pipelines folder as `serve --pipelines-dir` reads it, its store.yml naming ``judge``."""
    shipped = PipelineDefinitions.find(REPO / "pipelines")
    assert shipped is not None
    store = yaml.safe_load(shipped.store)
    store["components"]["judge"] = judge
    for name, text in (
        ("kb_memory_store/store.yml", yaml.safe_dump(store)),
        ("kb_memory_recall/recall.yml", shipped.recall),
    ):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def served_memory(config: MemoryConfig, folder: Path) -> Memory:
    """The `Memory` `serve` builds for a pipelines folder (`shared_memory`)."""
    return Memory(config, definitions=PipelineDefinitions.find(folder))


@pytest.fixture(autouse=True)
def judge_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSA_MEMORY_JUDGE_API_KEY", KEY)


def test_the_yaml_judge_supersedes_over_http(config: MemoryConfig, server: ChatServer, tmp_path: Path) -> None:
    memory = served_memory(config, folder_with_judge(tmp_path, judge_block(server.url)))
    old = memory.store(OLD, caller=ME)["document_id"]
    result = memory.store(NEW, caller=ME)
    assert result["superseded"] == [old]
    assert result["possibly_supersedes"] == []
    assert memory.read(old, caller=ME)["status"] == "superseded"
    assert isinstance(memory.judge, SupersessionJudge)
    assert "judge" not in {name for name, _ in memory.store_pipeline.walk()}  # type: ignore[union-attr]
    asked = server.requests[-1]
    assert asked["path"] == "/v1/chat/completions"
    assert asked["model"] == "local-judge"
    assert f"OLD: {OLD}" in asked["messages"][-1]["content"]
    assert server.headers[-1]["authorization"] == f"Bearer {KEY}"


def test_the_judge_sees_only_redacted_text(config: MemoryConfig, server: ChatServer, tmp_path: Path) -> None:
    memory = served_memory(config, folder_with_judge(tmp_path, judge_block(server.url)))
    memory.store(OLD, caller=ME)
    memory.store("Staging now uses the VPN profile stg-eu2 on 10.20.30.40", caller=ME)
    prompts = [r["messages"][-1]["content"] for r in server.requests]
    assert prompts
    assert any("stg-eu2" in p for p in prompts)
    assert not any("10.20.30.40" in p for p in prompts)


def test_a_judge_saying_no_supersedes_nothing(config: MemoryConfig, server: ChatServer, tmp_path: Path) -> None:
    memory = served_memory(config, folder_with_judge(tmp_path, judge_block(server.url)))
    old = memory.store("Staging uses the VPN profile stg-eu7", caller=ME)["document_id"]
    result = memory.store("Staging now uses the VPN profile stg-eu8", caller=ME)
    assert server.requests  # asked, answered no
    assert "superseded" not in result
    assert result["possibly_supersedes"] == []
    assert memory.read(old, caller=ME)["status"] == "approved"


@pytest.mark.slow
@pytest.mark.parametrize("server", [{"delay": 4.0}], indirect=True)
def test_a_slow_judge_is_cut_off_by_its_budget(config: MemoryConfig, server: ChatServer, tmp_path: Path) -> None:
    memory = served_memory(config, folder_with_judge(tmp_path, judge_block(server.url, timeout=1.0)))
    old = memory.store(OLD, caller=ME)["document_id"]
    started = time.monotonic()
    result = memory.store(NEW, caller=ME)
    took = time.monotonic() - started
    assert took < 3.5, f"the store waited {took:.1f} s for a judge with a 1 s budget"
    assert server.requests  # it was asked ...
    assert result["stored"] is True  # ... the fact is stored, and the suggestion stands in for the verdict
    assert "superseded" not in result
    assert {"document_id": old, "content": OLD} in result["possibly_supersedes"]
    assert memory.read(old, caller=ME)["status"] == "approved"


@pytest.mark.parametrize("server", [{"status": 500}], indirect=True)
def test_a_failing_judge_falls_back_to_suggestions(config: MemoryConfig, server: ChatServer, tmp_path: Path) -> None:
    memory = served_memory(config, folder_with_judge(tmp_path, judge_block(server.url)))
    old = memory.store(OLD, caller=ME)["document_id"]
    result = memory.store(NEW, caller=ME)
    assert len(server.requests) == 1  # no retries: max_retries 0
    assert result["stored"] is True
    assert "superseded" not in result
    assert {"document_id": old, "content": OLD} in result["possibly_supersedes"]
    assert memory.read(old, caller=ME)["status"] == "approved"


def test_an_unreachable_judge_falls_back_to_suggestions(config: MemoryConfig, tmp_path: Path) -> None:
    closed = ChatServer()
    closed.close()  # nothing listens on its port any more
    memory = served_memory(config, folder_with_judge(tmp_path, judge_block(closed.url)))
    old = memory.store(OLD, caller=ME)["document_id"]
    result = memory.store(NEW, caller=ME)
    assert {"document_id": old, "content": OLD} in result["possibly_supersedes"]
    assert "superseded" not in result


def test_max_calls_leaves_the_rest_as_suggestions(config: MemoryConfig, server: ChatServer, tmp_path: Path) -> None:
    memory = served_memory(config, folder_with_judge(tmp_path, judge_block(server.url, max_calls=1)))
    first = memory.store("Staging uses the VPN profile stg-eu on weekdays", caller=ME)["document_id"]
    second = memory.store("Staging uses the VPN profile stg-eu", caller=ME)["document_id"]
    before = len(server.requests)
    result = memory.store(NEW, caller=ME)
    assert len(server.requests) - before == 1
    decided = set(result.get("superseded", []))
    offered = {p["document_id"] for p in result["possibly_supersedes"]}
    assert decided | offered == {first, second}
    assert not decided & offered


def test_a_plain_chat_generator_in_the_yaml_gets_the_default_budget(
    config: MemoryConfig, server: ChatServer, tmp_path: Path
) -> None:
    generator = judge_block(server.url)["init_parameters"]["chat_generator"]
    memory = served_memory(config, folder_with_judge(tmp_path, generator))
    old = memory.store(OLD, caller=ME)["document_id"]
    assert memory.store(NEW, caller=ME)["superseded"] == [old]
    assert isinstance(memory.judge, SupersessionJudge)
    assert memory.judge.timeout == 10.0


def test_a_judge_outside_the_allow_list_is_refused(config: MemoryConfig, tmp_path: Path) -> None:
    hostile = {"type": "subprocess.Popen", "init_parameters": {"args": ["true"]}}
    memory = served_memory(config, folder_with_judge(tmp_path, hostile))
    with pytest.raises(ConfigurationError, match="subprocess"):
        memory.warm_up()


def test_a_judge_in_the_yaml_and_in_code_is_refused(config: MemoryConfig, server: ChatServer, tmp_path: Path) -> None:
    from haystack.components.generators.chat import OpenAIChatGenerator

    folder = folder_with_judge(tmp_path, judge_block(server.url))
    memory = Memory(
        config, definitions=PipelineDefinitions.find(folder), judge=OpenAIChatGenerator(api_base_url=server.url)
    )
    with pytest.raises(ConfigurationError, match="keep one"):
        memory.warm_up()
