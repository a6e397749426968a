"""`CallSlots` (mcp/call_slots.py): at most ``slots`` calls run in worker threads at once, in their order of
arrival; a call still running after its lease gives its slot to the next; a failing call gives its slot back;
``slots=0`` limits nothing; bad values are refused. Real threads and a real event loop throughout."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from haystack_osa_memory.mcp.call_slots import CallSlots


class Recorder:
    """Blocking work that records how many of its calls run at once, and the order they started in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.started: list[int] = []

    def work(self, n: int, seconds: float) -> int:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.started.append(n)
        time.sleep(seconds)
        with self.lock:
            self.running -= 1
        return n


async def _calls(slots: CallSlots, recorder: Recorder, seconds: list[float]) -> list[int]:
    tasks = []
    for n, s in enumerate(seconds):
        tasks.append(asyncio.create_task(slots.run(recorder.work, n, s)))
        await asyncio.sleep(0)  # each call reaches the slots before the next one is made
    return list(await asyncio.gather(*tasks))


def test_at_most_the_slots_run_at_once_in_their_order_of_arrival() -> None:
    recorder = Recorder()
    slots = CallSlots(2, lease=30.0)
    assert asyncio.run(_calls(slots, recorder, [0.05] * 8)) == list(range(8))
    assert recorder.most == 2
    # Slots go out in the calls' order of arrival; two calls given theirs at the same moment may reach their
    # threads in either order, no more.
    assert all(abs(place - n) <= 1 for place, n in enumerate(recorder.started)), recorder.started
    assert sorted(recorder.started) == list(range(8))
    assert slots.expired == 0


def test_without_slots_every_call_runs_at_once() -> None:
    recorder = Recorder()
    asyncio.run(_calls(CallSlots(0, lease=30.0), recorder, [0.1] * 6))
    assert recorder.most == 6


def test_a_call_past_its_lease_gives_its_slot_to_the_next() -> None:
    recorder = Recorder()
    slots = CallSlots(1, lease=0.05)

    async def slow_then_fast() -> float:
        slow = asyncio.create_task(slots.run(recorder.work, 0, 1.0))
        await asyncio.sleep(0.01)  # the slow call holds the one slot
        began = time.monotonic()
        await slots.run(recorder.work, 1, 0.0)
        waited = time.monotonic() - began
        await slow
        return waited

    waited = asyncio.run(slow_then_fast())
    assert waited < 0.5  # about the lease, not the slow call's whole second
    assert recorder.most == 2  # the slow call ran on beside it
    assert slots.expired == 1


def test_a_failing_call_gives_its_slot_back() -> None:
    slots = CallSlots(1, lease=30.0)

    def fail() -> None:
        raise RuntimeError("boom")

    async def run() -> int:
        with pytest.raises(RuntimeError, match="boom"):
            await slots.run(fail)
        return await asyncio.wait_for(slots.run(lambda: 7), timeout=5)  # the slot is free again

    assert asyncio.run(run()) == 7


def test_the_caller_context_reaches_the_thread() -> None:
    import contextvars

    seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="none")

    async def run() -> str:
        seen.set("alice")
        return await CallSlots(2, lease=30.0).run(seen.get)

    assert asyncio.run(run()) == "alice"


def test_slots_serve_one_event_loop_after_another() -> None:
    """An app served by one loop, then by another (a test client's portal), keeps limiting on each."""
    slots = CallSlots(1, lease=30.0)
    for _ in range(2):
        recorder = Recorder()
        asyncio.run(_calls(slots, recorder, [0.02] * 3))
        assert recorder.most == 1


@pytest.mark.parametrize(("slots", "lease", "why"), [(-1, 1.0, "slots must be 0"), (2, 0.0, "lease must be")])
def test_bad_values_are_refused(slots: int, lease: float, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        CallSlots(slots, lease)
