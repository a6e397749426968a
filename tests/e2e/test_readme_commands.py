"""The README's first command (`bash scripts/serve.sh`) gives a working MCP memory server on the
embedded default; the CLI commands the docs show answer as documented."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port
from tests.e2e.conftest import call, wait_for_status
from tests.e2e.test_offline_buffer import stop_pg

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]


def test_serve_script_runs_a_working_server_on_the_embedded_default(tmp_path: Path) -> None:
    port = free_port()
    short = Path(f"/tmp/osa-serve-{os.getpid()}")  # the embedded server's socket path must stay short
    env = {k: v for k, v in os.environ.items() if k != "PG_CONN_STR" and not k.startswith("OSA_MEMORY_")}
    env.update({"PORT": str(port), "OSA_MEMORY_DATA_DIR": str(short), "OSA_MEMORY_EMBEDDER": "none"})
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "scripts/serve.sh"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_status(proc, port, log, 600, "scripts/serve.sh")
        printed = log.read_text()
        token = re.search(r"osam_[0-9a-f]{16}_[A-Za-z0-9_-]{43}", printed)
        assert token, printed
        config = json.loads(printed[printed.index('{"mcpServers"') : printed.index("}}}}") + 4].replace("\n", ""))
        assert config["mcpServers"]["osa-memory"]["url"] == f"http://127.0.0.1:{port}/mcp"
        url = f"http://127.0.0.1:{port}/mcp"
        assert not call(url, token.group(0), "kb_memory_store", {"fact": "The README's first command works"})[0]
        _, recalled = call(url, token.group(0), "kb_memory_recall", {"query": "README first command"})
        assert recalled["facts"][0]["content"] == "The README's first command works"
        assert (short / "pgdata" / "PG_VERSION").exists()  # data lives in the embedded default
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        if (short / "pgdata" / "postmaster.pid").exists():
            stop_pg(short / "pgdata", check=False)
        subprocess.run(["rm", "-rf", str(short)], check=False)
