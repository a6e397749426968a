"""A durable local buffer of facts stored while the database is unreachable.

JSON lines, one item per store, appended with flush + fsync (it survives a crash or restart of the
server); removals rewrite the file atomically (temporary file, fsync, rename). A lock file serialises
processes that share the buffer. Items keep their own scope (org, assignment), so a flush stores each
in the scope it came from, and replays are idempotent thanks to the deterministic document ids.
Items a replay refuses (their token was revoked or expired meanwhile) move to ``<buffer>.rejected``.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class OfflineBuffer:
    """Append, read and pop buffered items.

    Usage:
    ```python
    buf = OfflineBuffer(Path("/tmp/offline.jsonl"))
    buf.append({"org_id": "acme", "assignment_id": "a1", "fact": "..."})
    for item in buf.items(): ...
    buf.pop_first(item["id"])
    ```
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path.with_suffix(self.path.suffix + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        items = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        items.append(json.loads(line))
                    except json.JSONDecodeError:  # a torn last line from a crash mid-append
                        continue
        return items

    def append(self, item: dict[str, Any]) -> int:
        """Append one item durably; returns how many are pending."""
        record = {"id": uuid.uuid4().hex, "queued_at": datetime.now(UTC).isoformat(), **item}
        with self._locked():
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            return len(self._read())

    def items(self) -> list[dict[str, Any]]:
        """Pending items, oldest first."""
        with self._locked():
            return self._read()

    def __len__(self) -> int:
        return len(self.items())

    def pop_first(self, item_id: str) -> None:
        """Remove the oldest item if it is ``item_id`` (atomic rewrite)."""
        with self._locked():
            items = self._read()
            if not items or items[0].get("id") != item_id:
                return
            self._rewrite(items[1:])

    @property
    def rejected_path(self) -> Path:
        """Where refused items are kept aside: ``<buffer>.rejected`` next to the buffer."""
        return self.path.with_name(self.path.name + ".rejected")

    def reject_first(self, item_id: str, reason: str) -> None:
        """Move the oldest item, if it is ``item_id``, to the rejected file with ``reason``.

        Appended there (fsync) before it leaves the buffer: a crash in between leaves a copy in both
        files, never in neither.
        """
        with self._locked():
            items = self._read()
            if not items or items[0].get("id") != item_id:
                return
            record = {**items[0], "rejected_at": datetime.now(UTC).isoformat(), "rejected_reason": reason}
            fd = os.open(self.rejected_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            self._rewrite(items[1:])

    def rejected(self) -> list[dict[str, Any]]:
        """Items refused at replay (kept for an operator), oldest first."""
        with self._locked():
            if not self.rejected_path.exists():
                return []
            with open(self.rejected_path, encoding="utf-8") as f:
                records = []
                for line in f:
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError:  # a torn last line from a crash mid-append
                        continue
                return records

    def _rewrite(self, items: list[dict[str, Any]]) -> None:
        """Replace the file's content with ``items`` atomically (temporary file, fsync, rename)."""
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for item in items:
                os.write(fd, (json.dumps(item, ensure_ascii=False) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
