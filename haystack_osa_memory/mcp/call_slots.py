"""How many of a serving process's calls run their Python at once (`CallSlots`).

Each MCP call hands two pieces of blocking work to a worker thread: its token check and its tool run. With
one interpreter lock per process, threads beyond a couple only take turns: at 32 connections a worker had
~16 calls in threads, each pass of the lock between them costing CPU, so every call cost more and the
process answered fewer (benchmarks/README.md, "Call slots"). `CallSlots` lets a few of them run at once
and queues the rest on the event loop, where waiting costs nothing, in their order of arrival.

A plain limit would let one slow call (a remote supersession judge inside a store, a first recall on a big
scope, a slow database) hold up every call queued behind it. So a slot is a **lease**: a call still running
after ``lease`` seconds gives its slot to the next call and runs on beside it, uncounted. A slow call
delays the others by at most the lease; when every call is slow (a slow database), calls run as they did
without slots, up to anyio's thread limit.

Usage:
```python
slots = CallSlots(slots=2, lease=0.05)
caller = await slots.run(verify, token)            # in place of anyio.to_thread.run_sync(verify, token)
```
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import anyio.to_thread

if TYPE_CHECKING:
    from haystack_osa_memory.config import MemoryConfig

T = TypeVar("T")


class CallSlots:
    """At most ``slots`` calls of this process in worker threads at once, each slot held for at most
    ``lease`` seconds; ``slots=0``: no limit (each call goes to a thread at once).

    :raises ValueError: ``slots`` is negative or ``lease`` not positive.
    """

    def __init__(self, slots: int, lease: float) -> None:
        if slots < 0:
            msg = f"slots must be 0 (no limit) or more, got {slots}"
            raise ValueError(msg)
        if not lease > 0:
            msg = f"lease must be a positive number of seconds, got {lease}"
            raise ValueError(msg)
        self.slots = slots
        self.lease = lease
        # Made on first use, for the event loop it is used on (an asyncio primitive belongs to one loop; an app
        # served by one loop after another, as a test client does, gets slots of its own on each).
        self._free: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Calls that outlived their lease and gave their slot up.
        self.expired = 0

    @classmethod
    def from_config(cls, config: MemoryConfig) -> CallSlots:
        """The slots a configuration asks for (`OSA_MEMORY_CALL_SLOTS`, `OSA_MEMORY_CALL_LEASE`)."""
        return cls(config.call_slots, config.call_lease)

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in a worker thread (`anyio.to_thread.run_sync`), once a slot is free."""
        if not self.slots:
            return await anyio.to_thread.run_sync(fn, *args)
        loop = asyncio.get_running_loop()
        if self._free is None or self._loop is not loop:
            self._free, self._loop = asyncio.Semaphore(self.slots), loop
        free = self._free
        await free.acquire()
        held = True

        def give_back() -> None:
            nonlocal held
            if held:
                held = False
                free.release()

        def expire() -> None:
            if held:
                self.expired += 1
            give_back()

        timer = loop.call_later(self.lease, expire)
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        finally:
            timer.cancel()
            give_back()
