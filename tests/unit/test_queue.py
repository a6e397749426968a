"""The one durable queue (`haystack_osa_memory.durable_queue`) behind `Memory`'s offline buffer and the bridge's."""

from __future__ import annotations

import json
import multiprocessing
import stat
from pathlib import Path
from typing import Any

import pytest

from haystack_osa_memory import durable_queue as queue_module
from haystack_osa_memory.caller import Caller
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.durable_queue import DurableQueue, rank, words
from haystack_osa_memory.mcp.stdio_bridge import BridgeBuffer, token_fingerprint
from haystack_osa_memory.memory import Memory

PER_PROCESS = 100


def _append_many(path: str, label: str, remove_own: bool, start: Any) -> None:
    """Worker: append PER_PROCESS items; with ``remove_own``, also remove each even item right after
    appending the next one (a read-modify-write racing the other process's appends)."""
    queue = DurableQueue(Path(path))
    previous: dict[str, Any] | None = None
    start.wait(60)  # both processes start together: the race is real
    for n in range(PER_PROCESS):
        item, _ = queue.append({"label": label, "n": n})
        if remove_own and previous is not None and previous["n"] % 2 == 0:
            queue.remove({previous["id"]})
        previous = item


def _hold_claim(path: str, held: Any, release: Any) -> None:
    claim = DurableQueue(Path(path)).try_claim()
    assert claim is not None
    held.set()
    release.wait(30)
    claim.release()


def test_a_torn_last_line_is_skipped_kept_and_never_swallows_the_next_item(tmp_path: Path) -> None:
    queue = DurableQueue(tmp_path / "q.jsonl")
    first, _ = queue.append({"fact": "first"})
    with queue.path.open("ab") as f:  # a crash in the middle of an append: no newline at the end
        f.write(b'{"id": "torn", "fact": "half of it')
    assert [i["id"] for i in queue.items()] == [first["id"]]  # the reader does not crash
    second, pending = queue.append({"fact": "second"})
    assert [i["id"] for i in pending] == [first["id"], second["id"]]  # not glued onto the fragment
    assert queue.remove({first["id"]}) == [second]
    lines = queue.path.read_text().splitlines()
    assert lines[0] == '{"id": "torn", "fact": "half of it'  # kept verbatim through the rewrite
    assert json.loads(lines[1])["id"] == second["id"]
    with queue.rejected_path.open("ab") as f:
        f.write(b'{"id": "torn-rej')
    assert queue.reject({second["id"]}, "refused") == 1
    assert [r["id"] for r in queue.rejected()] == [second["id"]]
    assert queue.items() == []


def test_concurrent_appends_and_removals_from_two_processes_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "q.jsonl"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    workers = [
        ctx.Process(target=_append_many, args=(str(path), "appender", False, start)),
        ctx.Process(target=_append_many, args=(str(path), "remover", True, start)),
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    lines = path.read_text().splitlines()
    items = [json.loads(line) for line in lines]  # every line whole: no interleaved writes
    by_label = {label: [i["n"] for i in items if i["label"] == label] for label in ("appender", "remover")}
    assert by_label["appender"] == list(range(PER_PROCESS))  # none lost to the other's rewrites, in order
    kept = [n for n in range(PER_PROCESS) if n % 2 == 1 or n == PER_PROCESS - 1]
    assert by_label["remover"] == kept
    assert len({i["id"] for i in items}) == len(items)


def test_remove_by_id_removes_exactly_those(tmp_path: Path) -> None:
    queue = DurableQueue(tmp_path / "q.jsonl")
    a, _ = queue.append({"fact": "a"})
    b, _ = queue.append({"fact": "b"})
    c, _ = queue.append({"fact": "c"})
    assert [i["id"] for i in queue.remove({b["id"]})] == [a["id"], c["id"]]
    before = queue.path.stat().st_mtime_ns, queue.path.read_bytes()
    assert [i["id"] for i in queue.remove({"no-such-id"})] == [a["id"], c["id"]]
    assert (queue.path.stat().st_mtime_ns, queue.path.read_bytes()) == before  # nothing rewritten
    assert queue.remove({a["id"], c["id"]}) == []
    assert queue.items() == []
    assert stat.S_IMODE(queue.path.stat().st_mode) == 0o600
    with pytest.raises(ValueError, match="set by the queue"):
        queue.append({"id": "mine", "fact": "d"})


def test_refused_items_move_to_the_rejected_file_with_their_reason(tmp_path: Path) -> None:
    queue = DurableQueue(tmp_path / "private" / "q.jsonl")
    a, _ = queue.append({"fact": "a", "token_id": "t1"})
    b, _ = queue.append({"fact": "b", "token_id": "t2"})
    c, _ = queue.append({"fact": "c", "token_id": "t1"})
    assert queue.reject({"no-such-id"}, "nothing") == 0
    assert not queue.rejected_path.exists()
    assert queue.reject({c["id"], a["id"]}, "token revoked") == 2
    assert [i["id"] for i in queue.items()] == [b["id"]]
    records = [json.loads(line) for line in queue.rejected_path.read_text().splitlines()]
    assert [(r["id"], r["fact"], r["rejected_reason"]) for r in records] == [
        (a["id"], "a", "token revoked"),
        (c["id"], "c", "token revoked"),
    ]
    assert all(r["rejected_at"] and r["queued_at"] for r in records)
    assert queue.rejected() == records
    assert queue.rejected_path.name == "q.jsonl.rejected"
    assert stat.S_IMODE(queue.rejected_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(queue.path.parent.stat().st_mode) == 0o700


def test_one_replay_at_a_time_across_processes_and_threads(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    queue = DurableQueue(path)
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_claim, args=(str(path), held, release))
    other.start()
    try:
        assert held.wait(60)
        assert queue.try_claim() is None  # the other process replays
    finally:
        release.set()
        other.join(60)
    assert other.exitcode == 0
    claim = queue.try_claim()
    assert claim is not None
    assert DurableQueue(path).try_claim() is None  # another object (thread) in this process
    claim.release()
    claim.release()  # idempotent
    again = queue.try_claim()
    assert again is not None
    again.release()


def test_the_queue_works_where_fcntl_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_module, "fcntl", None)
    queue = DurableQueue(tmp_path / "q.jsonl")
    a, _ = queue.append({"fact": "a"})
    assert queue.items() == [a]
    claim = queue.try_claim()
    assert claim is not None
    assert queue.try_claim() is None  # the thread lock still serialises this process
    claim.release()
    assert queue.remove({a["id"]}) == []


def test_the_tokeniser_splits_on_anything_but_letters_and_digits() -> None:
    assert words("Primary DB_a moved to db-B, über-FAST! 42x") == {
        "primary",
        "db",
        "a",
        "moved",
        "to",
        "b",
        "über",
        "fast",
        "42x",
    }
    assert words("  ,;- __ ") == set()


def test_rank_scores_overlap_share_best_first_newest_first_among_equals() -> None:
    entries = [
        ("the primary is db-a", None, "old"),
        ("unrelated note", "ops", "none"),
        ("the primary moved", None, "mid"),
        ("writes paused", "primary", "topic"),
        ("primary moved to db-b", None, "best"),
    ]
    ranked = rank("Primary moved?", entries, 10)
    assert [v for _, v in ranked] == ["best", "mid", "topic", "old"]
    assert [s for s, _ in ranked] == [1.0, 1.0, 0.5, 0.5]
    assert [v for _, v in rank("primary moved", entries, 1)] == ["best"]
    assert rank("?!", entries, 10) == []
    assert rank("nothing matches", entries, 0) == []


def test_memory_and_the_bridge_rank_the_same_buffered_facts_the_same_way(tmp_path: Path) -> None:
    facts = [
        ("The primary is db-a", "db"),
        ("Staging deploys need the VPN", "deploy"),
        ("The primary moved to db_b during the outage", None),
        ("Writes were paused", "primary outage"),
        ("The outage ended at noon", None),
    ]
    query = "primary outage DB"
    bridge = BridgeBuffer(tmp_path / "bridge.jsonl", token_fingerprint("tok"))
    for fact, topic in facts:
        bridge.append("kb_memory_store", {"fact": fact, **({"topic": topic} if topic else {})})
    bridged, searched = bridge.search(query, 3, None)
    assert searched == len(facts)

    memory = Memory(MemoryConfig(buffer_path=tmp_path / "offline.jsonl", embedder="none"), use_default_embedders=False)
    me = Caller(org_id="acme", assignment_id="asg-1")
    for fact, topic in facts:
        memory.offline.queue.append(
            {"org_id": "acme", "assignment_id": "asg-1", "fact": fact, "meta": {"topic": topic} if topic else {}}
        )
    memory.offline.queue.append({"org_id": "acme", "assignment_id": "asg-2", "fact": "primary outage db elsewhere"})
    degraded = memory.offline.recall(query, 3, me)

    ranking = [(f["content"], f["score"]) for f in bridged]
    assert ranking == [(f["content"], f["score"]) for f in degraded["facts"]]
    assert ranking == [
        ("The primary moved to db_b during the outage", 1.0),
        ("Writes were paused", round(2 / 3, 6)),
        ("The primary is db-a", round(2 / 3, 6)),
    ]
