"""`serve --workers N` forks its workers from a parent that loaded the models (mcp/forked_workers.py)."""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import signal
from collections.abc import Iterator
from multiprocessing.context import ForkProcess, SpawnProcess
from typing import Any

import pytest
from uvicorn import Config
from uvicorn.supervisors import multiprocess

from haystack_osa_memory.mcp.forked_workers import after_fork, forking_workers, freeze_heap


def _noop(sockets: list[object] | None = None) -> None:
    return None


def test_uvicorn_forks_its_workers_only_while_open() -> None:
    config = Config("haystack_osa_memory.mcp.server:worker_app", factory=True)
    with forking_workers() as forking:
        assert forking
        inside = multiprocess.get_subprocess(config, _noop, [])
    outside = multiprocess.get_subprocess(config, _noop, [])
    assert isinstance(inside, ForkProcess)
    assert isinstance(outside, SpawnProcess)  # uvicorn's own again


def _report_signals(queue: Any, sockets: list[object] | None = None) -> None:
    queue.put((signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)))


def test_a_forked_worker_starts_with_default_signal_handlers() -> None:
    """The supervisor's handlers only queue signals for its own loop: a worker must not inherit them
    (a SIGTERM during its start-up would be swallowed)."""

    def swallow(signum: int, frame: object) -> None:
        return None

    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    config = Config("haystack_osa_memory.mcp.server:worker_app", factory=True, log_config=None)
    previous = {sig: signal.signal(sig, swallow) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with forking_workers():
            worker = multiprocess.get_subprocess(config, functools.partial(_report_signals, queue), [])
        worker.start()  # uvicorn's own start of a worker, with our target instead of its server
        term, hup = queue.get(timeout=30)
        worker.join(30)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert worker.exitcode == 0
    assert (term, hup) == (signal.SIG_DFL, signal.SIG_DFL)


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_freeze_heap_moves_the_live_objects_out_of_the_collectors_reach() -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    freeze_heap()
    assert gc.get_freeze_count() > 1000
    assert sum(gc.get_count()) < 100  # nothing left for the next collection to walk


@pytest.mark.embeddings
def test_after_fork_sizes_the_workers_cpu_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1" if threads != 1 else "2")
    handlers = {sig: signal.getsignal(sig) for sig in multiprocess.SIGNALS}
    try:
        after_fork()
        assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])
    finally:
        torch.set_num_threads(threads)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
