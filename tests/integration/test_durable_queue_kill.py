"""The durable queue under SIGKILL: writers killed in the middle of appending, while another process replays
and removes items, lose none of the items their callers were told were queued (real processes, real files;
no database). The full comparison with SQLite is benchmarks/queue_durability.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from haystack_osa_memory.durable_queue import DurableQueue

pytestmark = pytest.mark.slow

ROUNDS = 5


def _log(fd: int, item_id: str) -> None:
    os.write(fd, (item_id + "\n").encode())


def _read_log(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _writer(folder: str, name: str, ready: Any) -> None:
    """Append forever; log each id once `append` has returned (the acknowledgement)."""
    queue = DurableQueue(Path(folder) / "queue.jsonl")
    fd = os.open(Path(folder) / f"acked-{name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    ready.set()
    n = 0
    while True:
        item, _ = queue.append({"writer": name, "n": n, "fact": "x" * 200})
        _log(fd, item["id"])
        n += 1


def _replayer(folder: str, ready: Any) -> None:
    """Replay as the offline buffer does: under the claim, deliver (log) each item, then remove it."""
    queue = DurableQueue(Path(folder) / "queue.jsonl")
    fd = os.open(Path(folder) / "delivered.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    ready.set()
    while True:
        claim = queue.try_claim()
        if claim is not None:
            try:
                for item in queue.items():
                    _log(fd, item["id"])
                    queue.remove({item["id"]})
            finally:
                claim.release()
        time.sleep(0.002)


def test_writers_killed_mid_append_lose_no_acknowledged_item(tmp_path: Path) -> None:
    # Spawned, not forked: no locks or threads inherited from the test process. This module imports nothing
    # heavy, so a child starts in a fraction of a second.
    ctx = multiprocessing.get_context("spawn")
    rng = random.Random(2026)
    acked_total = 0
    for round_ in range(ROUNDS):
        folder = tmp_path / f"round-{round_}"
        folder.mkdir()
        events = [ctx.Event() for _ in range(3)]
        procs = [
            ctx.Process(target=_writer, args=(str(folder), "a", events[0]), daemon=True),
            ctx.Process(target=_writer, args=(str(folder), "b", events[1]), daemon=True),
            ctx.Process(target=_replayer, args=(str(folder), events[2]), daemon=True),
        ]
        for proc in procs:
            proc.start()
        for event in events:
            assert event.wait(30)
        time.sleep(0.03)  # every writer is appending by now
        for proc in rng.sample(procs, len(procs)):  # killed one after another, in a random order
            time.sleep(rng.uniform(0.0, 0.05))
            assert proc.is_alive(), "a worker died before it was killed"
            os.kill(proc.pid or 0, signal.SIGKILL)
        for proc in procs:
            proc.join(10)
            assert proc.exitcode == -signal.SIGKILL

        queue = DurableQueue(folder / "queue.jsonl")
        acked = _read_log(folder / "acked-a.log") + _read_log(folder / "acked-b.log")
        queued = Counter(item["id"] for item in queue.items())
        delivered = set(_read_log(folder / "delivered.log"))
        assert [i for i in acked if i not in queued and i not in delivered] == [], f"round {round_}: lost"
        assert [i for i, n in queued.items() if n > 1] == [], f"round {round_}: an item queued twice"
        # Whatever the kill left at the end of the file, the next item is stored whole and readable.
        after, pending = queue.append({"writer": "after", "n": 0, "fact": "after the kill"})
        assert pending[-1] == after
        assert json.loads((folder / "queue.jsonl").read_text().splitlines()[-1])["id"] == after["id"]
        acked_total += len(acked)
    assert acked_total > ROUNDS  # the writers did append before they were killed
