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

import contextlib
import ctypes
import functools
import hashlib
import json
import logging
import os
import re
import signal
import string
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import quote, unquote

from cachetools import TTLCache
from starlette.types import ASGIApp, Receive, Scope, Send

from haystack_osa_memory.caller import Caller, SwitchReading, caller_scope, switch_reading_scope
from haystack_osa_memory.errors import AuthenticationError, DatabaseError, InvalidInputError, OsaMemoryError
from haystack_osa_memory.mcp.call_slots import CallSlots
from haystack_osa_memory.privacy.redaction import JWT, PASSWORD, PRIVATE_KEY, SECRET, redact
from haystack_osa_memory.store.database import classify, probe
from haystack_osa_memory.store.tokens import TokenStore
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


async def _respond_json(send: Send, payload: bytes) -> None:
    """A 200 answer with a JSON body, with the headers the MCP SDK's JSON answer has."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(payload)).encode()), (b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": payload})


#: Anything shaped like one of our tokens (masked in every log line, wherever it came from).
_TOKEN_SHAPED = re.compile(r"osam_[0-9a-f]{16}_[A-Za-z0-9_-]+")
#: What every log line is redacted of. Private addresses and home folders stay: the log is the
#: operator's own, and client addresses are what an access log is for.
LOG_REDACTION_CLASSES = (PRIVATE_KEY, JWT, SECRET, PASSWORD)
_NOT_LOGGED = "(details not logged: they may quote the tool arguments)"
#: Log lines of the MCP SDK and Hayhooks that quote a whole request, its arguments, a result or a tool
#: name the client chose: only their opening words are kept. Matched at the start of the message.
_CONTENT_DUMPS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Failed to validate (request|notification)\b"), rf"Failed to validate \1 {_NOT_LOGGED}"),
    (re.compile(r"(Message that failed validation|Received message)\b"), rf"\1 {_NOT_LOGGED}"),
    (re.compile(r"(Calling pipeline as tool|Attempting to run pipeline)\b"), rf"\1 {_NOT_LOGGED}"),
    (re.compile(r"Pipeline '.*' returned result", re.DOTALL), "a pipeline returned its result (not logged)"),
    (re.compile(r"Tool '.*' not listed", re.DOTALL), "a tool that is not served was called (name not logged)"),
    (re.compile(r"Tool cache miss for "), "tool cache miss (name not logged)"),
    (re.compile(r"received: "), "received a message (method not logged)"),
    (re.compile(r"chunk: "), "sent a chunk of an answer (not logged: answers hold facts)"),  # sse-starlette
    (re.compile(r"(Received exception from stream|Unhandled exception in receive loop)\b"), rf"\1 {_NOT_LOGGED}"),
)
#: Characters kept as they are when a line is percent-encoded again (printable ASCII but ``%``).
_LOG_SAFE = "".join(c for c in string.punctuation if c != "%") + " "
#: uvicorn's access-log record: (client, method, path, HTTP version, status); its formatter unpacks them.
_ACCESS_LOGGER = "uvicorn.access"


def _redact_for_log(text: str) -> str:
    return redact(_TOKEN_SHAPED.sub("osam_***", text), LOG_REDACTION_CLASSES).text


def scrub_log_text(text: str) -> str:
    """A log line as it may be written: request dumps cut to their opening words, secrets redacted, also
    secrets hidden by percent-encoding (a path such as ``/x%20ghp_...``)."""
    for pattern, replacement in _CONTENT_DUMPS:
        match = pattern.match(text)
        if match is not None:
            return match.expand(replacement)
    scrubbed = _redact_for_log(text)
    if "%" in scrubbed:
        decoded = unquote(scrubbed)
        if decoded != scrubbed:
            redacted = _redact_for_log(decoded)
            if redacted != decoded:
                # Encoded again: decoded text could carry line breaks into the log.
                scrubbed = quote(redacted, safe=_LOG_SAFE)
    return scrubbed


#: Methods and paths of ordinary traffic: logged as they are, without running the redactor on every request.
_PLAIN_METHODS = frozenset({"GET", "POST", "DELETE", "HEAD", "OPTIONS", "PUT", "PATCH"})
_PLAIN_PATHS = frozenset({"/mcp", "/mcp/", "/status", "/metrics"})


def _scrub_access_path(path: str) -> str:
    # The query string is never logged: a token put in `?token=` by mistake would be written in clear.
    path = path.split("?", 1)[0]
    return path if path in _PLAIN_PATHS else scrub_log_text(path)


def scrub_record(record: logging.LogRecord) -> None:
    """Make ``record`` safe to write, whatever handler or formatter it reaches later.

    The message is formatted and scrubbed now and its arguments dropped (a secret may be split between
    the template and an argument, and logging's own error report prints both raw); an exception's
    traceback and a stack are formatted and scrubbed now too (an exception's message may quote input).
    uvicorn's access records keep their five arguments, each scrubbed, because their formatter unpacks them.
    """
    args = record.args
    if record.name == _ACCESS_LOGGER and isinstance(args, tuple) and len(args) == 5:
        client, method, path, version, status = args
        record.args = (
            client,
            method if method in _PLAIN_METHODS else scrub_log_text(str(method)),
            _scrub_access_path(str(path)),
            version,
            status,
        )
    else:
        try:
            message = record.getMessage()
        except Exception:  # a template that does not match its arguments: keep the template alone
            message = f"{record.msg} (arguments not logged: they did not match the message)"
        record.msg, record.args = scrub_log_text(message), ()
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        formatted = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = scrub_log_text(formatted)
    if record.stack_info:
        record.stack_info = scrub_log_text(record.stack_info)


class _RedactingRecordFactory:
    """The process's log-record factory: every record, of any logger and for any handler (also handlers
    added later, by any library or a server started later in the process), is scrubbed when created."""

    def __init__(self, previous: Callable[..., logging.LogRecord]) -> None:
        self.previous = previous

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.previous(*args, **kwargs)
        scrub_record(record)
        return record


def _scrub_loguru_record(record: Any) -> None:
    """Hayhooks logs through loguru, past the standard library: the same scrubbing as a loguru patcher.
    A traceback goes into the message, scrubbed, instead of loguru's own (which may show variables)."""
    record["message"] = scrub_log_text(record["message"])
    extra = record["extra"]
    for key, value in list(extra.items()):
        if isinstance(value, str):
            extra[key] = scrub_log_text(value)
    exception = record["exception"]
    if exception is not None:
        formatted = "".join(traceback.format_exception(exception.type, exception.value, exception.traceback))
        record["message"] += "\n" + scrub_log_text(formatted.rstrip("\n"))
        record["exception"] = None


def _scrubbing_excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    sys.stderr.write(scrub_log_text("".join(traceback.format_exception(kind, value, tb))))


def _scrubbing_thread_excepthook(hook: threading.ExceptHookArgs) -> None:
    if hook.exc_type is SystemExit:
        return
    name = hook.thread.name if hook.thread is not None else "?"
    formatted = "".join(traceback.format_exception(hook.exc_type, hook.exc_value, hook.exc_traceback))
    sys.stderr.write(scrub_log_text(f"Exception in thread {name}:\n{formatted}"))


def install_log_scrubbing(level: int | str | None = None) -> None:
    """Make every log line this process writes safe: no request body, tool argument, tool name a client
    chose, token or other secret reaches a log unless redacted. Idempotent.

    Covers the standard library's logging (uvicorn, the MCP SDK, Haystack, our own, and any logger or
    handler added later) through the record factory, Hayhooks' loguru logger through a patcher, warnings
    (routed to logging) and uncaught exceptions (the process's and its threads' excepthooks).

    ``level``: at ``DEBUG`` or below, the libraries' loggers (root, Hayhooks) log at that level too
    (``serve --log-level debug``); above it they keep their defaults.
    """
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, _RedactingRecordFactory):
        logging.setLogRecordFactory(_RedactingRecordFactory(factory))
    logging.captureWarnings(True)
    sys.excepthook = _scrubbing_excepthook
    threading.excepthook = _scrubbing_thread_excepthook
    root = logging.getLogger()
    if not root.handlers:
        # The MCP SDK logs through ``logging.warning(...)``, which would otherwise add a handler itself.
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
        root.addHandler(handler)
    named = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    numeric: int | None = named if isinstance(named, int) else None
    debug = numeric is not None and numeric <= logging.DEBUG
    if numeric is not None and debug:
        root.setLevel(numeric)
    try:
        from loguru import logger as loguru_logger
    except ImportError:  # pragma: no cover - Hayhooks depends on loguru
        return
    loguru_logger.configure(patcher=_scrub_loguru_record)
    if numeric is not None and debug:
        from hayhooks.server.logger import formatter

        loguru_logger.remove()
        loguru_logger.add(
            sys.stderr,
            level="TRACE" if numeric < logging.DEBUG else "DEBUG",
            format=formatter,
            backtrace=False,
            diagnose=False,  # loguru's tracebacks would show variables' values (arguments, tokens)
        )


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


#: Linux ``prctl`` option: the signal the kernel sends this process when its parent dies.
_PR_SET_PDEATHSIG = 1
#: Seconds a worker whose parent died gets to finish its requests before it exits regardless.
ORPHAN_GRACE_SECONDS = 5.0


def exit_with_parent() -> None:
    """In a `serve --workers N` worker: end this process when the `serve` process dies, however it died.

    Killed with SIGKILL (the out-of-memory killer), the parent cannot stop its workers, which would keep
    serving its port with stale settings, holding database connections. The kernel sends the worker
    SIGTERM when its parent dies (``PR_SET_PDEATHSIG``, Linux); wherever that is not available, or the
    parent died before it was set, a thread waiting on the parent's end of the start-up pipe does. uvicorn
    then shuts the worker down gracefully, and after ``ORPHAN_GRACE_SECONDS`` it exits regardless.
    """
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None:  # not started by uvicorn's supervisor
        return
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # a libc without prctl: the thread remains
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    def watch() -> None:
        parent.join()  # returns once the parent is gone (its end of the pipe closed with it)
        logger.warning("the serve process is gone: this worker stops")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(ORPHAN_GRACE_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="osa-memory-parent-watch", daemon=True).start()


#: Seconds a direct probe's finding (is the database really away?) is reused by the token cache.
PROBE_REUSE_S = 1.0
#: Tokens one process remembers for an outage; past this many, the least recently used is forgotten (its
#: next request during an outage is refused, as for a token never verified here).
TOKEN_CACHE_MAX = 100_000


class CachingVerifier:
    """Verify tokens against the database; while it is unreachable, accept a token verified within
    ``grace_seconds`` (so agents can keep storing into the offline buffer).

    Never accepted from the cache:
    - a wrong, revoked or expired token the database refused (a refusal evicts it);
    - a token past its expiry (known without the database, when built on a `TokenStore`);
    - a token not verified again since the database was last seen back. The pool may fail for a moment
      after the database returns; before it serves from the cache, the verifier asks the database with a
      direct connection (when built on a `TokenStore`; one probe per `PROBE_REUSE_S`), and when it
      answers, the cache is emptied and the request waits for the pool (503) instead. Every token must
      then be checked again: one revoked during the outage is refused from its next request.

    A verified token is remembered for ``grace_seconds`` (by ``timer``), at most ``max_tokens`` of them.

    Usage: ``CachingVerifier(TokenStore(conn_str, config), config.offline_grace)``.
    """

    def __init__(
        self,
        verify: Verifier | TokenStore,
        grace_seconds: float,
        *,
        max_tokens: int = TOKEN_CACHE_MAX,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tokens = verify if isinstance(verify, TokenStore) else None
        self.verify: Verifier = verify.verify if isinstance(verify, TokenStore) else verify
        self._lock = threading.Lock()
        self._timer = timer
        # token hash -> (caller, when verified, token expiry); cachetools' caches are not thread-safe: every
        # use holds `_lock`.
        self._cache: TTLCache[str, tuple[Caller, float, datetime | None]] = TTLCache(
            max_tokens, grace_seconds, timer=timer
        )
        self._outage = False  # the database was found away and has not been seen back since
        self._probed: tuple[float, bool] | None = None  # (when, the database was away)

    @property
    def grace_seconds(self) -> float:
        """Seconds a verified token is accepted while the database is unreachable."""
        return float(self._cache.ttl)

    def _check(self, token: str) -> tuple[Caller, datetime | None, SwitchReading | None]:
        if self.tokens is not None:
            return self.tokens.verify_call(token)
        return self.verify(token), None, None

    def _database_away(self) -> bool:
        """Whether the database is really unreachable (a direct connection, not the pool)."""
        if self.tokens is None:
            return True
        with self._lock:
            if self._probed is not None and time.monotonic() - self._probed[0] < PROBE_REUSE_S:
                return self._probed[1]
            state, _ = probe(self.tokens.conn_str, self.tokens.config)
            self._probed = (time.monotonic(), state == "unreachable")
            return self._probed[1]

    def _database_back(self) -> None:
        with self._lock:
            if self._outage:
                self._outage = False
                self._cache.clear()
                logger.warning("the database answers again: every cached token is verified again before use")

    def __call__(self, token: str) -> Caller:
        return self.verify_call(token)[0]

    def verify_call(self, token: str) -> tuple[Caller, SwitchReading | None]:
        """The caller, and whether a kill switch has turned its scope off as the database said in the same
        statement (`TokenStore.verify_call`); no reading when the caller came from the cache, or when built
        on a plain verifier (the tool then asks the database itself)."""
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        try:
            caller, expires_at, reading = self._check(token)
        except AuthenticationError:
            with self._lock:
                self._cache.pop(key, None)
            raise
        except DatabaseError as e:
            if classify(e) != "unreachable":
                raise
            with self._lock:
                hit = self._cache.get(key)  # None once `grace_seconds` have passed since it was verified
            if hit is None:
                raise
            if hit[2] is not None and hit[2] <= datetime.now(UTC):
                with self._lock:
                    self._cache.pop(key, None)
                raise AuthenticationError("invalid, expired or revoked token") from None
            if not self._database_away():
                self._database_back()  # the pool has not reconnected yet: nothing is served from the cache
                raise
            with self._lock:
                self._outage = True
            logger.warning("database unreachable: accepting a token verified %.0f s ago", self._timer() - hit[1])
            return hit[0], None
        self._database_back()
        with self._lock:
            self._cache[key] = (caller, self._timer(), expires_at)
        return caller, reading


#: Deepest nesting of arrays and objects a request may have (a tool call needs 4; a batch one more).
MAX_JSON_DEPTH = 32
#: A run of digits long enough to be a number Python refuses to convert (over 4300 digits by default).
_LONG_DIGITS = re.compile(r"[0-9]{1000}")


def malformed_json(body: bytes) -> str | None:
    """Why ``body`` cannot be a JSON-RPC message, or None when it parses within the allowed depth.

    The MCP SDK answers a JSON syntax error itself, but a body that is not UTF-8, nested deeper than the
    parser's recursion limit or holding an integer longer than Python converts raised past it: HTTP 500.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"the body must be UTF-8 JSON; byte {e.start} (0x{body[e.start]:02x}) is not UTF-8"
    # A body with few brackets cannot nest deeply, one without a long run of digits holds no number too
    # long to read, one without a \ud escape no lone surrogate: the usual call is never parsed twice.
    if (
        text.count("[") + text.count("{") <= MAX_JSON_DEPTH
        and _LONG_DIGITS.search(text) is None
        and "\\ud" not in text.lower()
    ):
        return None
    try:
        parsed = json.loads(text)
    except RecursionError:
        return f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    except json.JSONDecodeError:
        return None  # the MCP SDK reports the syntax error itself
    except ValueError as e:  # an integer of more digits than Python converts
        return f"a JSON value could not be read ({type(e).__name__}); numbers may have at most 4300 digits"
    if _json_depth(parsed) > MAX_JSON_DEPTH:
        return f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    # Answers repeat the id, and errors the method or tool name: one that is not valid Unicode could not
    # be encoded in the answer. (Tool arguments are checked by each tool, which names the problem.)
    for message in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(message, dict):
            continue
        params = message.get("params")
        envelope = [message.get("id"), message.get("method"), params.get("name") if isinstance(params, dict) else None]
        if any(isinstance(value, str) and not _valid_unicode(value) for value in envelope):
            return "the id, method and tool name must be valid Unicode text (a lone surrogate escape was sent)"
    return None


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (iterative: the value may be nested a thousand levels)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_JSON_DEPTH:
                return depth
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_error(problem: str) -> dict[str, Any]:
    """A JSON-RPC parse error (code -32700, id null) saying what was wrong."""
    return {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": f"Parse error: {problem}"}}


async def _buffered_body(receive: Receive) -> tuple[bytes | None, Receive]:
    """The whole request body (None when the client left first), and a ``receive`` that hands it on again
    before the client's next events."""
    chunks: list[bytes] = []
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None, receive
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Any:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return body, replay


class DirectToolCalls:
    """Ordinary ``tools/call`` requests answered by the MCP server's own tool-call handler, without the
    session the MCP SDK builds for every stateless request.

    Stateless streamable HTTP makes the SDK build, per request, a transport, a server session, memory
    streams and task groups, route the request through them and back, and only then call the handler
    registered for ``tools/call``: more CPU than a recall's own work. A request whose headers and body the
    SDK would accept as they are (a single JSON-RPC ``tools/call`` request with an id, JSON content, a JSON
    answer accepted, a supported protocol version) is validated as the SDK validates it, given to the same
    handler (the same argument checks, tool, telemetry and error results) and answered with the JSON-RPC
    response the SDK would send, byte for byte. Anything else (``initialize``, ``tools/list``,
    notifications, batches, unusual headers, a body the models refuse) goes through the SDK.
    """

    def __init__(self, server: Any) -> None:
        from mcp import types
        from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
        from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS

        self._types = types
        self._handler = server.request_handlers[types.CallToolRequest]
        self._versions = {v.encode() for v in SUPPORTED_PROTOCOL_VERSIONS}
        self._max_body = DEFAULT_MAX_REQUEST_BODY_SIZE

    def takes(self, headers: dict[bytes, bytes]) -> bool:
        """Whether the request's headers are ones the SDK would accept without a word (its own checks)."""
        accept = [t.strip() for t in headers.get(b"accept", b"").split(b",")]
        content_type = headers.get(b"content-type", b"")
        version = headers.get(b"mcp-protocol-version")
        return (
            any(t.startswith(b"application/json") for t in accept)
            and content_type.lower().startswith(b"application/json")
            and any(part.strip() == b"application/json" for part in content_type.split(b";")[0].split(b","))
            and (version is None or version in self._versions)
        )

    async def answer(self, body: bytes) -> bytes | None:
        """The JSON-RPC response to ``body``, or None when the SDK should take the request."""
        from pydantic import ValidationError

        types = self._types
        if len(body) > self._max_body:
            return None
        try:
            message = json.loads(body)
        except ValueError:
            return None
        if not (isinstance(message, dict) and message.get("method") == "tools/call" and "id" in message):
            return None
        try:
            rpc = types.JSONRPCRequest.model_validate(message)
            request = types.CallToolRequest.model_validate(
                rpc.model_dump(by_alias=True, mode="json", exclude_none=True)
            )
        except ValidationError:
            return None
        result = await self._handler(request)
        response = types.JSONRPCResponse(
            jsonrpc="2.0", id=rpc.id, result=result.model_dump(by_alias=True, mode="json", exclude_none=True)
        )
        payload: str = types.JSONRPCMessage(response).model_dump_json(by_alias=True, exclude_none=True)
        return payload.encode()


class BearerAuthMiddleware:
    """Pure ASGI middleware: verify the bearer token, run the request as its caller, or answer 401."""

    def __init__(
        self,
        app: ASGIApp,
        verify: Verifier,
        direct: DirectToolCalls | None = None,
        slots: CallSlots | None = None,
    ) -> None:
        self.app = app
        self.verify = verify
        self.direct = direct
        self.slots = slots or CallSlots(0, 1.0)

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
        verify_call = getattr(self.verify, "verify_call", None)
        try:
            if callable(verify_call):
                # The token and its scope's kill switch in one statement (`CachingVerifier.verify_call`).
                caller, reading = await self.slots.run(verify_call, token.strip())
            else:
                caller, reading = await self.slots.run(self.verify, token.strip()), None
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
        if scope.get("method") == "POST":
            body, receive = await _buffered_body(receive)
            if body is None:
                return  # the client went away before sending its request
            problem = malformed_json(body)
            if problem is not None:
                await _respond(send, 400, parse_error(problem))
                return
            if self.direct is not None and self.direct.takes(headers):
                with caller_scope(caller), switch_reading_scope(reading):
                    answer = await self.direct.answer(body)
                if answer is not None:
                    await _respond_json(send, answer)
                    return
        with caller_scope(caller), switch_reading_scope(reading):
            await self.app(scope, receive, send)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("haystack-osa-memory")
    except PackageNotFoundError:
        return "0"


def _lock_down(server: Any, registry: Any, slots: CallSlots) -> list[str]:
    """Replace Hayhooks' list/call handlers so that only our pipeline tools exist.

    A tool declared in `tools.SPECS` also publishes its result model as `outputSchema`, and its results
    carry `structuredContent` (MCP 2025-06-18) beside the same JSON as text, for clients that predate it.
    """
    from mcp.types import CallToolResult, ContentBlock, TextContent, Tool
    from pydantic import ValidationError

    from haystack_osa_memory.mcp.telemetry import instrument_tool_call
    from haystack_osa_memory.tools import SPECS

    tools: dict[str, Tool] = {}
    models: dict[str, Any] = {}
    results: dict[str, Any] = {}
    wrappers: dict[str, Any] = {}
    for name in registry.get_names():
        metadata = registry.get_metadata(name) or {}
        model = metadata.get("request_model")
        wrapper = registry.get(name)
        if model is None or wrapper is None:
            continue
        wrappers[name] = wrapper
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
            # The name is the client's own text: escaped so that a lone surrogate can still be answered.
            shown = name[:200].encode("utf-8", "backslashreplace").decode("utf-8")
            msg = f"Unknown tool '{shown}'. Available tools: {sorted(tools)}"
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
        # The wrapper's `run_api` is called as Hayhooks' `run_pipeline_as_tool` calls it (in a worker thread),
        # without its detour: a span mirrored into the local trace buffer (not served here) and the tool's
        # dict turned into JSON text only to be parsed back for the structured content.
        try:
            answer = await slots.run(functools.partial(wrappers[name].run_api, **arguments))
        except OsaMemoryError:
            raise
        except Exception as e:
            logger.exception("tool %s failed", name)
            msg = f"{name} failed with an internal error ({type(e).__name__}); see the server log"
            raise RuntimeError(msg) from None
        text = [TextContent(type="text", text=json.dumps(answer) if isinstance(answer, dict) else str(answer))]
        if name not in results:
            return text
        # The tool's dict is also its structured content. It is checked against the tool's result model
        # here, once compiled, and answered as a finished result: the MCP SDK would otherwise rebuild a
        # JSON-schema validator on every call, which cost more than the recall itself.
        try:
            if not isinstance(answer, dict):
                raise ValueError("not a JSON object")
            results[name].model_validate(answer)
        except ValueError as e:
            logger.error("tool %s returned a result outside its outputSchema: %s", name, type(e).__name__)
            msg = f"{name} failed with an internal error (result outside its outputSchema); see the server log"
            raise RuntimeError(msg) from None
        return CallToolResult(content=list[ContentBlock](text), structuredContent=answer)

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
    from haystack_osa_memory.mcp.forked_workers import freeze_heap
    from haystack_osa_memory.store.database import resolve_connection_string
    from haystack_osa_memory.store.memory_store import MemoryStore

    exit_with_parent()
    # uvicorn configured this worker's loggers before loading the app: its level is the one asked for.
    install_log_scrubbing(logging.getLogger("uvicorn.error").getEffectiveLevel())
    try:
        config = MemoryConfig.from_env()
        # The worker's store (its tokens) lives as long as the worker process.
        store = MemoryStore.from_config(config.model_copy(update={"pg_conn_str": resolve_connection_string(config)}))
        tokens = store.tokens
        app = create_app(
            CachingVerifier(tokens, config.offline_grace), config.pipelines_dir, CallSlots.from_config(config)
        )
    except Exception as e:
        logger.error("the MCP tools could not be loaded: %s: %s", type(e).__name__, e)
        raise SystemExit(3) from None  # uvicorn's STARTUP_FAILURE
    freeze_heap()  # the app lives as long as the worker: out of the collector's way
    return app


def without_trace_buffer() -> None:
    """Keep Hayhooks from mirroring every Haystack span into the buffer of its local trace API.

    Hayhooks does it with or without a tracing backend (when it configures tracing, as it builds the MCP
    app); that API (``/traces``) is not served here, so the mirror would be cost without a reader. A tracing
    backend the operator configured is unaffected (`telemetry.configure_tracing`).
    """
    from hayhooks.settings import settings as hayhooks_settings

    hayhooks_settings.tracing_include_haystack_spans = False


def create_app(verify: Verifier, pipelines_dir: Path | None = None, slots: CallSlots | None = None) -> ASGIApp:
    """The ASGI app: locked-down Hayhooks MCP server behind bearer auth. ``slots``: how many calls run in
    worker threads at once (`CallSlots`; by default the configuration's, `OSA_MEMORY_CALL_SLOTS`).

    The pipelines' `setup()` runs here (database connection, schema, embedders).
    """
    from hayhooks.server.pipelines.loader import load_pipeline_registry
    from hayhooks.server.utils.mcp_utils import create_mcp_server, create_starlette_app
    from starlette.routing import Mount, Route

    from haystack_osa_memory.pipeline_inputs import use_lean_input_copies
    from haystack_osa_memory.pipeline_scheduling import use_lean_scheduling
    from haystack_osa_memory.pipeline_spans import use_lean_component_spans

    without_trace_buffer()
    use_lean_input_copies()  # Haystack's per-component input copy, same result, ~1 ms less per recall
    use_lean_component_spans()  # no tags worked out for spans no tracer records
    use_lean_scheduling()  # Haystack's component priorities, same result, worked out in one pass
    registry = load_pipeline_registry(pipelines_dir or default_pipelines_dir())
    server = create_mcp_server(name="osa-memory", registry=registry)
    # Without a version the MCP SDK looks up its own package's version in the installed metadata on
    # every request (stateless HTTP builds a session per request), a measurable share of a recall.
    server.version = _package_version()
    if slots is None:
        from haystack_osa_memory.config import MemoryConfig

        slots = CallSlots.from_config(MemoryConfig.from_env())
    names = _lock_down(server, registry, slots)
    logger.info("serving MCP tools %s", names)
    # Each answer as one JSON body instead of a one-event SSE stream: a stateless call has nothing to
    # stream (no progress, no server requests), and the stream's machinery cost more than the recall.
    app = create_starlette_app(server, json_response=True)
    app.router.routes = [
        r for r in app.router.routes if isinstance(r, Route | Mount) and getattr(r, "path", "") in ("/mcp", "/status")
    ]
    return BearerAuthMiddleware(app, verify, DirectToolCalls(server), slots)
