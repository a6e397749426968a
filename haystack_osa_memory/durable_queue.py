"""The one durable local queue: `Memory`'s offline buffer and the stdio bridge's buffer are both this.

JSON lines, one item per line: ``{"id", "queued_at", **payload}``. `Memory` queues facts (``fact``,
``meta``, ``org_id``, ``assignment_id``, ``specialist_id``, ``token_id``); the bridge queues calls
(``tool``, ``arguments``, ``token_fingerprint``). The queue does not look inside payloads.

- Append: one ``write`` then ``fsync`` (the file is created with mode 0600 in a folder created 0700,
  and the folder is fsynced when the file is new), so an acknowledged item survives a crash.
- Removal and moving aside rewrite the file atomically (temporary file, fsync, rename, fsync folder).
- Refused items move to ``<queue>.rejected`` with ``rejected_at`` and ``rejected_reason``; they are
  appended (fsync) there before they leave the queue: a crash in between leaves a copy in both files,
  never in neither. ``restore`` moves one back the same way (queue first, then the rejected file).
- Torn lines: a crash mid-append can leave a last line without its newline. Readers skip any line
  that is not an item (logged, never raised), and every rewrite keeps such lines verbatim; an append
  first ends an unterminated last line with a newline. Of the two policies this module replaces
  (drop unparsable lines at the next rewrite, vs. keep them and guard the next append) this is the
  safer one: without the guard the next item is glued onto the fragment and lost with it, and a
  rewrite cannot tell a torn line from one written by a newer version, so it never destroys bytes.
- Locking: a read-modify-write holds ``flock`` on ``<queue>.lock`` (processes) and a per-file thread
  lock (threads, and the only guard where ``fcntl`` does not exist, e.g. Windows). ``try_claim`` takes
  a second, non-blocking lock (``<queue>.flush.lock``) so only one process replays the queue at once.
- Recall while offline: `rank` is the one word-overlap scoring both `Memory` and the bridge use.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import threading
import uuid
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; the thread lock still serialises this process
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

T = TypeVar("T")

RESERVED = frozenset({"id", "queued_at"})

# Per-file thread locks, shared by every queue object on the same path in this process: flock alone
# does not serialise threads where fcntl is missing.
_THREAD_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def _thread_lock(path: Path, kind: str) -> threading.Lock:
    key = (os.path.abspath(path), kind)
    with _THREAD_LOCKS_GUARD:
        return _THREAD_LOCKS.setdefault(key, threading.Lock())


def _flock(fd: int, *, blocking: bool) -> bool:
    """Exclusive advisory lock on ``fd``; False if ``blocking`` is False and another process holds it."""
    if fcntl is None:  # pragma: no cover - see the import
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _fsync_dir(directory: Path) -> None:
    if sys.platform == "win32":  # pragma: no cover - directories cannot be opened there
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", errors="surrogateescape")


def _append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` (whole lines) with one write and fsync; end a torn last line first."""
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size:
            os.lseek(fd, size - 1, os.SEEK_SET)
            if os.read(fd, 1) != b"\n":
                data = b"\n" + data  # otherwise the new line is glued onto the fragment and lost with it
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        _fsync_dir(path.parent)


def _parse(path: Path) -> list[tuple[str, dict[str, Any] | None]]:
    """Every non-empty line with its item, or None for a line that is not an item (kept verbatim)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    lines: list[tuple[str, dict[str, Any] | None]] = []
    skipped = 0
    for line in raw.decode("utf-8", errors="surrogateescape").splitlines():
        if not line.strip():
            continue
        try:
            parsed = json.loads(line)
        except ValueError:
            parsed = None
        item = parsed if isinstance(parsed, dict) and isinstance(parsed.get("id"), str) else None
        skipped += item is None
        lines.append((line, item))
    if skipped:
        logger.warning("%s: skipping %d line(s) that are not items (a torn append?); kept in the file", path, skipped)
    return lines


class Claim:
    """The replay lock of one queue, held until `release` (which may run in another thread)."""

    def __init__(self, fd: int, lock: threading.Lock) -> None:
        self._fd: int | None = fd
        self._lock = lock

    def release(self) -> None:
        if self._fd is None:
            return
        os.close(self._fd)  # closing releases the flock
        self._fd = None
        self._lock.release()


class DurableQueue:
    """Append, read, remove and set aside items of a JSON-lines file shared by threads and processes.

    Usage:
    ```python
    queue = DurableQueue(Path("/tmp/offline.jsonl"))
    item, items = queue.append({"fact": "..."})     # the new item and every pending item
    for item in queue.items(): ...
    queue.remove([item["id"]])                      # after the item was delivered
    queue.reject([item["id"]], "token revoked")     # refused for good: to <queue>.rejected
    ```
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self.claim_path = path.with_name(path.name + ".flush.lock")
        self.rejected_path = path.with_name(path.name + ".rejected")

    def ensure_dir(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold this file's thread lock and its cross-process flock; never nested."""
        self.ensure_dir()
        with _thread_lock(self.path, "io"):
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                _flock(fd, blocking=True)
                yield
            finally:
                os.close(fd)  # closing releases the flock

    def try_claim(self) -> Claim | None:
        """Take the replay lock without waiting: a `Claim`, or None if another thread or process replays."""
        self.ensure_dir()
        lock = _thread_lock(self.path, "claim")
        if not lock.acquire(blocking=False):
            return None
        try:
            fd = os.open(self.claim_path, os.O_RDWR | os.O_CREAT, 0o600)
        except BaseException:
            lock.release()
            raise
        if _flock(fd, blocking=False):
            return Claim(fd, lock)
        os.close(fd)
        lock.release()
        return None

    def append(self, payload: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Queue ``payload`` durably. Returns the stored item and every pending item after it, oldest first."""
        if RESERVED & payload.keys():
            msg = f"payload keys {sorted(RESERVED & payload.keys())} are set by the queue"
            raise ValueError(msg)
        item = {"id": uuid.uuid4().hex, "queued_at": datetime.now(UTC).isoformat(), **payload}
        with self._locked():
            _append_durably(self.path, _encode(item))
            return item, [i for _, i in _parse(self.path) if i is not None]

    def items(self) -> list[dict[str, Any]]:
        """Pending items, oldest first (lines that are not items are skipped)."""
        with self._locked():
            return [i for _, i in _parse(self.path) if i is not None]

    def remove(self, ids: Collection[str]) -> list[dict[str, Any]]:
        """Drop the items with these ids (atomic rewrite). Returns the pending items left."""
        with self._locked():
            lines = _parse(self.path)
            kept = [(raw, i) for raw, i in lines if i is None or i["id"] not in ids]
            if len(kept) != len(lines):
                self._rewrite([raw for raw, _ in kept])
            return [i for _, i in kept if i is not None]

    def reject(self, ids: Collection[str], reason: str) -> int:
        """Move the items with these ids to the rejected file with ``reason``. Returns how many moved."""
        with self._locked():
            lines = _parse(self.path)
            moving = [i for _, i in lines if i is not None and i["id"] in ids]
            if not moving:
                return 0
            now = datetime.now(UTC).isoformat()
            records = b"".join(_encode({**i, "rejected_at": now, "rejected_reason": reason}) for i in moving)
            _append_durably(self.rejected_path, records)  # before the rewrite: never in neither file
            self._rewrite([raw for raw, i in lines if i is None or i["id"] not in ids])
            return len(moving)

    def rejected(self) -> list[dict[str, Any]]:
        """Items set aside by `reject`, oldest first (kept for an operator, replayed only through `restore`)."""
        with self._locked():
            return [i for _, i in _parse(self.rejected_path) if i is not None]

    def restore(self, ids: Collection[str], changes: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Move the rejected items with these ids back to the end of the queue, without their rejection
        fields and with ``changes`` applied, stamped ``requeued_at``. Returns the items queued again."""
        if changes and RESERVED & changes.keys():
            msg = f"payload keys {sorted(RESERVED & changes.keys())} are set by the queue"
            raise ValueError(msg)
        with self._locked():
            lines = _parse(self.rejected_path)
            moving = [i for _, i in lines if i is not None and i["id"] in ids]
            if not moving:
                return []
            now = datetime.now(UTC).isoformat()
            dropped = ("rejected_at", "rejected_reason")
            restored = [
                {**{k: v for k, v in i.items() if k not in dropped}, **(changes or {}), "requeued_at": now}
                for i in moving
            ]
            # Into the queue before out of the rejected file: a crash in between leaves a copy in both files
            # (the replay is idempotent per fact), never in neither.
            _append_durably(self.path, b"".join(_encode(i) for i in restored))
            kept = [raw for raw, i in lines if i is None or i["id"] not in ids]
            replace_atomically(
                self.rejected_path, "".join(line + "\n" for line in kept).encode("utf-8", errors="surrogateescape")
            )
            return restored

    def _rewrite(self, lines: list[str]) -> None:
        replace_atomically(self.path, "".join(line + "\n" for line in lines).encode("utf-8", errors="surrogateescape"))


def replace_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once: a unique temporary file (mode 0600) beside it, fsync'd,
    renamed over it, and the folder fsync'd. A reader sees the old bytes or the new, never a mix."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


# -- recall from the queue -------------------------------------------------------------------------
_WORD = re.compile(r"[^\W_]+")  # letters and digits: "db_a" and "db-a" are both "db" + "a", as in normalise()


def words(text: str) -> set[str]:
    """The tokeniser of buffered recall: case-folded runs of letters and digits."""
    return set(_WORD.findall(text.casefold()))


def rank(query: str, entries: Iterable[tuple[str, str | None, T]], limit: int) -> list[tuple[float, T]]:
    """Buffered facts by word overlap with ``query``: ``entries`` are (fact, topic, anything), oldest first.

    Score: the share of the query's words found in the fact and its topic. Best first, the newest first
    among equals (a later fact more likely describes the current state); no overlap, not returned.
    """
    wanted = words(query)
    if not wanted:
        return []
    scored: list[tuple[float, int, T]] = []
    for position, (fact, topic, value) in enumerate(entries):
        overlap = len(wanted & words(f"{fact} {topic or ''}"))
        if overlap:
            scored.append((overlap / len(wanted), position, value))
    scored.sort(key=lambda s: (-s[0], -s[1]))
    return [(score, value) for score, _, value in scored[: max(0, limit)]]
