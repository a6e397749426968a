"""An independent MCP client: the MCP Inspector CLI from the npm registry, listing and calling our tools."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.e2e.conftest import Server

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


def inspector(server: Server, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    npx = shutil.which("npx")
    assert npx, "npx (Node.js) is needed for the MCP Inspector CLI; scripts/setup.sh documents it"
    return subprocess.run(
        [
            npx,
            "-y",
            INSPECTOR,
            "--cli",
            server.url,
            "--transport",
            "http",
            "--header",
            f"Authorization: Bearer {token}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_inspector_lists_and_calls_the_tools(server: Server) -> None:
    token = server.token("asg-inspector")["token"]
    listed = inspector(server, token, "--method", "tools/list")
    assert listed.returncode == 0, listed.stderr
    names = {t["name"] for t in json.loads(listed.stdout)["tools"]}
    assert {"kb_memory_store", "kb_memory_recall"} <= names
    assert "deploy_pipeline" not in names
    stored = inspector(
        server,
        token,
        "--method",
        "tools/call",
        "--tool-name",
        "kb_memory_store",
        "--tool-arg",
        "fact=The inspector was here",
        "--tool-arg",
        "topic=clients",
    )
    assert stored.returncode == 0, stored.stderr
    assert json.loads(json.loads(stored.stdout)["content"][0]["text"])["stored"] is True
    recalled = inspector(
        server, token, "--method", "tools/call", "--tool-name", "kb_memory_recall", "--tool-arg", "query=inspector"
    )
    assert recalled.returncode == 0, recalled.stderr
    facts = json.loads(json.loads(recalled.stdout)["content"][0]["text"])["facts"]
    assert [f["content"] for f in facts] == ["The inspector was here"]
    refused = inspector(
        server, token, "--method", "tools/call", "--tool-name", "deploy_pipeline", "--tool-arg", "name=x"
    )
    assert refused.returncode == 5  # the Inspector's exit code for a tool answering isError
