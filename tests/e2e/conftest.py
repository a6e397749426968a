"""A real `osa-memory serve` process on a free port, and helpers to drive it with the official MCP client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.store.tokens import TokenStore, parse_duration
from tests.conftest import drop_schema, free_port, new_schema_config

T = TypeVar("T")
OSA_MEMORY = [sys.executable, "-m", "haystack_osa_memory.cli"]


def serve_workers(pid: int) -> list[Any]:
    """The worker processes of the `serve` process ``pid``: forked from it, so they run its command line
    (the database guard and PostgreSQL run their own)."""
    import psutil  # type: ignore[import-untyped]

    parent = psutil.Process(pid)
    return [p for p in parent.children() if p.cmdline() == parent.cmdline()]


def env_for(config: MemoryConfig, pg_conn_str: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PG_CONN_STR": pg_conn_str,
            "OSA_MEMORY_KB_SCHEMA": config.kb_schema,
            "OSA_MEMORY_SCHEMA": config.memory_schema,
            "OSA_MEMORY_EMBEDDER": config.embedder,
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def wait_for_status(
    proc: subprocess.Popen[bytes], port: int, log: Path, timeout: float, name: str, path: str = "/status"
) -> None:
    """Until ``http://127.0.0.1:<port><path>`` answers 200; RuntimeError with the process's log when it
    exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log.read_text()}")
        with suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not answer {path} within {timeout:.0f} s:\n{log.read_text()}")


@dataclass
class Server:
    config: MemoryConfig
    pg_conn_str: str
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    #: `serve --workers`; None: the default (one per CPU, at most 4).
    workers: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def env(self) -> dict[str, str]:
        return env_for(self.config, self.pg_conn_str)

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    *OSA_MEMORY,
                    "serve",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                    *(["--workers", str(self.workers)] if self.workers else []),
                ],
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for_status(self.proc, self.port, self.log, 60, "osa-memory serve")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*OSA_MEMORY, *args], env=self.env(), capture_output=True, text=True, timeout=120)

    def token(self, assignment: str, org: str = "acme", *extra: str, via_cli: bool = False) -> dict[str, Any]:
        """A token for ``assignment`` (more with ``"--assignment", "B"``; ``"--expires-in", "2s"``).

        Created in-process (fast) unless ``via_cli``; the CLI path is covered by its own tests.
        """
        if via_cli:
            done = self.cli("token", "create", "--org", org, "--assignment", assignment, "--json", *extra)
            assert done.returncode == 0, done.stderr
            data: dict[str, Any] = json.loads(done.stdout)
            return data
        options = dict(zip(extra[::2], extra[1::2], strict=True))
        extra_assignments = [v for k, v in zip(extra[::2], extra[1::2], strict=True) if k == "--assignment"]
        expires = options.get("--expires-in")
        issued = TokenStore(self.pg_conn_str, self.config).create(
            org_id=org,
            assignment_id=assignment,
            extra_assignments=extra_assignments,
            expires_in=parse_duration(expires) if expires else None,
        )
        return {"token": issued.token, "token_id": issued.token_id, "assignments": list(issued.caller.grants)}


S = TypeVar("S", bound=Server)


@contextmanager
def serving(srv: S) -> Iterator[S]:
    """``srv`` started; stopped and its schema dropped afterwards."""
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        drop_schema(srv.pg_conn_str, srv.config.kb_schema)


@pytest.fixture(scope="module")
def server(pg_conn_str: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = new_schema_config(pg_conn_str)
    ensure_schema(pg_conn_str, config)
    with serving(Server(config, pg_conn_str, tmp_path_factory.mktemp("server") / "server.log")) as srv:
        yield srv


def with_session(url: str, token: str | None, fn: Callable[[ClientSession], Awaitable[T]]) -> T:
    """Run ``fn`` inside an initialised MCP client session (official `mcp` client, streamable HTTP)."""

    async def main() -> T:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            httpx.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(url, http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await fn(session)

    return anyio.run(main)


def call(url: str, token: str, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    """(isError, parsed JSON result or error text) of one tool call."""

    async def run(session: ClientSession) -> tuple[bool, Any]:
        result = await session.call_tool(tool, arguments)
        text = "".join(getattr(c, "text", "") for c in result.content)
        if result.isError:
            return True, text
        return False, json.loads(text)

    return with_session(url, token, run)
