"""The MCP host: Hayhooks' MCP server over our pipelines, locked down behind bearer-token auth.

What differs from `hayhooks mcp run` (see docs/security.md):
- only the tools of our pipeline folders are listed and callable: Hayhooks' core tools
  (`deploy_pipeline`, `undeploy_pipeline`, status tools) and any other name are refused;
- tool arguments are validated against each tool's schema, unknown arguments refused;
- every request to `/mcp` needs `Authorization: Bearer <token>`; the token's scope is put in a
  context variable that the tools read (never a tool argument);
- only streamable HTTP at `/mcp` (and an anonymous `/status`) is served: the SSE transport, whose
  later messages would run under the stream opener's identity, is not exposed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from haystack_osa_memory.caller import Caller, caller_scope
from haystack_osa_memory.errors import AuthenticationError, DatabaseError, InvalidInputError, OsaMemoryError
from haystack_osa_memory.store.database import classify
from haystack_osa_memory.validation import check_text

logger = logging.getLogger(__name__)

Verifier = Callable[[str], Caller]


def default_pipelines_dir() -> Path:
    """The packaged pipeline wrappers, or the repository's `pipelines/` in a source checkout."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "_pipelines"
    return packaged if packaged.is_dir() else package.parent / "pipelines"


async def _respond(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] = []) -> None:  # noqa: B006
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


#: Anything shaped like one of our tokens (masked in every log line, wherever it came from).
_TOKEN_SHAPED = re.compile(r"osam_[0-9a-f]{16}_[A-Za-z0-9_-]+")
#: Debug dumps of whole MCP messages (their arguments hold fact text): dropped.
_MESSAGE_DUMPS = ("Message that failed validation", "Received message")
_VALIDATION_FAILED = "Failed to validate request"


class LogScrubber(logging.Filter):
    """Keeps bearer tokens and fact text out of the server's log.

    - uvicorn's access log shows the path without its query string (a token put in ``?token=`` by
      mistake would otherwise be written in clear);
    - the MCP SDK's "Failed to validate request" warning quotes the request's arguments (pydantic's
      message includes the input): it is logged without its details, and the SDK's debug dumps of
      whole messages are dropped;
    - anything shaped like a token is masked in any record that reaches our handlers.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.access":
            # Its formatter unpacks the five args (client, method, path, version, status): keep the shape.
            if isinstance(record.args, tuple) and len(record.args) >= 3 and isinstance(record.args[2], str):
                path = _TOKEN_SHAPED.sub("osam_***", record.args[2].split("?", 1)[0])
                record.args = (*record.args[:2], path, *record.args[3:])
            return True
        if isinstance(record.msg, str):
            if record.msg.startswith(_MESSAGE_DUMPS):
                return False
            if record.msg.startswith(_VALIDATION_FAILED):
                record.msg = f"{_VALIDATION_FAILED} (details not logged: they may quote the tool arguments)"
                record.args, record.exc_info, record.exc_text = None, None, None
        message = record.getMessage()
        if _TOKEN_SHAPED.search(message):
            record.msg, record.args = _TOKEN_SHAPED.sub("osam_***", message), None
        return True


def install_log_scrubbing() -> LogScrubber:
    """Put a :class:`LogScrubber` on every handler that serves the server's log.

    Call it after uvicorn configured its loggers (``uvicorn.Config(...)``). The root logger gets a
    stderr handler if it has none: the MCP SDK logs through ``logging.warning(...)``, which would
    otherwise add an unfiltered one by itself (``basicConfig``).
    """
    scrubber = LogScrubber()
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
        root.addHandler(handler)
    # Handler filters see every record that reaches them (the mcp loggers propagate to the root's);
    # logger filters also cover a handler added later by someone else.
    for name in ("", "uvicorn", "uvicorn.access"):
        logger_ = logging.getLogger(name)
        logger_.addFilter(scrubber)
        for handler_ in logger_.handlers:
            handler_.addFilter(scrubber)
    return scrubber


def exit_on_sigterm() -> None:
    """Make SIGTERM a normal exit (``SystemExit(143)``) in the main thread.

    Python's default SIGTERM action ends the process without running ``finally`` blocks or atexit, so
    the embedded PostgreSQL it started would keep running with this pid still in its handle list.
    uvicorn captures SIGTERM while it serves, shuts down gracefully, restores this handler and raises
    the signal again, which lands here. A second SIGTERM is ignored so it cannot cut the cleanup short
    (``pg_ctl stop`` is itself bounded).
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


class CachingVerifier:
    """Verify tokens against the database; while it is unreachable, accept a token verified within
    ``grace_seconds`` (so agents can keep storing into the offline buffer). Wrong, expired or revoked
    tokens are never accepted from the cache: a refusal evicts the token.
    """

    def __init__(self, verify: Verifier, grace_seconds: float) -> None:
        self.verify = verify
        self.grace_seconds = grace_seconds
        self._cache: dict[str, tuple[Caller, float]] = {}

    def __call__(self, token: str) -> Caller:
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        try:
            caller = self.verify(token)
        except AuthenticationError:
            self._cache.pop(key, None)
            raise
        except DatabaseError as e:
            hit = self._cache.get(key)
            if hit is not None and classify(e) == "unreachable" and time.monotonic() - hit[1] <= self.grace_seconds:
                logger.warning("database unreachable: accepting a token verified %.0f s ago", time.monotonic() - hit[1])
                return hit[0]
            raise
        self._cache[key] = (caller, time.monotonic())
        return caller


class BearerAuthMiddleware:
    """Pure ASGI middleware: verify the bearer token, run the request as its caller, or answer 401."""

    def __init__(self, app: ASGIApp, verify: Verifier) -> None:
        self.app = app
        self.verify = verify

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope.get("path", "")
        if path == "/status":
            await self.app(scope, receive, send)
            return
        if path not in ("/mcp", "/mcp/"):
            await _respond(send, 404, {"error": "not found: the MCP endpoint is /mcp"})
            return
        headers = dict(scope.get("headers") or [])
        raw = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = raw.partition(" ")
        challenge = [(b"www-authenticate", b'Bearer realm="osa-memory"')]
        if scheme.lower() != "bearer" or not token.strip():
            await _respond(
                send, 401, {"error": "missing bearer token: send 'Authorization: Bearer <token>'"}, challenge
            )
            return
        try:
            caller = await anyio.to_thread.run_sync(self.verify, token.strip())
        except AuthenticationError as e:
            await _respond(send, 401, {"error": str(e)}, challenge)
            return
        except DatabaseError as e:
            logger.warning("token verification failed: %s", e)
            await _respond(send, 503, {"error": "the memory database is unavailable; retry later"})
            return
        if path == "/mcp":
            # Serve /mcp itself instead of Starlette's 307 redirect to the /mcp/ mount.
            scope = {**scope, "path": "/mcp/", "raw_path": b"/mcp/"}
        with caller_scope(caller):
            await self.app(scope, receive, send)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("haystack-osa-memory")
    except PackageNotFoundError:
        return "0"


def _lock_down(server: Any, registry: Any) -> list[str]:
    """Replace Hayhooks' list/call handlers so that only our pipeline tools exist.

    A tool declared in `tools.SPECS` also publishes its result model as `outputSchema`, and its results
    carry `structuredContent` (MCP 2025-06-18) beside the same JSON as text, for clients that predate it.
    """
    from hayhooks.server.utils.mcp_utils import run_pipeline_as_tool
    from mcp.types import CallToolResult, TextContent, Tool
    from pydantic import ValidationError

    from haystack_osa_memory.mcp.telemetry import instrument_tool_call
    from haystack_osa_memory.tools import SPECS

    tools: dict[str, Tool] = {}
    models: dict[str, Any] = {}
    results: dict[str, Any] = {}
    for name in registry.get_names():
        metadata = registry.get_metadata(name) or {}
        model = metadata.get("request_model")
        if model is None:
            continue
        schema = model.model_json_schema()
        schema["additionalProperties"] = False
        spec = SPECS.get(name)
        output = spec.Result.model_json_schema() if spec is not None else None
        tools[name] = Tool(
            name=name, description=metadata.get("description", ""), inputSchema=schema, outputSchema=output
        )
        models[name] = model
        if spec is not None:
            results[name] = spec.Result

    @server.list_tools()  # type: ignore[untyped-decorator]
    async def list_tools() -> list[Tool]:
        return list(tools.values())

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    @instrument_tool_call(tools)  # one span and one latency observation per call (mcp/telemetry.py)
    async def call_tool(name: str, arguments: dict[str, Any] | None) -> list[TextContent] | CallToolResult:
        if name not in tools:
            msg = f"Unknown tool '{name}'. Available tools: {sorted(tools)}"
            raise InvalidInputError(msg)
        arguments = arguments or {}
        allowed = set(tools[name].inputSchema.get("properties", {}))
        unknown = sorted(set(arguments) - allowed)
        if unknown:
            msg = f"unknown argument(s) {unknown} for {name}; allowed: {sorted(allowed)}"
            raise InvalidInputError(msg)
        for key, value in arguments.items():
            if isinstance(value, str):
                check_text(value, key, min_len=0, max_len=len(value))
        try:
            models[name].model_validate(arguments)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            msg = f"invalid arguments for {name}: {problems}"
            raise InvalidInputError(msg) from None
        try:
            result: list[TextContent] = await run_pipeline_as_tool(registry, name, arguments)
        except OsaMemoryError:
            raise
        except Exception as e:
            logger.exception("tool %s failed", name)
            msg = f"{name} failed with an internal error ({type(e).__name__}); see the server log"
            raise RuntimeError(msg) from None
        if name not in results:
            return result
        # Hayhooks sent the tool's dict as JSON text: the same object is the structured content. It is
        # checked against the tool's result model here, once compiled, and answered as a finished
        # result: the MCP SDK would otherwise rebuild a JSON-schema validator on every call (3.8 ms for
        # a recall of 8 facts, more than the recall itself).
        try:
            structured = json.loads(result[0].text) if len(result) == 1 else None
            if not isinstance(structured, dict):
                raise ValueError("not a JSON object")
            results[name].model_validate(structured)
        except ValueError as e:
            logger.error("tool %s returned a result outside its outputSchema: %s", name, type(e).__name__)
            msg = f"{name} failed with an internal error (result outside its outputSchema); see the server log"
            raise RuntimeError(msg) from None
        return CallToolResult(content=list(result), structuredContent=structured)

    return sorted(tools)


#: Set by `osa-memory serve --workers N` for its worker processes: the pipelines folder they serve.
PIPELINES_DIR_ENV = "OSA_MEMORY_PIPELINES_DIR"


def default_workers() -> int:
    """Worker processes of `osa-memory serve` when not given: one per CPU, at most 4.

    One process serialises every call on its interpreter lock; beyond the CPU count, workers only add
    memory (each holds its own embedder) and connections.
    """
    return max(1, min(os.cpu_count() or 1, 4))


def worker_app() -> ASGIApp:
    """The app of one `osa-memory serve --workers N` worker process (a uvicorn app factory).

    The parent has already reached the database (starting the embedded one, whose URI it exported as
    ``PG_CONN_STR``) and checked the schema; a worker reads the same settings from the environment.
    A worker whose tools cannot be loaded exits with uvicorn's startup-failure status, which stops
    the parent instead of restarting the worker forever.
    """
    from haystack_osa_memory.config import MemoryConfig
    from haystack_osa_memory.store.database import resolve_connection_string
    from haystack_osa_memory.store.tokens import TokenStore

    try:
        config = MemoryConfig.from_env()
        tokens = TokenStore(resolve_connection_string(config), config)
        pipelines = os.environ.get(PIPELINES_DIR_ENV)
        app = create_app(CachingVerifier(tokens.verify, config.offline_grace), Path(pipelines) if pipelines else None)
    except Exception as e:
        logger.error("the MCP tools could not be loaded: %s: %s", type(e).__name__, e)
        raise SystemExit(3) from None  # uvicorn's STARTUP_FAILURE
    install_log_scrubbing()  # uvicorn configured this worker's loggers before loading the app
    return app


def create_app(verify: Verifier, pipelines_dir: Path | None = None) -> ASGIApp:
    """The ASGI app: locked-down Hayhooks MCP server behind bearer auth.

    The pipelines' `setup()` runs here (database connection, schema, embedders).
    """
    from hayhooks.server.pipelines.loader import load_pipeline_registry
    from hayhooks.server.utils.mcp_utils import create_mcp_server, create_starlette_app
    from starlette.routing import Mount, Route

    registry = load_pipeline_registry(pipelines_dir or default_pipelines_dir())
    server = create_mcp_server(name="osa-memory", registry=registry)
    # Without a version the MCP SDK looks up its own package's version in the installed metadata on
    # every request (stateless HTTP builds a session per request): 3.5% of a recall's server time.
    server.version = _package_version()
    names = _lock_down(server, registry)
    logger.info("serving MCP tools %s", names)
    app = create_starlette_app(server)
    app.router.routes = [
        r for r in app.router.routes if isinstance(r, Route | Mount) and getattr(r, "path", "") in ("/mcp", "/status")
    ]
    return BearerAuthMiddleware(app, verify)
