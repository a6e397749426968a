"""The offline buffer's pure parts: the last known kill-switch states, and queueing a set-aside item again."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from haystack_osa_memory import offline
from haystack_osa_memory.caller import Caller
from haystack_osa_memory.durable_queue import DurableQueue
from haystack_osa_memory.offline import SwitchStates

C = Caller(org_id="orgC", assignment_id="killme")
D = Caller(org_id="orgD", assignment_id="works")


def test_a_scope_is_on_until_something_said_it_is_off() -> None:
    states = SwitchStates()
    assert states.known_off(C) is False
    states.note(C, True)
    assert states.known_off(C) is True
    assert states.known_off(D) is False
    states.note(C, False)
    assert states.known_off(C) is False


def test_the_list_of_switches_covers_scopes_never_checked_and_whole_orgs() -> None:
    states = SwitchStates()
    assert states.list_due() is True
    states.note_all([("orgC", "killme"), ("orgE", "*"), ("*", "everywhere")])
    assert states.list_due() is False
    assert states.known_off(C) is True
    assert states.known_off(Caller(org_id="orgE", assignment_id="any")) is True
    assert states.known_off(Caller(org_id="orgF", assignment_id="everywhere")) is True
    assert states.known_off(D) is False


def test_the_newer_source_wins() -> None:
    states = SwitchStates()
    states.note_all([("orgC", "killme")])
    time.sleep(0.01)
    states.note(C, False)  # checked after the list was read: switched back on since
    assert states.known_off(C) is False
    states.note(D, True)
    time.sleep(0.01)
    states.note_all([])  # read after: D is on again
    assert states.known_off(D) is False


def test_the_list_is_read_again_after_its_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    states = SwitchStates()
    states.note_all([])
    monkeypatch.setattr(offline, "SWITCH_LIST_S", 0.0)
    assert states.list_due() is True


def test_restore_moves_a_rejected_item_back_with_changes(tmp_path: Path) -> None:
    queue = DurableQueue(tmp_path / "buffer.jsonl")
    first, _ = queue.append({"fact": "one", "token_id": "0123456789abcdef"})
    second, _ = queue.append({"fact": "two", "token_id": "0123456789abcdef"})
    assert queue.reject({first["id"], second["id"]}, "token revoked or expired before the replay") == 2
    assert queue.items() == []

    restored = queue.restore({first["id"]}, {"token_id": None, "vouched_by": "cli:op"})
    assert [r["id"] for r in restored] == [first["id"]]
    (item,) = queue.items()
    assert (item["id"], item["fact"], item["token_id"], item["vouched_by"]) == (first["id"], "one", None, "cli:op")
    assert {"rejected_reason", "rejected_at"}.isdisjoint(item)
    assert item["queued_at"] == first["queued_at"]
    assert "requeued_at" in item
    assert [r["id"] for r in queue.rejected()] == [second["id"]]
    assert stat.S_IMODE(queue.rejected_path.stat().st_mode) == 0o600
    # unknown ids move nothing; the queue's own keys cannot be changed
    assert queue.restore({"f" * 32}) == []
    with pytest.raises(ValueError, match="set by the queue"):
        queue.restore({second["id"]}, {"id": "x"})
    assert len(queue.items()) == 1


def test_restore_keeps_lines_that_are_not_items(tmp_path: Path) -> None:
    queue = DurableQueue(tmp_path / "buffer.jsonl")
    item, _ = queue.append({"fact": "one"})
    queue.reject({item["id"]}, "refused at replay: test")
    with queue.rejected_path.open("a") as f:
        f.write('{"torn": ')  # a torn append: never destroyed by a rewrite
    queue.restore({item["id"]})
    assert queue.rejected_path.read_text() == '{"torn": \n'
    assert [json.loads(line)["id"] for line in queue.path.read_text().splitlines()] == [item["id"]]


def test_queue_commands_list_and_queue_again(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from haystack_osa_memory.cli.main import app
    from haystack_osa_memory.offline import TOKEN_GONE

    buffer = tmp_path / "buffer.jsonl"
    env = {"OSA_MEMORY_BUFFER": str(buffer), "OSA_MEMORY_DATA_DIR": str(tmp_path), "COLUMNS": "300"}
    queue = DurableQueue(buffer)
    gone, _ = queue.append({"org_id": "orgD", "assignment_id": "works", "token_id": "0123456789abcdef", "fact": "a"})
    refused, _ = queue.append({"org_id": "orgC", "assignment_id": "other", "token_id": None, "fact": "b"})
    queue.reject({gone["id"]}, TOKEN_GONE)
    queue.reject({refused["id"]}, "refused at replay: fact x was superseded")
    runner = CliRunner()

    listed = runner.invoke(app, ["queue", "rejected", "--json", "--org", "orgD"], env=env)
    assert listed.exit_code == 0, listed.output
    assert [(r["id"], r["reason"], r["fact"]) for r in json.loads(listed.stdout)] == [(gone["id"], TOKEN_GONE, "a")]
    table = runner.invoke(app, ["queue", "rejected"], env=env)
    assert gone["id"] in table.stdout
    assert refused["id"] in table.stdout

    bad = runner.invoke(app, ["queue", "retry", "../etc"], env=env)
    assert bad.exit_code == 1
    assert "32 hexadecimal characters" in bad.stderr
    unknown = runner.invoke(app, ["queue", "retry", "f" * 32], env=env)
    assert unknown.exit_code == 1
    assert "queue rejected" in unknown.stderr
    # a fact set aside for its token needs an operator to vouch for it
    refused_again = runner.invoke(app, ["queue", "retry", gone["id"]], env=env)
    assert refused_again.exit_code == 1
    assert "--as-operator" in refused_again.stderr
    assert queue.items() == []

    assert runner.invoke(app, ["queue", "retry", refused["id"]], env=env).exit_code == 0
    vouched = runner.invoke(app, ["queue", "retry", gone["id"], "--as-operator"], env=env)
    assert vouched.exit_code == 0, vouched.output
    items = {i["id"]: i for i in queue.items()}
    assert items[refused["id"]]["token_id"] is None
    assert "vouched_by" not in items[refused["id"]]
    assert items[gone["id"]]["token_id"] is None
    assert items[gone["id"]]["rejected_token_id"] == "0123456789abcdef"
    assert items[gone["id"]]["vouched_by"].startswith("cli:")
    assert queue.rejected() == []
    assert json.loads(runner.invoke(app, ["queue", "rejected", "--json"], env=env).stdout) == []
