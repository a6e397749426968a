"""The notebooks in notebooks/ run from a clean kernel, and are committed without outputs.

Each notebook is executed with nbclient in a fresh ipykernel of this interpreter (the venv's python,
whatever kernelspecs are installed elsewhere), with no PG_CONN_STR and no OSA_MEMORY_* settings in
its environment: every notebook starts its own embedded PostgreSQL in a temporary folder and removes
it at the end. The kernel's TMPDIR is a folder of the test's own, so what a notebook leaves behind
(files or processes) can be found, and is a failure.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbclient
import nbformat
import psutil
import pytest
import zmq
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from traitlets import default

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
EXPECTED = ["01_quickstart.ipynb", "02_inside_the_pipelines.ipynb", "03_mcp.ipynb"]
NOTEBOOKS = [NOTEBOOK_DIR / name for name in EXPECTED]
CELL_TIMEOUT = 300
# The budget is "well under 2 minutes each on a 2-core machine"; they take 10-35 s there.
NOTEBOOK_BUDGET = 120
# Settings a developer or the pytest session may have exported; a notebook chooses its own.
DROPPED_PREFIXES = ("PG_CONN_STR", "OSA_MEMORY_", "JPY_", "MPLBACKEND")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class ThisInterpreterKernelManager(AsyncKernelManager):
    """Starts `python3` as ipykernel's built-in spec: ``sys.executable -m ipykernel_launcher``.

    With no kernel folders to search, jupyter_client falls back to ipykernel's own spec, which runs
    the current interpreter; a `python3` kernelspec installed elsewhere (another Python) is ignored.
    """

    @default("kernel_spec_manager")
    def _kernel_spec_manager_default(self) -> KernelSpecManager:
        return KernelSpecManager(kernel_dirs=[])

    @default("transport_encryption")
    def _transport_encryption_default(self) -> str:
        # CurveZMQ keys for the kernel's sockets when pyzmq has them (and no plain-TCP warning from ipykernel).
        return "auto" if zmq.has("curve") else "disabled"


def kernel_env(tmp_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_PREFIXES)}
    env.update(
        {
            "TMPDIR": str(tmp_dir),  # the notebooks' temporary folders land here
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",  # no debugger warning at kernel start
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@pytest.fixture
def kernel_tmp() -> Iterator[Path]:
    """A short temporary folder for the kernel's TMPDIR: the embedded PostgreSQL puts its Unix socket
    under the data folder (or the runtime folder below TMPDIR), and socket paths are limited to ~107
    characters, too few for pytest's tmp_path."""
    path = Path(tempfile.mkdtemp(prefix="nb-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def leftover_processes(tmp_dir: Path) -> list[str]:
    """Live processes started with this test's TMPDIR (the kernel's children inherit it)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if proc.environ().get("TMPDIR") == str(tmp_dir):
                found.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def outputs_of(nb: Any) -> list[dict[str, Any]]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]


def test_the_notebooks_are_all_there() -> None:
    assert sorted(p.name for p in NOTEBOOK_DIR.glob("*.ipynb")) == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [], f"{path.name} cell {index} has outputs: python notebooks/_helpers.py {path}"
        assert cell.execution_count is None, f"{path.name} cell {index} has an execution count"
        assert "execution" not in cell.metadata, f"{path.name} cell {index} has execution timings"


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=[pytest.mark.e2e] if p.name == "03_mcp.ipynb" else []) for p in NOTEBOOKS],
    ids=[p.stem for p in NOTEBOOKS],
)
def test_runs_from_a_clean_kernel(path: Path, kernel_tmp: Path, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        kernel_manager_class=ThisInterpreterKernelManager,
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},  # the kernel's working directory
        allow_errors=False,
        record_timing=False,
    )
    started = time.monotonic()
    try:
        client.execute(env=kernel_env(kernel_tmp))  # raises CellExecutionError (with the traceback) on any error
    finally:
        nbformat.write(nb, tmp_path / f"executed-{path.name}")  # for a look when something failed
    elapsed = time.monotonic() - started
    print(f"{path.name}: {elapsed:.1f} s")
    assert elapsed < NOTEBOOK_BUDGET, f"{path.name} took {elapsed:.0f} s; keep each notebook well under 2 minutes"

    errors = [out for out in outputs_of(nb) if out.get("output_type") == "error"]
    assert errors == []
    assert all(cell.execution_count is not None for cell in nb.cells if cell.cell_type == "code")
    if path.name == "02_inside_the_pipelines.ipynb":
        assert any("image/png" in out.get("data", {}) for out in outputs_of(nb)), "the plot was not rendered"

    # The notebook cleaned up after itself: no temporary folder of its own, no process left running.
    assert sorted(p.name for p in kernel_tmp.glob("osa-memory-*")) == []
    deadline = time.monotonic() + 15
    while (left := leftover_processes(kernel_tmp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"{path.name} left processes running:\n" + "\n".join(left)


def test_kernel_runs_this_interpreter() -> None:
    manager = ThisInterpreterKernelManager(kernel_name="python3")
    assert manager.kernel_spec is not None
    assert manager.kernel_spec.argv[0] == sys.executable
