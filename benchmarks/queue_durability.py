"""Kill -9 during appends and replays: the JSON-lines durable queue vs a SQLite queue in WAL mode.

Usage::

    python benchmarks/queue_durability.py [--rounds 200] [--throughput-items 500] [--json out.json]

Method
------
Two queues with the same semantics: ``append`` returns once the item is durable (and the pending
items), ``items`` lists them oldest first, ``remove`` acknowledges delivered items, ``reject`` moves
items aside, ``try_claim`` lets one process replay at a time.

- ``jsonl``: `haystack_osa_memory.durable_queue.DurableQueue`, as `Memory`'s offline buffer and the
  stdio bridge use it (one write + fsync per append, atomic rewrite per removal, flock).
- ``sqlite-wal``: `SqliteQueue` below, one table in a SQLite file in WAL mode with
  ``synchronous=FULL``; append, remove and reject are one transaction each.

Two kinds of rounds for each queue, each round in a fresh folder:

- ``append``: two writer processes append in a loop; after each ``append`` returns, a writer logs the
  item's id (that is the acknowledgement its caller got). Each writer is killed with SIGKILL at a
  random moment (0-120 ms after it started appending). Then every acknowledged id must be in the
  queue exactly once, every record must parse and match its checksum, and an item appended after
  the kill must be readable (a torn last line must not swallow it).
- ``replay``: the queue starts with 30 acknowledged items; one writer keeps appending while a replayer
  holds the replay claim, logs each item as delivered and then removes it (every 7th item is rejected
  instead), as the offline replay does. Both are killed at random moments; a replay in this process
  then drains the queue. Every acknowledged id must end delivered or rejected (``lost`` if neither);
  ``duplicated`` counts ids delivered or rejected more than once: a kill between delivering and
  acknowledging makes the next replay deliver again (at-least-once, for either queue).

``torn`` counts records that do not parse or fail their checksum (and a failed SQLite
``integrity_check``); ``litter`` counts temporary files left beside the queue. Throughput: one process
appends N items to a fresh queue, then replays them one by one (deliver, then ``remove`` each).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.harness import machine_info  # noqa: E402
from haystack_osa_memory.durable_queue import DurableQueue, _flock  # noqa: E402

PREFILL = 30
REJECT_EVERY = 7
KILL_WINDOW_S = 0.12
DEFAULT_DIR = "/var/tmp"  # noqa: S108 - a disk (fsync means something), not tmpfs


class Queue(Protocol):
    def append(self, payload: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]: ...
    def items(self) -> list[dict[str, Any]]: ...
    def remove(self, ids: Collection[str]) -> list[dict[str, Any]]: ...
    def reject(self, ids: Collection[str], reason: str) -> int: ...
    def rejected(self) -> list[dict[str, Any]]: ...


class SqliteQueue:
    """The same queue in one SQLite file in WAL mode (``synchronous=FULL``: a commit is fsynced)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.claim_path = path.with_name(path.name + ".flush.lock")
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            # WAL is a property of the file (set once, by `prepare`); switching it takes a lock without waiting.
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS items (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,"
                " body TEXT NOT NULL)"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS rejected (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL,"
                " body TEXT NOT NULL)"
            )
            self._conn = conn
        return self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @staticmethod
    def _pending(conn: sqlite3.Connection) -> list[dict[str, Any]]:
        return [json.loads(body) for (body,) in conn.execute("SELECT body FROM items ORDER BY seq")]

    def append(self, payload: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        item = {"id": uuid.uuid4().hex, "queued_at": datetime.now(UTC).isoformat(), **payload}
        with self._transaction() as conn:
            conn.execute("INSERT INTO items (id, body) VALUES (?, ?)", (item["id"], json.dumps(item)))
            return item, self._pending(conn)

    def items(self) -> list[dict[str, Any]]:
        return self._pending(self._db())

    def remove(self, ids: Collection[str]) -> list[dict[str, Any]]:
        with self._transaction() as conn:
            conn.executemany("DELETE FROM items WHERE id = ?", [(i,) for i in ids])
            return self._pending(conn)

    def reject(self, ids: Collection[str], reason: str) -> int:
        with self._transaction() as conn:
            moved = 0
            for item_id in ids:
                row = conn.execute("SELECT body FROM items WHERE id = ?", (item_id,)).fetchone()
                if row is None:
                    continue
                record = {**json.loads(row[0]), "rejected_reason": reason}
                conn.execute("INSERT INTO rejected (id, body) VALUES (?, ?)", (item_id, json.dumps(record)))
                conn.execute("DELETE FROM items WHERE id = ?", (item_id,))
                moved += 1
            return moved

    def rejected(self) -> list[dict[str, Any]]:
        return [json.loads(body) for (body,) in self._db().execute("SELECT body FROM rejected ORDER BY seq")]

    def try_claim(self) -> int | None:
        """The replay lock (flock on a side file, as the JSON-lines queue): a descriptor, or None."""
        fd = os.open(self.claim_path, os.O_RDWR | os.O_CREAT, 0o600)
        if _flock(fd, blocking=False):
            return fd
        os.close(fd)
        return None

    def integrity_errors(self) -> int:
        (answer,) = self._db().execute("PRAGMA integrity_check").fetchone()
        return 0 if answer == "ok" else 1

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


KINDS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "jsonl": ("queue.jsonl", DurableQueue),
    "sqlite-wal": ("queue.sqlite", SqliteQueue),
}


def open_queue(kind: str, folder: Path) -> Any:
    name, factory = KINDS[kind]
    return factory(folder / name)


def prepare(kind: str, folder: Path) -> None:
    """Create the queue before any child opens it (SQLite: the file in WAL mode and its tables)."""
    queue = open_queue(kind, folder)
    if isinstance(queue, SqliteQueue):
        queue.items()
        queue.close()
    else:
        queue.ensure_dir()


def _payload(writer: str, n: int) -> dict[str, Any]:
    pad = os.urandom(96).hex()  # ~200 bytes: a fact with its scope is of this order
    return {"writer": writer, "n": n, "pad": pad, "check": hashlib.sha256(pad.encode()).hexdigest()[:16]}


def _intact(item: dict[str, Any]) -> bool:
    pad = item.get("pad")
    return isinstance(pad, str) and hashlib.sha256(pad.encode()).hexdigest()[:16] == item.get("check")


def _log(fd: int, item_id: str) -> None:
    os.write(fd, (item_id + "\n").encode())  # one small write: atomic on a local file


def _read_log(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if len(line) == 32]


# -- child processes (forked: the queue module is already imported) --------------------------------
def _writer(kind: str, folder: str, writer: str, ready: Any) -> None:
    queue = open_queue(kind, Path(folder))
    fd = os.open(Path(folder) / f"acked-{writer}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    ready.set()
    n = 0
    while True:
        item, _ = queue.append(_payload(writer, n))
        _log(fd, item["id"])  # the caller has its acknowledgement from here on
        n += 1


def _replayer(kind: str, folder: str, ready: Any) -> None:
    queue = open_queue(kind, Path(folder))
    fd = os.open(Path(folder) / "delivered-child.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    ready.set()
    while True:
        claim = queue.try_claim()
        if claim is None:
            time.sleep(0.001)
            continue
        try:
            for item in queue.items():
                if item["n"] % REJECT_EVERY == 0:
                    queue.reject({item["id"]}, "refused at replay")
                    continue
                _log(fd, item["id"])  # delivered (the database has it) ...
                queue.remove({item["id"]})  # ... then acknowledged
        finally:
            if isinstance(claim, int):
                os.close(claim)
            else:
                claim.release()
        time.sleep(0.001)


# -- rounds -------------------------------------------------------------------------------------------
@dataclass
class Tally:
    rounds: int = 0
    acked: int = 0
    lost: int = 0
    duplicated: int = 0
    rejected_twice: int = 0
    torn: int = 0
    litter: int = 0
    after_kill_lost: int = 0
    killed_mid_run: int = 0
    seconds: float = 0.0
    examples: list[str] = field(default_factory=list)


def _start(targets: list[tuple[Callable[..., None], tuple[Any, ...]]]) -> list[multiprocessing.Process]:
    ctx = multiprocessing.get_context("fork")
    started = []
    for target, args in targets:
        ready = ctx.Event()
        proc = ctx.Process(target=target, args=(*args, ready), daemon=True)
        proc.start()
        started.append((proc, ready))
    for _, ready in started:
        ready.wait(30)
    return [proc for proc, _ in started]


def _kill_at_random(procs: list[multiprocessing.Process], rng: random.Random) -> int:
    """SIGKILL each process at its own random moment; how many were still running when killed."""
    deadlines = sorted((rng.uniform(0.0, KILL_WINDOW_S), i) for i in range(len(procs)))
    begin = time.monotonic()
    alive = 0
    for at, i in deadlines:
        time.sleep(max(0.0, begin + at - time.monotonic()))
        alive += procs[i].is_alive()
        with contextlib.suppress(ProcessLookupError):  # it died on its own: its traceback is on stderr
            os.kill(procs[i].pid or 0, signal.SIGKILL)
    for proc in procs:
        proc.join(30)
    return alive


def _stored_records(kind: str, queue: Any) -> tuple[list[dict[str, Any]], int]:
    """Every item in the queue, and how many records are torn (unparsable, wrong checksum, bad file)."""
    if kind == "jsonl":
        torn = 0
        items = []
        raw = queue.path.read_bytes() if queue.path.exists() else b""
        for line in raw.decode("utf-8", errors="surrogateescape").splitlines():
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                torn += 1
                continue
            if _intact(item):
                items.append(item)
            else:
                torn += 1
        return items, torn
    items = queue.items()
    return [i for i in items if _intact(i)], queue.integrity_errors() + sum(not _intact(i) for i in items)


def _litter(folder: Path) -> int:
    return sum(1 for p in folder.iterdir() if p.name.endswith(".tmp"))


def append_round(kind: str, folder: Path, rng: random.Random, tally: Tally) -> None:
    prepare(kind, folder)
    procs = _start([(_writer, (kind, str(folder), "a")), (_writer, (kind, str(folder), "b"))])
    tally.killed_mid_run += _kill_at_random(procs, rng)
    queue = open_queue(kind, folder)
    acked = _read_log(folder / "acked-a.log") + _read_log(folder / "acked-b.log")
    items, torn = _stored_records(kind, queue)
    present = Counter(i["id"] for i in items)
    lost = [i for i in acked if present[i] == 0]
    tally.acked += len(acked)
    tally.lost += len(lost)
    tally.duplicated += sum(n - 1 for n in present.values() if n > 1)
    tally.torn += torn
    tally.litter += _litter(folder)
    after, _ = queue.append(_payload("after", 0))
    tally.after_kill_lost += after["id"] not in {i["id"] for i in queue.items()}
    if lost and len(tally.examples) < 5:
        tally.examples.append(f"append round {tally.rounds}: lost {lost[:3]}")
    if isinstance(queue, SqliteQueue):
        queue.close()


def replay_round(kind: str, folder: Path, rng: random.Random, tally: Tally) -> None:
    queue = open_queue(kind, folder)
    prefilled = [queue.append(_payload("prefill", n))[0]["id"] for n in range(PREFILL)]
    if isinstance(queue, SqliteQueue):
        queue.close()  # never carried across fork
    procs = _start([(_writer, (kind, str(folder), "w")), (_replayer, (kind, str(folder)))])
    tally.killed_mid_run += _kill_at_random(procs, rng)
    queue = open_queue(kind, folder)
    _, torn = _stored_records(kind, queue)
    tally.torn += torn
    tally.litter += _litter(folder)
    # The next replay, to the end: deliver everything left, then acknowledge it.
    delivered = _read_log(folder / "delivered-child.log")
    left = queue.items()
    refused = [i["id"] for i in left if i["n"] % REJECT_EVERY == 0]
    delivered += [i["id"] for i in left if i["n"] % REJECT_EVERY != 0]
    queue.reject(set(refused), "refused at replay")
    queue.remove({i["id"] for i in left})
    acked = prefilled + _read_log(folder / "acked-w.log")
    ends = Counter(delivered) + Counter(i["id"] for i in queue.rejected())
    lost = [i for i in acked if ends[i] == 0]
    tally.acked += len(acked)
    tally.lost += len(lost)
    tally.duplicated += sum(ends[i] - 1 for i in acked if ends[i] > 1)
    twice = Counter(i["id"] for i in queue.rejected())
    tally.rejected_twice += sum(n - 1 for n in twice.values() if n > 1)
    if queue.items():
        tally.lost += len(queue.items())  # the drained queue must be empty
    if lost and len(tally.examples) < 5:
        tally.examples.append(f"replay round {tally.rounds}: lost {lost[:3]}")
    if isinstance(queue, SqliteQueue):
        queue.close()


def run_rounds(kind: str, round_kind: str, rounds: int, base: Path, seed: int) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    step = append_round if round_kind == "append" else replay_round
    begin = time.perf_counter()
    for _ in range(rounds):
        folder = Path(tempfile.mkdtemp(prefix=f"{kind}-{round_kind}-", dir=base))
        try:
            step(kind, folder, rng, tally)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        tally.rounds += 1
    tally.seconds = time.perf_counter() - begin
    return tally


def throughput(kind: str, items: int, base: Path, repeat: int) -> dict[str, float]:
    """Items per second, the median of ``repeat`` runs: N appends to a fresh queue, then a replay that removes
    them one by one."""
    runs = [_throughput_once(kind, items, base) for _ in range(repeat)]
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def _throughput_once(kind: str, items: int, base: Path) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix=f"{kind}-throughput-", dir=base))
    try:
        queue = open_queue(kind, folder)
        begin = time.perf_counter()
        for n in range(items):
            queue.append(_payload("t", n))
        appended = time.perf_counter() - begin
        begin = time.perf_counter()
        for item in queue.items():
            queue.remove({item["id"]})
        replayed = time.perf_counter() - begin
        if isinstance(queue, SqliteQueue):
            queue.close()
        return {"append_per_s": items / appended, "replay_per_s": items / replayed}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="rounds per queue and kind of round")
    parser.add_argument("--throughput-items", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs per queue (the median is shown)")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--dir", type=Path, default=None, help="where the queues live (a real disk, not tmpfs)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    base = Path(tempfile.mkdtemp(prefix="queue-durability-", dir=args.dir or DEFAULT_DIR))
    machine = machine_info()
    report: dict[str, Any] = {
        "machine": machine,
        "sqlite": sqlite3.sqlite_version,
        "rounds": args.rounds,
        "results": {},
    }
    print(f"CPU {machine['cpu_model']} x{machine['cores']}, Python {machine['python']}, SQLite {report['sqlite']}")
    print(f"load at start {machine['load_avg_at_start'][0]:.2f}; queues under {base}")
    try:
        for kind in args.kinds:
            for round_kind in ("append", "replay"):
                tally = run_rounds(kind, round_kind, args.rounds, base, args.seed)
                report["results"][f"{kind}/{round_kind}"] = asdict(tally)
            report["results"][f"{kind}/throughput"] = throughput(kind, args.throughput_items, base, args.repeat)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report["load_end"] = os.getloadavg()

    header = (
        "| queue/rounds | rounds | killed | acked | lost | duplicated | of which rejected twice | torn "
        "| lost after kill | litter | seconds |"
    )
    print()
    print(header)
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, row in report["results"].items():
        if name.endswith("/throughput"):
            continue
        print(
            f"| {name} | {row['rounds']} | {row['killed_mid_run']} | {row['acked']} | {row['lost']} | "
            f"{row['duplicated']} | {row['rejected_twice']} | {row['torn']} | {row['after_kill_lost']} | "
            f"{row['litter']} | {row['seconds']:.1f} |"
        )
    print()
    note = f"{args.throughput_items} items, median of {args.repeat}"
    print(f"| queue | appends/s | removals/s (replay, one by one) | {note} |")
    print("|---|---|---|---|")
    for kind in args.kinds:
        row = report["results"][f"{kind}/throughput"]
        print(f"| {kind} | {row['append_per_s']:.0f} | {row['replay_per_s']:.0f} | |")
    for name, row in report["results"].items():
        for example in row.get("examples", []) if isinstance(row, dict) else []:
            print(f"{name}: {example}")
    print(f"\nload at end {report['load_end'][0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
