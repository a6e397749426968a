"""Facts `Memory` could not store while the database was unreachable: held, recalled from, replayed.

Held redacted, in the durable queue (`haystack_osa_memory.durable_queue`), one item per fact with its scope and
the token that sent it. Replayed in order by the first call that reaches the database again, each
item only while its token is still active. While the database is down, recall answers from the
caller's own held facts (the queue's ranking, the same one the stdio bridge uses).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from haystack import Document

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.durable_queue import DurableQueue, rank
from haystack_osa_memory.errors import OsaMemoryError, SupersessionError
from haystack_osa_memory.markers import marked_fact

logger = logging.getLogger(__name__)

#: Store one held fact (``Memory._write``); raises `OsaMemoryError` when it cannot.
Write = Callable[[Document, Caller], object]


def in_scope(items: list[dict[str, Any]], caller: Caller) -> list[dict[str, Any]]:
    """Held items of the caller's org and assignment only."""
    return [i for i in items if i.get("org_id") == caller.org_id and i.get("assignment_id") == caller.assignment_id]


class OfflineBuffer:
    """The offline side of one `Memory`: what it holds for each scope, and its replay."""

    def __init__(self, path: Path, dataset: str) -> None:
        self.queue = DurableQueue(path)
        self.dataset = dataset

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

    def replay(self, write: Write, *, is_off: Callable[[Caller], bool], token_active: Callable[[str], bool]) -> int:
        """Store the held facts in order, each in its own scope; stop at the first refusal.

        An item held under a token is stored only if that token is still active now: the server may
        have accepted it from its verification cache during the outage, after the token was revoked.
        Items of a revoked or expired token move to the rejected file next to the buffer (counted by
        `counts`), never into the knowledge base. Items held without a token are stored as before.
        Returns how many were stored.
        """
        # One replay at a time across threads and server processes sharing the buffer.
        claim = self.queue.try_claim() if self.queue.path.exists() else None
        if claim is None:
            return 0
        stored = 0
        try:
            for item in self.queue.items():
                caller = Caller(
                    org_id=item["org_id"],
                    assignment_id=item["assignment_id"],
                    specialist_id=item.get("specialist_id"),
                    token_id=item.get("token_id"),
                )
                try:
                    if caller.token_id is not None and not token_active(caller.token_id):
                        self.queue.reject({item["id"]}, "token revoked or expired before the replay")
                        # Identifiers only: the fact text never goes to the log.
                        logger.warning(
                            "offline buffer: item %s of %s/%s refused at replay: token %s is revoked or expired; "
                            "kept aside in %s, not stored",
                            item["id"],
                            caller.org_id,
                            caller.assignment_id,
                            caller.token_id,
                            self.queue.rejected_path,
                        )
                        continue
                    if is_off(caller):
                        logger.warning(
                            "offline buffer: memory is off for %s; %d items kept",
                            caller.assignment_id,
                            len(self.queue.items()),
                        )
                        break
                    write(Document(content=item["fact"], meta=item.get("meta") or {}), caller)
                except SupersessionError as e:
                    # What it supersedes changed during the outage: kept aside, so it cannot block the rest.
                    self.queue.reject({item["id"]}, f"refused at replay: {e}")
                    logger.warning("offline buffer: item %s refused at replay and kept aside: %s", item["id"], e)
                    continue
                except OsaMemoryError as e:
                    logger.warning("offline buffer: flush stopped at item %s: %s", item["id"], e)
                    break
                self.queue.remove({item["id"]})
                stored += 1
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
