"""Facts `Memory` could not store while the database was unreachable: held, recalled from, replayed.

Held redacted, in the durable queue (`haystack_osa_memory.durable_queue`), one item per fact with its scope and
the token that sent it. Replayed by the first call that reaches the database again, each scope's items in
order, each item only while its token is still active and its scope switched on. While the database is
down, recall answers from the caller's own held facts (the queue's ranking, the same one the stdio bridge
uses), and a scope last seen switched off is refused at once (`SwitchStates`): nothing is held that the
replay would refuse.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from haystack import Document

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.durable_queue import DurableQueue, rank
from haystack_osa_memory.errors import DatabaseError, OsaMemoryError, SupersessionError
from haystack_osa_memory.markers import marked_fact
from haystack_osa_memory.store.database import classify

logger = logging.getLogger(__name__)

#: Store one held fact (``Memory._write``); raises `OsaMemoryError` when it cannot.
Write = Callable[[Document, Caller], object]

#: The reason of an item set aside because its token is revoked or expired (`osa-memory queue retry`
#: asks the operator to vouch for such an item).
TOKEN_GONE = "token revoked or expired before the replay"  # noqa: S105 - a reason, not a secret
#: Seconds between two reads of every kill switch while the database answers: a scope switched off by
#: another process, and not called here since, is still known to be off when the database goes away.
SWITCH_LIST_S = 5.0
#: After a replay that kept items (their scope is off, or their write failed for now), the next replay
#: waits this long unless the buffer changed: every call would otherwise re-check the same items.
KEPT_RETRY_S = 2.0

Scope = tuple[str, str]


def in_scope(items: list[dict[str, Any]], caller: Caller) -> list[dict[str, Any]]:
    """Held items of the caller's org and assignment only."""
    return [i for i in items if i.get("org_id") == caller.org_id and i.get("assignment_id") == caller.assignment_id]


def _matches(switch: Scope, scope: Scope) -> bool:
    return switch[0] in (scope[0], "*") and switch[1] in (scope[1], "*")


class SwitchStates:
    """The last known kill-switch state of each scope, kept to answer while the database is unreachable.

    Two sources, the newer wins for a scope: the answer of the last switch check made for that scope, and
    the list of every switch that is off (read at most every `SWITCH_LIST_S` seconds while the database
    answers). A scope neither source saw off counts as on: it keeps buffering, and the replay checks it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[Scope, tuple[bool, float]] = {}
        self._off: tuple[Scope, ...] = ()
        self._listed_at = float("-inf")

    def note(self, caller: Caller, off: bool) -> None:
        """What a switch check just answered for ``caller``'s scope."""
        with self._lock:
            self._answers[(caller.org_id, caller.assignment_id)] = (off, time.monotonic())

    def list_due(self) -> bool:
        return time.monotonic() - self._listed_at >= SWITCH_LIST_S

    def note_all(self, off: Iterable[Scope]) -> None:
        """Every switch that is off now (org, assignment; ``*`` for all); older answers are superseded."""
        now = time.monotonic()
        with self._lock:
            self._off = tuple(off)
            self._listed_at = now
            self._answers.clear()

    def known_off(self, caller: Caller) -> bool:
        scope = (caller.org_id, caller.assignment_id)
        with self._lock:
            answer = self._answers.get(scope)
            if answer is not None and answer[1] >= self._listed_at:
                return answer[0]
            return any(_matches(switch, scope) for switch in self._off)


class OfflineBuffer:
    """The offline side of one `Memory`: what it holds for each scope, its replay, and the switch states
    it refuses by while the database is unreachable."""

    def __init__(self, path: Path, dataset: str) -> None:
        self.queue = DurableQueue(path)
        self.dataset = dataset
        self.switches = SwitchStates()
        # (size, mtime) of the buffer after a replay that kept items, and when to try them again.
        self._kept: tuple[tuple[int, int], float] | None = None

    def _document_id(self, text: str, caller: Caller) -> str:
        return marked_fact(text, caller.org_id, caller.assignment_id, self.dataset).document_id

    def hold(
        self, text: str, meta: dict[str, Any], caller: Caller, *, redactions: int, error: BaseException
    ) -> dict[str, Any]:
        """Keep an (already redacted) fact until the database answers; the answer `kb_memory_store` gives."""
        _, pending = self.queue.append(
            {
                "org_id": caller.org_id,
                "assignment_id": caller.assignment_id,
                "specialist_id": caller.specialist_id,
                "token_id": caller.token_id,
                "fact": text,
                "meta": meta,
            }
        )
        logger.warning("database unreachable (%s); fact queued in the offline buffer (%d pending)", error, len(pending))
        # The caller sees neither the connection error (socket path, host) nor other scopes' items.
        return {
            "stored": False,
            "queued": True,
            "reason": "the database is unreachable; the fact waits in the local buffer "
            "and is stored when the database answers again",
            "pending": len(in_scope(pending, caller)),
            "redactions": redactions,
            "assignment_id": caller.assignment_id,
            "document_id": self._document_id(text, caller),
        }

    def _signature(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.queue.path)
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime_ns

    def replay(self, write: Write, *, is_off: Callable[[Caller], bool], token_active: Callable[[str], bool]) -> int:
        """Store the held facts, each in its own scope, never blocked by one item or one scope.

        - An item held under a token is stored only if that token is still active now: the server may have
          accepted it from its verification cache during the outage, after the token was revoked. Items of
          a revoked or expired token move to the rejected file next to the buffer with their reason
          (`TOKEN_GONE`), never into the knowledge base. Items held without a token are stored as before.
        - An item whose scope is switched off now is kept, with the scope's later items (their order
          holds), and stored by a replay after the switch is back on; other scopes go on.
        - A write refused for good (say, what it supersedes changed during the outage) moves the item to
          the rejected file with the refusal; a write failing for now (a statement timeout) keeps it and
          the scope's later items for the next replay.
        - The database going away again ends the replay; everything not stored stays held.

        Returns how many were stored.
        """
        signature = self._signature()
        if signature is None:
            return 0
        if self._kept is not None and self._kept[0] == signature and time.monotonic() < self._kept[1]:
            return 0
        # One replay at a time across threads and server processes sharing the buffer.
        claim = self.queue.try_claim()
        if claim is None:
            return 0
        stored = 0
        kept: dict[Scope, int] = {}  # scope -> items kept this replay
        off: dict[Scope, bool] = {}
        active: dict[str, bool] = {}
        try:
            for item in self.queue.items():
                caller = Caller(
                    org_id=item["org_id"],
                    assignment_id=item["assignment_id"],
                    specialist_id=item.get("specialist_id"),
                    token_id=item.get("token_id"),
                )
                scope = (caller.org_id, caller.assignment_id)
                try:
                    if caller.token_id is not None:
                        if caller.token_id not in active:
                            active[caller.token_id] = token_active(caller.token_id)
                        if not active[caller.token_id]:
                            self.queue.reject({item["id"]}, TOKEN_GONE)
                            # Identifiers only: the fact text never goes to the log.
                            logger.warning(
                                "offline buffer: item %s of %s/%s refused at replay: token %s is revoked or "
                                "expired; kept aside in %s, not stored",
                                item["id"],
                                caller.org_id,
                                caller.assignment_id,
                                caller.token_id,
                                self.queue.rejected_path,
                            )
                            continue
                    if scope in kept:  # an earlier item of this scope waits: so does this one
                        kept[scope] += 1
                        continue
                    if scope not in off:
                        off[scope] = is_off(caller)
                        self.switches.note(caller, off[scope])
                    if off[scope]:
                        kept[scope] = 1
                        continue
                    write(Document(content=item["fact"], meta=item.get("meta") or {}), caller)
                except SupersessionError as e:
                    # What it supersedes changed during the outage: kept aside, so it cannot block the rest.
                    self.queue.reject({item["id"]}, f"refused at replay: {e}")
                    logger.warning("offline buffer: item %s refused at replay and kept aside: %s", item["id"], e)
                    continue
                except DatabaseError as e:
                    if classify(e) == "unreachable":
                        logger.warning("offline buffer: the database went away again at item %s: %s", item["id"], e)
                        break
                    kept[scope] = kept.get(scope, 0) + 1
                    logger.warning(
                        "offline buffer: item %s of %s/%s kept for a later replay: %s", item["id"], *scope, e
                    )
                    continue
                except OsaMemoryError as e:
                    self.queue.reject({item["id"]}, f"refused at replay: {e}")
                    logger.warning("offline buffer: item %s refused at replay and kept aside: %s", item["id"], e)
                    continue
                self.queue.remove({item["id"]})
                stored += 1
            for (org_id, assignment_id), count in kept.items():
                reason = "memory is off for it" if off.get((org_id, assignment_id)) else "its write failed for now"
                logger.warning(
                    "offline buffer: %d items of %s/%s kept for a later replay: %s",
                    count,
                    org_id,
                    assignment_id,
                    reason,
                )
            after = self._signature()
            self._kept = (after, time.monotonic() + KEPT_RETRY_S) if kept and after is not None else None
        finally:
            claim.release()
        if stored:
            logger.info("offline buffer: stored %d buffered facts", stored)
        return stored

    def recall(self, query: str, limit: int, caller: Caller) -> dict[str, Any]:
        """Degraded recall over the caller's own held facts: `buffer.rank`, as the stdio bridge does."""
        mine = in_scope(self.queue.items(), caller)
        scored = rank(query, [(i["fact"], (i.get("meta") or {}).get("topic"), i) for i in mine], limit)
        facts = [
            {
                "document_id": self._document_id(item["fact"], caller),
                "content": item["fact"],
                "topic": (item.get("meta") or {}).get("topic"),
                "score": round(score, 6),
                "stored_at": item.get("queued_at"),
                "kind": (item.get("meta") or {}).get("kind", "fact"),
                "stale": False,
            }
            for score, item in scored
        ]
        return {
            "assignment_id": caller.assignment_id,
            "facts": facts,
            # Not the connection error itself: it names the socket path or host (logged instead).
            "degraded": f"the database is unreachable; answered from {len(mine)} buffered facts "
            "of this assignment only",
        }

    def counts(self, caller: Caller | None = None) -> tuple[int, int]:
        """(pending, rejected) items: of ``caller``'s scope, or of every scope."""
        pending = self.queue.items() if self.queue.path.exists() else []
        rejected = self.queue.rejected() if self.queue.rejected_path.exists() else []
        if caller is not None:
            pending, rejected = in_scope(pending, caller), in_scope(rejected, caller)
        return len(pending), len(rejected)
