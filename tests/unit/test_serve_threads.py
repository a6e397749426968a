"""`serve` runs torch with one CPU thread per serving process unless `OMP_NUM_THREADS` says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from haystack_osa_memory.cli.serve import _export_for_tools
from haystack_osa_memory.config import MemoryConfig

pytestmark = pytest.mark.embeddings


@pytest.fixture
def torch_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """torch with two CPU threads (what it takes on a 2-CPU machine), restored afterwards."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    for name in ("OMP_NUM_THREADS", "OSA_MEMORY_DATA_DIR", "PG_CONN_STR"):
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(2)
    try:
        yield torch
    finally:
        torch.set_num_threads(before)


def _export(processes: int) -> None:
    config = MemoryConfig(pg_conn_str="postgresql://127.0.0.1:1/none")
    _export_for_tools(config, None, "postgresql://127.0.0.1:1/none", None, processes)


def test_one_serving_process_gets_one_torch_thread(torch_threads: Any) -> None:
    _export(1)
    assert os.environ["OMP_NUM_THREADS"] == "1"
    assert torch_threads.get_num_threads() == 1


def test_workers_are_told_one_thread_each(torch_threads: Any) -> None:
    _export(2)
    assert os.environ["OMP_NUM_THREADS"] == "1"  # each worker applies it after its fork (`after_fork`)


def test_a_thread_count_the_operator_set_is_kept(torch_threads: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch_threads.set_num_threads(1)
    _export(1)
    assert os.environ["OMP_NUM_THREADS"] == "2"
    assert torch_threads.get_num_threads() == 2


@pytest.mark.slow
def test_threads_are_not_a_reason_to_load_torch() -> None:
    # A lexical server need not load torch: torch reads OMP_NUM_THREADS itself when something loads it.
    code = (
        "import sys\n"
        "from haystack_osa_memory.mcp.forked_workers import use_cpu_threads\n"
        "assert 'torch' not in sys.modules\n"
        "use_cpu_threads()\n"
        "print('torch' in sys.modules)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
