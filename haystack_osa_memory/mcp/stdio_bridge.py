"""`osa-memory mcp-stdio`: a stdio MCP server that proxies to `osa-memory serve`, with a local buffer.

For MCP clients that prefer to start a local process. Every request is forwarded to the HTTP server
(streamable HTTP, `Authorization: Bearer $OSA_MEMORY_TOKEN`) and its answer returned unchanged. When
the server cannot be reached (connection refused or reset, no answer in time, HTTP 5xx):

- `kb_memory_store` and `kb_memory_propose` calls are appended to a durable local buffer and answered
  `{"stored": false, "queued": true, "reason": ..., "pending": N}`; nothing pretends to be stored;
- `kb_memory_recall` answers from the queued facts (word overlap, `buffer.rank`), marked
  `"degraded": <why>`;
- every other tool answers `isError` saying the server is unreachable;
- `tools/list` answers from the last good list, cached next to the buffer.

A refused token (HTTP 401) is never "unreachable": the call fails saying the token is invalid and
nothing is queued. Other 4xx answers (wrong URL) are errors too.

The buffer (JSON lines, one item per call: `id`, `tool`, `arguments`, `queued_at`, and a SHA-256
fingerprint of the token, never the token) is a `haystack_osa_memory.durable_queue.DurableQueue`, the same
queue as `Memory`'s offline buffer: appended with fsync, mode 0600, under a lock file shared by every
bridge process using it; a torn line left by a crash is skipped and kept. On start-up, on every
successful remote call, and every `retry_interval` seconds while items are pending, this token's items
are sent in order (one bridge process at a time), each removed by an atomic rewrite (temporary file,
fsync, rename) as soon as the server acknowledged it. The flush never stops at one item: an item the
server refuses because its scope is switched off (`Memory is off for this assignment`) is kept, with the
later items of the same assignment so that their order holds, and sent once the switch is back on; any
other refusal (an `isError` answer: bad arguments, a secret) can never succeed, so the item moves to
`<buffer>.rejected` with the refusal as its reason and the flush goes on. A 401 means this
token is invalid, revoked or expired: none of its items may ever be sent, so they move to
`<buffer>.rejected` (same format plus `rejected_at` and `rejected_reason`, mode 0600) and are counted
by `kb_memory_bridge_status` as `rejected`, kept there for an operator, never sent. An item
whose acknowledgement was lost (bridge killed after the server answered, before the rewrite) is sent
again on the next flush: the server's deterministic document ids make that replay an update in place.
Items of other tokens in a shared buffer are never sent, recalled or removed by this bridge.

Logs go to stderr only: stdout is the protocol.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import re
import sys
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import httpx
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import McpError

from haystack_osa_memory.durable_queue import DurableQueue, rank, replace_atomically
from haystack_osa_memory.errors import MemoryOffError

logger = logging.getLogger("haystack_osa_memory.mcp.stdio_bridge")  # also when run as __main__

T = TypeVar("T")

TOKEN_ENV = "OSA_MEMORY_TOKEN"  # noqa: S105 - the name of the variable, not a secret
BUFFER_NAME = "bridge-buffer.jsonl"
QUEUED_TOOLS = frozenset({"kb_memory_store", "kb_memory_propose"})
RECALL_TOOL = "kb_memory_recall"
STATUS_TOOL = "kb_memory_bridge_status"
RECALL_DEFAULT_LIMIT = 8
# Refusals that may pass (the server's wording for a kill switch, a database that did not answer, an internal
# error): the item and its assignment's later ones are kept. Any other refusal can never succeed.
WAIT_REFUSALS = (MemoryOffError.MESSAGE, "retry later", "database error", "did not answer", "internal error")
RECALL_MAX_LIMIT = 20

STATUS_TOOL_DEFINITION = types.Tool(
    name=STATUS_TOOL,
    description=(
        "Status of the local osa-memory stdio bridge: whether the memory server is reachable, how many of "
        "your stores are queued locally waiting to be sent, which one waits because its assignment is "
        "switched off (blocked_by), and how many the server refused for good (rejected, set aside). Sends "
        "the queued items when the server is reachable."
    ),
    inputSchema={"type": "object", "properties": {}, "additionalProperties": False},
)


# -- remote failures ---------------------------------------------------------------------------------
class RemoteError(Exception):
    """The remote call did not happen as asked; ``reason`` says why, for humans and agents."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RemoteUnreachable(RemoteError):
    """Connection failed, timed out, or the server answered 5xx: worth queueing and retrying."""


class RemoteUnauthorized(RemoteError):
    """HTTP 401: the token is invalid, expired or revoked. Never queued."""


class RemoteFailed(RemoteError):
    """Any other failure (4xx, protocol error): a configuration problem, not an outage. Never queued."""


class LocalBufferError(RuntimeError):
    """The local buffer could not be read or written (disk full, permissions): never mistaken for an outage."""


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def classify(exc: BaseException, url: str) -> RemoteError:
    """Map what the MCP client raised (often nested exception groups) to one `RemoteError`."""
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, RemoteError):
            return leaf
    for leaf in leaves:
        if isinstance(leaf, httpx.HTTPStatusError):
            code = leaf.response.status_code
            if code == 401:
                return RemoteUnauthorized(
                    f"the osa-memory server at {url} refused the token (HTTP 401): {TOKEN_ENV} is invalid, "
                    "expired or revoked; create a new one with `osa-memory token create`"
                )
            if code >= 500:
                return RemoteUnreachable(f"the osa-memory server at {url} answered HTTP {code}")
            return RemoteFailed(
                f"the server at {url} answered HTTP {code} {leaf.response.reason_phrase}; "
                "check --url (the MCP endpoint ends in /mcp)"
            )
    for leaf in leaves:
        if isinstance(leaf, httpx.ConnectTimeout):
            return RemoteUnreachable(f"cannot reach the osa-memory server at {url} (connection timed out)")
        if isinstance(leaf, TimeoutError | httpx.TimeoutException):
            return RemoteUnreachable(
                f"no answer from the osa-memory server at {url} in time (the request may still have been carried out)"
            )
        if isinstance(leaf, httpx.TransportError | OSError):
            return RemoteUnreachable(f"cannot reach the osa-memory server at {url} ({type(leaf).__name__}: {leaf})")
    for leaf in leaves:
        if isinstance(leaf, McpError):
            if "Session terminated" in str(leaf):
                return RemoteFailed(f"{url} answered HTTP 404: check --url (the MCP endpoint ends in /mcp)")
            return RemoteFailed(f"the server at {url} answered with an MCP error: {leaf}")
    first = leaves[0] if leaves else exc
    return RemoteFailed(f"unexpected error talking to {url}: {type(first).__name__}: {first}")


# -- the durable buffer --------------------------------------------------------------------------------
def token_fingerprint(token: str) -> str:
    """A non-reversible tag of the token (SHA-256 prefix) that marks which caller queued an item."""
    return hashlib.sha256(b"osa-memory-bridge\x00" + token.encode("utf-8")).hexdigest()[:32]


def default_buffer_path() -> Path:
    """``$OSA_MEMORY_DATA_DIR/bridge-buffer.jsonl``, else ``~/.local/share/osa-memory/bridge-buffer.jsonl``."""
    from haystack_osa_memory.settings import load_config

    return load_config(only=("data_dir",)).data_dir.expanduser() / BUFFER_NAME


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class BridgeBuffer:
    """One token's view of the shared `DurableQueue` of calls, and the cache of the server's tool list.

    Every method is synchronous and safe across threads and processes (the queue's locks); the bridge
    calls them in a worker thread. Items of other tokens in the file are never returned or removed.
    """

    def __init__(self, path: Path, fingerprint: str) -> None:
        self.queue = DurableQueue(path)
        self.path = path
        self.fingerprint = fingerprint
        self.tools_path = path.with_name(path.name + ".tools.json")
        self.rejected_path = self.queue.rejected_path

    def _mine(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [item for item in items if item.get("token_fingerprint") == self.fingerprint]

    def pending(self) -> list[dict[str, Any]]:
        """This token's queued items, oldest first."""
        return self._mine(self.queue.items())

    def append(self, tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Queue one call durably (fsync before returning). Returns the item and this token's count."""
        item, items = self.queue.append({"tool": tool, "arguments": arguments, "token_fingerprint": self.fingerprint})
        return item, len(self._mine(items))

    def remove(self, item_id: str) -> int:
        """Drop one acknowledged item (atomic rewrite). Returns how many of this token's remain."""
        return len(self._mine(self.queue.remove({item_id})))

    def reject_mine(self, reason: str) -> int:
        """Move every item of this token to the rejected file. Returns how many moved."""
        return self.queue.reject({item["id"] for item in self.pending()}, reason)

    def rejected(self) -> int:
        """How many of this token's items were set aside: the server refused the token, or refused the item for good."""
        return len(self._mine(self.queue.rejected()))

    # recall from the buffer ------------------------------------------------------------------
    def search(self, query: str, limit: int, assignment: str | None) -> tuple[list[dict[str, Any]], int]:
        """Queued `kb_memory_store` facts ranked by `rank`, best first; and how many were searched."""
        stores = [
            item
            for item in self.pending()
            if item.get("tool") == "kb_memory_store"
            and isinstance(item.get("arguments"), dict)
            and isinstance(item["arguments"].get("fact"), str)
            and item["arguments"].get("assignment") == assignment
        ]
        ranked = rank(
            query, [(i["arguments"]["fact"], _str_or_none(i["arguments"].get("topic")), i) for i in stores], limit
        )
        facts = [
            {
                "document_id": None,
                "content": item["arguments"]["fact"],
                "topic": item["arguments"].get("topic"),
                "score": round(score, 6),
                "stored_at": None,
                "kind": item["arguments"].get("kind") or "fact",
                "stale": False,
                "queued": True,
                "queue_id": item["id"],
                "queued_at": item.get("queued_at"),
            }
            for score, item in ranked
        ]
        return facts, len(stores)

    # the tool-list cache -----------------------------------------------------------------------
    def load_tools(self) -> list[dict[str, Any]] | None:
        try:
            data = json.loads(self.tools_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except ValueError:
            logger.warning("ignoring an unreadable tool-list cache at %s", self.tools_path)
            return None
        tools = data.get("tools") if isinstance(data, dict) else None
        return tools if isinstance(tools, list) else None

    def save_tools(self, tools: list[dict[str, Any]]) -> None:
        """Replace the cache atomically (unique temporary file, fsync, rename): no lock needed."""
        self.queue.ensure_dir()
        body = json.dumps({"saved_at": datetime.now(UTC).isoformat(), "tools": tools}, ensure_ascii=False, indent=1)
        replace_atomically(self.tools_path, body.encode("utf-8"))


# -- results -------------------------------------------------------------------------------------------
def _text(text: str, *, error: bool) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=error)


def _json(data: dict[str, Any]) -> types.CallToolResult:
    return _text(json.dumps(data, ensure_ascii=False), error=False)


def _text_problem(value: Any, where: str = "") -> str | None:
    """What the server would refuse in any string argument: NUL bytes and lone surrogates."""
    if isinstance(value, str):
        if "\x00" in value:
            return f"{where or 'argument'}: NUL characters are not allowed"
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            return f"{where or 'argument'}: lone surrogate characters are not allowed"
    elif isinstance(value, dict):
        for key, inner in value.items():
            if problem := _text_problem(inner, f"{where}.{key}" if where else str(key)):
                return problem
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            if problem := _text_problem(inner, f"{where}[{i}]"):
                return problem
    return None


def _validation_problem(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    import jsonschema  # type: ignore[import-untyped]

    try:
        jsonschema.validate(arguments, schema)
    except jsonschema.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path)
        return f"{where}: {e.message}" if where else str(e.message)
    except jsonschema.SchemaError:
        return None
    return None


# -- the bridge ------------------------------------------------------------------------------------------
class Bridge:
    """The stdio MCP server in front of one remote `osa-memory serve` and one local buffer."""

    def __init__(
        self,
        url: str,
        token: str,
        buffer_path: Path,
        *,
        connect_timeout: float = 5.0,
        call_timeout: float = 60.0,
        retry_interval: float = 30.0,
    ) -> None:
        self.url = url
        self._token = token
        self.buffer = BridgeBuffer(buffer_path, token_fingerprint(token))
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self.retry_interval = retry_interval
        self._flush_lock = anyio.Lock()
        self._schemas: dict[str, dict[str, Any]] = {}
        self._listed: set[str] | None = None  # tool names last answered to the client
        self._client: ServerSession | None = None
        self.remote_state = "unknown"
        self.remote_detail: str | None = None
        self.blocked: dict[str, Any] | None = None
        self.server: Server[Any, Any] = Server(
            "osa-memory-bridge",
            instructions=(
                "Assignment memory (osa-memory) through a local bridge. If the memory server is unreachable, "
                "stores are queued locally and sent later, and recall searches only the queued facts."
            ),
        )
        self.server.request_handlers[types.ListToolsRequest] = self._handle_list_tools
        self.server.request_handlers[types.CallToolRequest] = self._handle_call_tool

    # remote ----------------------------------------------------------------------------------------
    async def _remote(self, op: Callable[[ClientSession], Awaitable[T]]) -> T:
        """Run ``op`` in a fresh, initialised session with the server; failures become `RemoteError`."""
        timeout = httpx.Timeout(self.call_timeout, connect=self.connect_timeout)
        try:
            async with (
                httpx.AsyncClient(headers={"Authorization": f"Bearer {self._token}"}, timeout=timeout) as http,
                streamable_http_client(self.url, http_client=http) as (read, write, _),
                ClientSession(read, write) as session,
            ):
                try:
                    with anyio.fail_after(self.connect_timeout):
                        await session.initialize()
                except TimeoutError:
                    msg = f"no answer from the osa-memory server at {self.url} within {self.connect_timeout:g} s"
                    raise RemoteUnreachable(msg) from None
                result = await op(session)
        except Exception as exc:
            local = [leaf for leaf in _leaves(exc) if isinstance(leaf, LocalBufferError)]
            if local:
                raise local[0] from None
            error = classify(exc, self.url)
            self._note(error)
            if isinstance(error, RemoteUnauthorized):
                await self._set_aside(error)
            raise error from None
        self._note(None)
        return result

    async def _set_aside(self, error: RemoteUnauthorized) -> None:
        """The token is refused for good: its queued items must never reach the server; keep them aside."""
        try:
            moved = await self._local(self.buffer.reject_mine, "the server refused the token (HTTP 401)")
        except LocalBufferError as e:
            logger.warning("%s", e)
            return
        if moved:
            # Counts and paths only: queued arguments (fact text) never go to the log.
            logger.warning(
                "%s; %d queued item(s) of this token moved to %s and will never be sent",
                error.reason,
                moved,
                self.buffer.rejected_path,
            )

    def _note(self, error: RemoteError | None) -> None:
        if error is None:
            state = "ok"
        elif isinstance(error, RemoteUnreachable):
            state = "unreachable"
        elif isinstance(error, RemoteUnauthorized):
            state = "unauthorized"
        else:
            state = "error"
        if state != self.remote_state:
            if error is None:
                logger.info("osa-memory server at %s is reachable", self.url)
            else:
                logger.warning("osa-memory server problem: %s", error.reason)
        self.remote_state = state
        self.remote_detail = error.reason if error else None

    async def _call_remote(self, session: ClientSession, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """One tools/call, its result untouched (no client-side output validation)."""
        request = types.ClientRequest(
            types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=arguments))
        )
        with anyio.fail_after(self.call_timeout):
            return await session.send_request(request, types.CallToolResult)

    async def _list_remote(self, session: ClientSession) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        with anyio.fail_after(self.call_timeout):
            while True:
                page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
                tools.extend(page.tools)
                cursor = page.nextCursor
                if not cursor:
                    return tools

    async def _local(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a buffer operation in a worker thread (not cancellable mid-write); OSError -> LocalBufferError."""
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except OSError as e:
            msg = f"the bridge's local buffer {self.buffer.path} failed: {type(e).__name__}: {e}"
            raise LocalBufferError(msg) from e

    async def _flush(self, session: ClientSession) -> int:
        """Send this token's queued items in order, never stopping at one item: a refusal that may pass (see
        WAIT_REFUSALS) keeps the item and its assignment's later items for a later flush; any other refusal sets
        the item aside. Returns how many were sent."""
        async with self._flush_lock:
            claim = await self._local(self.buffer.queue.try_claim)
            if claim is None:
                logger.info("another bridge process is flushing %s; not flushing now", self.buffer.path)
                return 0
            try:
                items = await self._local(self.buffer.pending)
                sent = 0
                held: set[str] = set()  # assignments switched off: their later items wait too
                blocked: dict[str, Any] | None = None
                for item in items:
                    arguments = dict(item.get("arguments") or {})
                    scope = str(arguments.get("assignment") or "")
                    if scope in held:
                        continue
                    queued_at = item.get("queued_at")
                    if item.get("tool") == "kb_memory_store" and not arguments.get("valid_from") and queued_at:
                        # A queued fact holds from when the agent stored it, not from when the buffer drains.
                        arguments["valid_from"] = queued_at
                    result = await self._call_remote(session, str(item.get("tool")), arguments)
                    if result.isError:
                        refusal = "".join(getattr(c, "text", "") for c in result.content)[:2000]
                        if any(marker in refusal for marker in WAIT_REFUSALS):
                            held.add(scope)
                            blocked = blocked or {
                                "queue_id": item["id"],
                                "tool": item.get("tool"),
                                "queued_at": item.get("queued_at"),
                                "refusal": refusal,
                            }
                            continue
                        await self._local(self.buffer.queue.reject, {item["id"]}, f"the server refused it: {refusal}")
                        logger.warning(
                            "the server refused queued item %s (%s); set aside in %s",
                            item["id"],
                            item.get("tool"),
                            self.buffer.rejected_path,
                        )
                        continue
                    left = await self._local(self.buffer.remove, item["id"])
                    sent += 1
                    logger.info("sent queued item %s (%s); %d left", item["id"], item.get("tool"), left)
                repeated, self.blocked = blocked == self.blocked, blocked
                if blocked is not None and not repeated:
                    logger.warning("queued items the server refused for now are kept for a later flush")
                return sent
            finally:
                claim.release()

    async def _with_flush(self, session: ClientSession, op: Callable[[ClientSession], Awaitable[T]]) -> T:
        await self._flush(session)
        return await op(session)

    # tools/list ------------------------------------------------------------------------------------
    def _remember(self, tools: list[types.Tool]) -> None:
        self._schemas = {t.name: dict(t.inputSchema) for t in tools}

    async def _cached_tools(self) -> list[types.Tool]:
        cached = await self._local(self.buffer.load_tools)
        tools: list[types.Tool] = []
        for entry in cached or []:
            try:
                tools.append(types.Tool.model_validate(entry))
            except ValueError:
                continue
        return tools

    async def _refresh_tools(self, session: ClientSession) -> list[types.Tool]:
        tools = await self._list_remote(session)
        dumped = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
        await self._local(self.buffer.save_tools, dumped)
        self._remember(tools)
        return tools

    async def list_tools(self) -> list[types.Tool]:
        try:
            tools = await self._remote(partial(self._with_flush, op=self._refresh_tools))
        except RemoteError as e:
            tools = await self._cached_tools()
            self._remember(tools)
            logger.info("tools/list answered from the cache (%d tools): %s", len(tools), e.reason)
        self._listed = {t.name for t in tools}
        # No outputSchema: while the server is unreachable the bridge answers store and recall itself,
        # in other shapes and as text only, and a client holding the server's schemas would reject
        # those answers. The server's structuredContent still passes through when it answers.
        return [*(t.model_copy(update={"outputSchema": None}) for t in tools), STATUS_TOOL_DEFINITION]

    async def _handle_list_tools(self, _: types.ListToolsRequest | None) -> types.ServerResult:
        self._capture_client()
        return types.ServerResult(types.ListToolsResult(tools=await self.list_tools()))

    # tools/call ------------------------------------------------------------------------------------
    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        if name == STATUS_TOOL:
            return await self.status()
        try:
            return await self._remote(
                partial(self._with_flush, op=lambda s: self._call_remote(s, name, arguments)),
            )
        except RemoteUnreachable as e:
            return await self._offline(name, arguments, e.reason)
        except RemoteUnauthorized as e:
            return _text(f"{e.reason}. Nothing was stored or queued.", error=True)
        except RemoteFailed as e:
            return _text(f"{e.reason}. Nothing was stored or queued.", error=True)

    async def _handle_call_tool(self, req: types.CallToolRequest) -> types.ServerResult:
        self._capture_client()
        name, arguments = req.params.name, dict(req.params.arguments or {})
        try:
            result = await self.call_tool(name, arguments)
        except Exception as e:
            logger.exception("bridge failure in %s", name)
            result = _text(f"the osa-memory bridge failed: {type(e).__name__}: {e}", error=True)
        return types.ServerResult(result)

    async def _offline(self, name: str, arguments: dict[str, Any], reason: str) -> types.CallToolResult:
        if name not in QUEUED_TOOLS and name != RECALL_TOOL:
            return _text(
                f"osa-memory server unreachable: {reason}. While it is, only kb_memory_store and kb_memory_propose "
                "(queued locally, sent later) and kb_memory_recall (searches the queued facts only) work.",
                error=True,
            )
        if not self._schemas:
            self._remember(await self._cached_tools())
        schema = self._schemas.get(name)
        problem = _text_problem(arguments) or (_validation_problem(schema, arguments) if schema else None)
        if problem:
            return _text(
                f"invalid arguments for {name}: {problem} (checked offline by the local bridge); nothing was queued",
                error=True,
            )
        if name in QUEUED_TOOLS:
            item, pending = await self._local(self.buffer.append, name, arguments)
            logger.info("queued %s as %s (%d pending): %s", name, item["id"], pending, reason)
            return _json(
                {
                    "stored": False,
                    "queued": True,
                    "reason": f"{reason}; queued by the local bridge and sent in order when the server answers again",
                    "pending": pending,
                    "queue_id": item["id"],
                }
            )
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return _text("invalid arguments for kb_memory_recall: query must be a non-empty string", error=True)
        limit = arguments.get("limit", RECALL_DEFAULT_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool):
            limit = RECALL_DEFAULT_LIMIT
        limit = max(1, min(RECALL_MAX_LIMIT, limit))
        assignment = arguments.get("assignment")
        facts, searched = await self._local(
            self.buffer.search, query, limit, assignment if isinstance(assignment, str) else None
        )
        return _json(
            {
                "assignment_id": assignment if isinstance(assignment, str) else None,
                "facts": facts,
                "degraded": (
                    f"{reason}; answered by the local bridge from the {searched} fact(s) queued here and "
                    "not yet on the server (word overlap); facts already on the server were not searched"
                ),
            }
        )

    async def status(self) -> types.CallToolResult:
        """Probe the server (flushing if it answers) and report the bridge's state."""
        with suppress(RemoteError):
            await self._remote(self._flush)
        pending = await self._local(self.buffer.pending)
        rejected = await self._local(self.buffer.rejected)
        # Only this token's items: other tokens sharing the buffer file are not the caller's business.
        return _json(
            {
                "url": self.url,
                "remote": self.remote_state,
                "detail": self.remote_detail,
                "pending": len(pending),
                "pending_items": [
                    {"queue_id": i["id"], "tool": i.get("tool"), "queued_at": i.get("queued_at")} for i in pending
                ],
                "blocked_by": self.blocked if pending else None,
                "rejected": rejected,
                "buffer": str(self.buffer.path),
            }
        )

    # background ------------------------------------------------------------------------------------
    def _capture_client(self) -> None:
        with suppress(LookupError):
            self._client = self.server.request_context.session

    async def sync(self) -> None:
        """Flush and refresh the tool cache; tell the client if the tool list changed."""
        try:
            tools = await self._remote(partial(self._with_flush, op=self._refresh_tools))
        except RemoteError:
            if not self._schemas:
                self._remember(await self._cached_tools())
            return
        names = {t.name for t in tools}
        if self._client is not None and self._listed is not None and names != self._listed:
            try:
                await self._client.send_tool_list_changed()
            except Exception as e:
                logger.debug("could not send tools/list_changed: %s", e)

    async def _background_sync(self) -> None:
        """`sync` that never brings the bridge down: a failure is logged and retried later."""
        try:
            await self.sync()
        except Exception as e:
            logger.warning("background sync failed: %s: %s", type(e).__name__, e)

    async def _retry_loop(self) -> None:
        while True:
            await anyio.sleep(self.retry_interval)
            if self.remote_state == "ok":
                continue  # calls flush as they come; nothing to reconnect
            try:
                pending = await self._local(self.buffer.pending)
            except LocalBufferError as e:
                logger.warning("%s", e)
                continue
            if pending or not self._schemas:
                await self._background_sync()

    async def run(self) -> None:
        logger.info("osa-memory stdio bridge to %s, buffer %s", self.url, self.buffer.path)
        options = self.server.create_initialization_options(NotificationOptions(tools_changed=True))
        async with stdio_server() as (read, write), anyio.create_task_group() as tg:
            tg.start_soon(self._background_sync)
            if self.retry_interval > 0:
                tg.start_soon(self._retry_loop)
            await self.server.run(read, write, options)
            tg.cancel_scope.cancel()


async def run_bridge(
    url: str,
    token: str,
    buffer_path: Path,
    *,
    connect_timeout: float = 5.0,
    call_timeout: float = 60.0,
    retry_interval: float = 30.0,
) -> None:
    """Serve MCP over stdio, proxying to the osa-memory server at ``url`` with a local buffer at ``buffer_path``.

    Returns when the client closes stdin.
    """
    bridge = Bridge(
        url,
        token,
        buffer_path,
        connect_timeout=connect_timeout,
        call_timeout=call_timeout,
        retry_interval=retry_interval,
    )
    await bridge.run()


# -- command line ------------------------------------------------------------------------------------------
class _RedactToken(logging.Filter):
    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.token in message:
            record.msg, record.args = message.replace(self.token, "***"), None
        return True


@dataclass(frozen=True)
class BridgeOptions:
    """The bridge's settings, as its command line (`parse_options`) gives them."""

    url: str
    buffer: Path | None
    connect_timeout: float
    call_timeout: float
    retry_interval: float
    log_level: str


def _seconds(low: float, high: float) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not in the range {low:g} to {high:g} seconds")
        return value

    return convert


def _parser() -> argparse.ArgumentParser:
    """The one definition of the bridge's options and their defaults (`osa-memory mcp-stdio` hands its
    arguments here untouched)."""
    parser = argparse.ArgumentParser(
        prog="osa-memory mcp-stdio",
        description=(
            f"Stdio MCP server proxying to `osa-memory serve`; the token comes from ${TOKEN_ENV}. "
            "Stores made while the server is unreachable are queued locally and sent on reconnect."
        ),
    )
    parser.add_argument("--url", required=True, help="The server's MCP endpoint, e.g. http://127.0.0.1:1417/mcp.")
    parser.add_argument(
        "--buffer", type=Path, default=None, help=f"Local buffer file (default: {default_buffer_path()})."
    )
    parser.add_argument(
        "--connect-timeout", type=_seconds(0.1, 300), default=5.0, help="Seconds to reach the server (%(default)g)."
    )
    parser.add_argument(
        "--call-timeout",
        type=_seconds(1, 3600),
        default=60.0,
        help="Seconds to wait for a tool's answer (%(default)g).",
    )
    parser.add_argument(
        "--retry-interval",
        type=_seconds(0, math.inf),
        default=30.0,
        help="Seconds between reconnection attempts while items wait (%(default)g; 0: off).",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="Log level (stderr; %(default)s).",
    )
    return parser


def parse_options(argv: list[str] | None = None) -> BridgeOptions:
    """The bridge's command line as `BridgeOptions`; a usage error exits with status 2."""
    return BridgeOptions(**vars(_parser().parse_args(argv)))


def _usage_error(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")


def serve_stdio(options: BridgeOptions) -> int:
    """Run the bridge until the client closes stdin; the exit status (2: the token or the URL is unusable)."""
    from haystack_osa_memory.settings import load_config

    token = load_config(only=("token",)).token or ""
    if not token:
        _usage_error(
            f"{TOKEN_ENV} is not set: export the token printed by `osa-memory token create` "
            "(it is read from the environment, never from the command line)"
        )
        return 2
    if re.fullmatch(r"\$\{[^}]*\}|\$[A-Za-z_]\w*", token):
        _usage_error(
            f"{TOKEN_ENV} holds the unexpanded placeholder {token!r}: the MCP client did not substitute it; "
            f"set {TOKEN_ENV} in the environment the client is started from"
        )
        return 2
    parts = urlsplit(options.url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        _usage_error(f"--url must be an http(s) URL such as http://127.0.0.1:1417/mcp, not {options.url!r}")
        return 2
    for name in ("connect_timeout", "call_timeout"):
        if getattr(options, name) <= 0:
            _usage_error(f"--{name.replace('_', '-')} must be positive")
            return 2
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s osa-memory-bridge %(levelname)s %(message)s"))
    handler.addFilter(_RedactToken(token))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("haystack_osa_memory").setLevel(options.log_level.upper())
    buffer_path = (options.buffer or default_buffer_path()).expanduser()
    try:
        anyio.run(
            partial(
                run_bridge,
                options.url,
                token,
                buffer_path,
                connect_timeout=options.connect_timeout,
                call_timeout=options.call_timeout,
                retry_interval=max(0.0, options.retry_interval),
            )
        )
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `osa-memory mcp-stdio` (and `python -m haystack_osa_memory.mcp.stdio_bridge`)."""
    return serve_stdio(parse_options(argv))


if __name__ == "__main__":
    sys.exit(main())
