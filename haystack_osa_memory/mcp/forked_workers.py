"""`serve --workers N`: workers forked from a parent that has already loaded what they all need.

uvicorn starts each worker with `spawn`: a fresh interpreter that imports torch, transformers, Haystack
and Hayhooks and loads the embedding models again, so every worker held its own private copy of all of
it (~500 MiB each). Here the `serve` process imports those modules and loads the models once, freezes
its objects out of the garbage collector's reach, and uvicorn forks the workers from it: the pages they
do not write stay shared between all of them (copy-on-write), and a worker, first or replaced, starts
without loading anything.

Nothing a worker must not share is used across the fork: no event loop runs before it, the `serve`
process's own connection pool (its schema check) is never touched by a worker, and each worker builds its
own `MemoryStore` in `worker_app`. The children start with the default signal handlers, not the
supervisor's, and size their own CPU threads.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.mcp.listening import own_socket

logger = logging.getLogger(__name__)

#: Modules every worker imports while it loads the tools: imported once in the parent instead.
SHARED_MODULES = (
    "haystack",
    "hayhooks.server.pipelines.loader",
    "hayhooks.server.utils.mcp_utils",
    "mcp.server.lowlevel",
    "starlette.applications",
    "haystack_osa_memory.memory",
    "haystack_osa_memory.tools",
)


def preload(config: MemoryConfig) -> None:
    """Import the workers' modules and load the embedders' models in this (the parent) process.

    The models run single-threaded here: a CPU thread pool started before a fork is not usable in the
    child (OpenMP's is not fork-safe); each worker sets its own thread count (`after_fork`).

    :raises ConfigurationError: The configured embedder cannot be built (the workers could not either).
    """
    from haystack_osa_memory.embedders import build_embedders

    for name in SHARED_MODULES:
        importlib.import_module(name)
    embedders = [e for e in build_embedders(config) if e is not None]
    if embedders:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for embedder in embedders:
                embedder.warm_up()
        finally:
            torch.set_num_threads(threads)
    freeze_heap()


def freeze_heap() -> None:
    """Move every object alive now out of the cyclic garbage collector's reach (`gc.freeze`).

    Loaded modules and models are a few hundred thousand objects that live as long as the process; a
    full collection would walk them all (tens of milliseconds in the middle of a call), and in a forked
    worker, writing their collector headers would copy the shared pages they sit on.
    """
    gc.collect()
    gc.freeze()


def after_fork() -> None:
    """In a forked worker, before it loads its app: default signal handlers and its own CPU threads."""
    from uvicorn.supervisors.multiprocess import SIGNALS

    # The supervisor's handlers only queue signals for its own loop, which does not run in a worker:
    # a SIGTERM during the worker's start-up would be swallowed. uvicorn installs its own once it serves.
    for sig in SIGNALS:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    use_cpu_threads()


def use_cpu_threads() -> None:
    """Size torch's CPU threads by ``OMP_NUM_THREADS`` (`serve` sets it) when torch is already loaded: it
    may have read the environment before `serve` set it, and a forked child keeps its parent's count. A
    torch loaded later reads the variable itself (so a lexical server does not load torch for this)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _forked_child(started: Callable[..., None], **kwargs: Any) -> None:
    after_fork()
    # A listening socket of its own where the supervisor bound its socket for that (`listening`).
    kwargs["sockets"] = [own_socket(s) for s in kwargs["sockets"]]
    started(**kwargs)


@contextlib.contextmanager
def forking_workers() -> Iterator[bool]:
    """While open, uvicorn's supervisor forks its workers instead of spawning them; yields whether it does.

    uvicorn has no option for it: this replaces the `get_subprocess` its supervisor module calls (checked
    by the tests against the installed uvicorn). Where that is not there, the workers are spawned as
    before, with a warning, and yield False.
    """
    from uvicorn import _subprocess
    from uvicorn.supervisors import multiprocess

    original = getattr(multiprocess, "get_subprocess", None)
    started = getattr(_subprocess, "subprocess_started", None)
    if original is None or started is None or "fork" not in multiprocessing.get_all_start_methods():
        logger.warning("this uvicorn cannot fork its workers: each worker loads the models itself")
        yield False
        return
    fork = multiprocessing.get_context("fork")

    def get_subprocess(config: Any, target: Callable[..., None], sockets: list[Any]) -> Any:
        kwargs = {"config": config, "target": target, "sockets": sockets, "stdin_fileno": None}
        return fork.Process(target=_forked_child, args=(started,), kwargs=kwargs)

    multiprocess.get_subprocess = get_subprocess  # type: ignore[attr-defined]
    try:
        yield True
    finally:
        multiprocess.get_subprocess = original  # type: ignore[attr-defined]
