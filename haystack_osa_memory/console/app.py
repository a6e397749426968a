"""The review console: server-rendered pages for the people who govern memory (`osa-memory console`).

Sign-in exchanges a reviewer or admin token once for a server-side session (`ConsoleSessions`); every
page then acts for that person in their one org. Transitions go through `LifecycleRepository` and
`TokenStore`, exactly as the CLI's; the console's own SQL only reads (`console.queries`).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.console.queries import REVIEWABLE, ConsoleQueries, QueueFilter
from haystack_osa_memory.console.security import (
    RateLimiter,
    SecurityHeaders,
    csrf_ok,
    csrf_token,
    csv_cell,
    safe_link,
    same_origin,
)
from haystack_osa_memory.errors import AuthenticationError, InvalidInputError, OsaMemoryError, ScopeError
from haystack_osa_memory.markers import check_identifier
from haystack_osa_memory.store.database import fact_scope, probe
from haystack_osa_memory.store.lifecycle import LifecycleRepository, Scope
from haystack_osa_memory.store.memory_store import MemoryStore
from haystack_osa_memory.store.tokens import ConsoleIdentity, ConsoleSession, ConsoleSessions, TokenStore
from haystack_osa_memory.tools import KINDS

COOKIE = "osam_console"
SECURE_COOKIE = "__Host-osam_console"  # the __Host- prefix: Secure, Path=/, no Domain, set over TLS only
NOTE_MAX = 500
BULK_MAX = 200
CSV_MAX_ROWS = 10_000
SIGNED_OUT_MESSAGES = {
    "expired": "Your session ended (idle, expired, or its token was revoked). Sign in again.",
    "out": "You are signed out.",
}
DONE_MESSAGES = {
    "accepted": "Accepted: the fact is approved and recalled from now on.",
    "rejected": "Rejected: the fact is never recalled.",
    "restored": "Restored: the fact is approved again.",
    "forgotten": "Forgotten: the fact is retired for good.",
    "bulk": "Bulk review done.",
    "switch": "Switch changed.",
    "revoked": "Token revoked: its sessions have ended.",
}


@dataclass(frozen=True)
class ConsoleSettings:
    """How the console runs: session lifetimes, the sign-in rate limit, cookies, and where `serve` answers."""

    idle: timedelta = timedelta(minutes=30)
    absolute: timedelta = timedelta(hours=8)
    signin_attempts: int = 10
    signin_window_s: float = 60.0
    #: Force the Secure cookie (behind a TLS-terminating proxy); requests over https get it anyway.
    secure_cookies: bool = False
    #: `osa-memory serve`'s status endpoint (e.g. http://127.0.0.1:1416/status), for the health page.
    status_url: str | None = None
    kinds: tuple[str, ...] = field(default_factory=lambda: tuple(KINDS))
    #: SSO proxy mode (off by default): the request header that names the signed-in person, honoured only
    #: on requests from these client addresses, and each person's login -> a reviewer or admin token id.
    sso_header: str | None = None
    sso_proxies: tuple[str, ...] = ()
    sso_people: dict[str, str] = field(default_factory=dict)


@dataclass
class Console:
    """What the handlers share: the stores, the template environment and the settings."""

    conn_str: str
    config: MemoryConfig
    settings: ConsoleSettings
    tokens: TokenStore
    sessions: ConsoleSessions
    lifecycle: LifecycleRepository
    queries: ConsoleQueries
    env: Environment
    limiter: RateLimiter
    _memory: Any = None
    #: The knowledge base the tokens and the lifecycle act on (it owns their pooled connections).
    store: MemoryStore | None = None

    def memory(self) -> Any:
        """The `Memory` facade, built on first use (the assignment browser's recall)."""
        if self._memory is None:
            from haystack_osa_memory.memory import Memory

            # The console's own connection (its database role), for the recall pipeline's reads too.
            self._memory = Memory(self.config.model_copy(update={"pg_conn_str": self.conn_str}))
        return self._memory


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("haystack_osa_memory.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["safe_link"] = safe_link
    env.filters["when"] = _when
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=1, sort_keys=True, default=str)
    return env


def _when(value: Any) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return str(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


# -- sessions and guards ----------------------------------------------------------------------------


def _cookie_name(request: Request, console: Console) -> str:
    return SECURE_COOKIE if _secure(request, console) else COOKIE


def _secure(request: Request, console: Console) -> bool:
    return console.settings.secure_cookies or request.url.scheme == "https"


def _own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


async def _current(request: Request, console: Console) -> tuple[str, ConsoleSession] | None:
    session_id = request.cookies.get(_cookie_name(request, console))
    if not session_id:
        return None
    session = await run_in_threadpool(console.sessions.get, session_id)
    return (session_id, session) if session is not None else None


def _render(console: Console, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = console.env.get_template(template).render(request_path=request.url.path, **context)
    return HTMLResponse(html, status_code=status)


def _error(console: Console, request: Request, status: int, message: str, who: Any = None) -> HTMLResponse:
    return _render(console, request, "error.html", status=status, message=message, me=who, csrf=None)


Handler = Callable[[Request, Console, str, ConsoleIdentity], Awaitable[Response]]


def page(*, admin: bool = False, post: bool = False) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    """A handler for a signed-in person: no session -> the sign-in page; ``post``: CSRF token and Origin
    checked first; ``admin``: reviewers get 403."""

    def wrap(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            console: Console = request.app.state.console
            if post and not same_origin(
                request.headers.get("origin"), request.headers.get("sec-fetch-site"), _own_origin(request)
            ):
                return _error(console, request, 403, "This form was not sent from the console's own pages.")
            current = await _current(request, console)
            if current is None:
                if post:
                    return _error(console, request, 403, "No session: sign in again.")
                return RedirectResponse("/signin?m=expired", status_code=303)
            session_id, session = current
            if post:
                form = await request.form()
                if not csrf_ok(session_id, _text(form.get("csrf"))):
                    return _error(console, request, 403, "The form's CSRF token is missing or wrong: reload the page.")
            if admin and not session.identity.is_admin:
                return _error(console, request, 403, "This page is for admins.", session.identity)
            try:
                return await handler(request, console, session_id, session.identity)
            except (InvalidInputError, ScopeError) as e:
                return _error(console, request, 400, str(e), session.identity)

        return endpoint

    return wrap


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _ctx(session_id: str, me: ConsoleIdentity, **extra: Any) -> dict[str, Any]:
    return {"me": me, "csrf": csrf_token(session_id), **extra}


def _opt(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


def _note(value: str | None, what: str, *, required: bool) -> str | None:
    note = _opt(value)
    if note is None and required:
        msg = f"a {what} is required: say why in a few words (at most {NOTE_MAX} characters)"
        raise InvalidInputError(msg)
    if note is not None and len(note) > NOTE_MAX:
        msg = f"the {what} has {len(note)} characters: at most {NOTE_MAX} are allowed"
        raise InvalidInputError(msg)
    return note


def _assignment(value: str | None) -> str | None:
    value = _opt(value)
    if value is not None:
        check_identifier(value, "assignment")
    return value


def _day(value: str | None, what: str) -> datetime | None:
    value = _opt(value)
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as e:
        msg = f"{what} {value!r} is not a date: use YYYY-MM-DD (or an ISO 8601 date-time)"
        raise InvalidInputError(msg) from e
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# -- sign-in ------------------------------------------------------------------------------------------


SSO_LOGIN_MAX = 256


def _sso_login(request: Request, settings: ConsoleSettings) -> str | None:
    """The person the SSO proxy names, only when the mode is on and the request comes from the proxy."""
    if not settings.sso_header or not request.client or request.client.host not in settings.sso_proxies:
        return None
    login = (request.headers.get(settings.sso_header) or "").strip()
    return login if 0 < len(login) <= SSO_LOGIN_MAX else None


async def signin_form(request: Request) -> Response:
    console: Console = request.app.state.console
    reason = request.query_params.get("m", "")
    login = _sso_login(request, console.settings)
    if login is not None and reason != "out":
        token_id = console.settings.sso_people.get(login)
        try:
            if token_id is None:
                raise AuthenticationError("not mapped")
            identity = await run_in_threadpool(console.tokens.person, token_id)
        except AuthenticationError:
            refusal = "Your sign-in is not mapped to a live reviewer or admin: ask an admin of the console."
            return _error(console, request, 403, refusal)
        return await _signed_in(request, console, identity)
    return _render(console, request, "signin.html", message=SIGNED_OUT_MESSAGES.get(reason), me=None, csrf=None)


async def signin(request: Request) -> Response:
    console: Console = request.app.state.console
    if not same_origin(request.headers.get("origin"), request.headers.get("sec-fetch-site"), _own_origin(request)):
        return _error(console, request, 403, "This form was not sent from the console's own pages.")
    client = request.client.host if request.client else "unknown"
    if not console.limiter.allow(client):
        limited = _render(
            console, request, "signin.html", status=429, me=None, csrf=None,
            error="Too many sign-in attempts: wait a minute and try again.",
        )  # fmt: skip
        limited.headers["retry-after"] = str(int(console.settings.signin_window_s))
        return limited
    form = await request.form()
    token = (_text(form.get("token")) or "").strip()
    try:
        identity = await run_in_threadpool(console.tokens.verify_person, token)
    except AuthenticationError as e:
        return _render(console, request, "signin.html", status=401, me=None, csrf=None, error=str(e))
    return await _signed_in(request, console, identity)


async def _signed_in(request: Request, console: Console, identity: ConsoleIdentity) -> Response:
    """A new session for ``identity`` in a new cookie; the session this browser held before ends."""
    old = request.cookies.get(_cookie_name(request, console))
    if old:
        await run_in_threadpool(console.sessions.end, old)
    session_id = await run_in_threadpool(console.sessions.start, identity)
    response = RedirectResponse("/queue", status_code=303)
    response.set_cookie(
        _cookie_name(request, console),
        session_id,
        max_age=int(console.settings.absolute.total_seconds()),
        path="/",
        httponly=True,
        samesite="strict",
        secure=_secure(request, console),
    )
    return response


@page(post=True)
async def signout(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    await run_in_threadpool(console.sessions.end, session_id)
    response = RedirectResponse("/signin?m=out", status_code=303)
    response.delete_cookie(
        _cookie_name(request, console), path="/", httponly=True, samesite="strict", secure=_secure(request, console)
    )
    return response


async def home(request: Request) -> Response:
    return RedirectResponse("/queue", status_code=303)


# -- review queue and facts -----------------------------------------------------------------------------


def _queue_filter(request: Request, kinds: tuple[str, ...]) -> tuple[QueueFilter, dict[str, str]]:
    q = request.query_params
    status = _opt(q.get("status"))
    if status is not None and status not in REVIEWABLE:
        msg = f"status {status!r} is not allowed in the queue: use one of {list(REVIEWABLE)}"
        raise InvalidInputError(msg)
    kind = _opt(q.get("kind"))
    if kind is not None and kind not in kinds:
        msg = f"kind {kind!r} is not allowed: use one of {list(kinds)}"
        raise InvalidInputError(msg)
    older = _opt(q.get("older_than_days"))
    before = None
    if older is not None:
        if not older.isdigit() or int(older) > 3650:
            msg = f"older_than_days {older!r} is not allowed: a whole number of days from 0 to 3650"
            raise InvalidInputError(msg)
        before = datetime.now(UTC) - timedelta(days=int(older))
    flt = QueueFilter(
        statuses=(status,) if status else REVIEWABLE,
        assignment_id=_assignment(q.get("assignment")),
        kind=kind,
        created_before=before,
    )
    shown = {
        "status": status or "",
        "assignment": flt.assignment_id or "",
        "kind": kind or "",
        "older_than_days": older or "",
    }
    return flt, shown


@page()
async def queue(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    flt, shown = _queue_filter(request, console.settings.kinds)
    after = _opt(request.query_params.get("after"))
    data = await run_in_threadpool(console.queries.queue, me.org_id, flt, after)
    next_params = {k: v for k, v in shown.items() if v}
    if data["next"]:
        next_params["after"] = data["next"]
    return _render(
        console,
        request,
        "queue.html",
        **_ctx(session_id, me),
        data=data,
        filters=shown,
        kinds=console.settings.kinds,
        statuses=REVIEWABLE,
        next_query=httpx.QueryParams(next_params) if data["next"] else None,
        done=DONE_MESSAGES.get(request.query_params.get("done", "")),
        now=datetime.now(UTC),
    )


async def _fact_or_404(console: Console, me: ConsoleIdentity, document_id: str) -> dict[str, Any]:
    if len(document_id) > 128:
        raise HTTPException(404)
    fact = await run_in_threadpool(console.queries.fact, me.org_id, document_id)
    if fact is None:
        raise HTTPException(404)
    return fact


@page()
async def fact_page(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    fact = await _fact_or_404(console, me, request.path_params["document_id"])

    def chain() -> list[dict[str, Any]]:
        with fact_scope(me.org_id, ""):
            return console.lifecycle.chain(Scope(me.org_id, fact["assignment_id"]), fact["document_id"])

    versions = await run_in_threadpool(chain) if fact["assignment_id"] else []
    return _render(
        console,
        request,
        "fact.html",
        **_ctx(session_id, me),
        fact=fact,
        chain=versions,
        done=DONE_MESSAGES.get(request.query_params.get("done", "")),
    )


def _review(console: Console, me: ConsoleIdentity, document_id: str, *, accept: bool, note: str | None) -> None:
    with fact_scope(me.org_id, ""):
        console.lifecycle.review(document_id, accept=accept, actor=me.actor, note=note)


@page(post=True)
async def fact_action(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    fact = await _fact_or_404(console, me, request.path_params["document_id"])
    form = await request.form()
    action = _text(form.get("action")) or ""
    doc_id = fact["document_id"]
    if action in ("accept", "restore", "reject"):
        wanted = {"accept": "proposed", "restore": "flagged"}.get(action)
        if wanted and fact["status"] != wanted:
            msg = f"{action} is for {wanted} facts; this one is {fact['status']}"
            raise InvalidInputError(msg)
        note = _note(_text(form.get("note")), "note", required=action == "reject")
        await run_in_threadpool(_review, console, me, doc_id, accept=action != "reject", note=note)
        done = {"accept": "accepted", "restore": "restored", "reject": "rejected"}[action]
    elif action == "forget":
        reason = _note(_text(form.get("reason")), "reason", required=True)

        def forget() -> bool:
            with fact_scope(me.org_id, ""):
                return console.lifecycle.forget(
                    Scope(me.org_id, fact["assignment_id"]), doc_id, reason=reason or "", actor=me.actor
                )

        if not await run_in_threadpool(forget):
            raise HTTPException(404)
        return RedirectResponse("/queue?done=forgotten", status_code=303)
    else:
        msg = f"action {action!r} is not allowed: use accept, reject, restore or forget"
        raise InvalidInputError(msg)
    return RedirectResponse(f"/facts/{doc_id}?done={done}", status_code=303)


@page(post=True)
async def bulk(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    form = await request.form()
    action = _text(form.get("action")) or ""
    if action not in ("accept", "reject"):
        msg = f"bulk action {action!r} is not allowed: use accept or reject"
        raise InvalidInputError(msg)
    ids = [i for i in form.getlist("ids") if isinstance(i, str)]
    if not ids or len(ids) > BULK_MAX:
        msg = f"select between 1 and {BULK_MAX} facts for a bulk {action} (got {len(ids)})"
        raise InvalidInputError(msg)
    note = _note(_text(form.get("note")), "note", required=action == "reject")

    def run() -> None:
        for doc_id in dict.fromkeys(ids):
            fact = console.queries.fact(me.org_id, doc_id) if len(doc_id) <= 128 else None
            if fact is None or fact["status"] not in REVIEWABLE:
                continue  # another org's, gone, or already reviewed: skipped, never revealed
            _review(console, me, doc_id, accept=action == "accept", note=note)

    await run_in_threadpool(run)
    return RedirectResponse("/queue?done=bulk", status_code=303)


# -- assignment browser --------------------------------------------------------------------------------


@page()
async def assignments(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    counts = await run_in_threadpool(console.queries.assignments, me.org_id)
    return _render(console, request, "assignments.html", **_ctx(session_id, me), counts=counts)


async def _browse(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    assignment = _assignment(request.path_params["assignment"]) or ""
    cursor = _opt(request.query_params.get("cursor"))
    results = None
    search: dict[str, Any] = {"q": "", "as_of": "", "include_superseded": False}
    if request.method == "POST":
        form = await request.form()
        search = {
            "q": (_text(form.get("q")) or "").strip(),
            "as_of": (_text(form.get("as_of")) or "").strip(),
            "include_superseded": form.get("include_superseded") == "on",
        }
    caller = Caller(org_id=me.org_id, assignment_id=assignment, token_id=me.token_id)

    def listing() -> dict[str, Any]:
        return console.lifecycle.list_facts(Scope(me.org_id, assignment), status=None, topic=None, cursor=cursor)

    def recall() -> dict[str, Any]:
        result: dict[str, Any] = console.memory().recall(
            search["q"],
            limit=20,
            caller=caller,
            as_of=search["as_of"] or None,
            include_superseded=search["include_superseded"],
        )
        return result

    page_data = await run_in_threadpool(listing)
    if search["q"]:
        try:
            results = await run_in_threadpool(recall)
        except OsaMemoryError as e:
            results = {"error": str(e), "facts": []}
    return _render(
        console,
        request,
        "browse.html",
        **_ctx(session_id, me),
        assignment=assignment,
        listing=page_data,
        results=results,
        search=search,
    )


browse_get = page()(_browse)
browse_post = page(post=True)(_browse)


# -- switches, audit, tokens, health -------------------------------------------------------------------


@page(admin=True)
async def switches(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    rows = await run_in_threadpool(console.lifecycle.switches)
    mine = [r for r in rows if r["org_id"] in (me.org_id, "*")]
    counts = await run_in_threadpool(console.queries.assignments, me.org_id)
    return _render(
        console,
        request,
        "switches.html",
        **_ctx(session_id, me),
        switches=mine,
        assignments=sorted(counts),
        done=DONE_MESSAGES.get(request.query_params.get("done", "")),
    )


@page(admin=True, post=True)
async def switch_set(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    form = await request.form()
    target = (_text(form.get("assignment")) or "").strip()
    assignment = "*" if target in ("", "*") else (_assignment(target) or "*")
    state = _text(form.get("state"))
    if state not in ("on", "off"):
        msg = f"state {state!r} is not allowed: on or off"
        raise InvalidInputError(msg)
    reason = _note(_text(form.get("reason")), "reason", required=state == "off")
    await run_in_threadpool(
        lambda: console.lifecycle.set_switch(
            me.org_id, assignment, enabled=state == "on", actor=me.actor, reason=reason
        )
    )
    return RedirectResponse("/switches?done=switch", status_code=303)


def _audit_filters(request: Request) -> dict[str, Any]:
    q = request.query_params
    before = _opt(q.get("before"))
    if before is not None and not before.isdigit():
        msg = f"before {before!r} is not allowed: an audit row id"
        raise InvalidInputError(msg)
    return {
        "actor": _opt(q.get("actor")),
        "action": _opt(q.get("action")),
        "document_id": _opt(q.get("fact")),
        "since": _day(q.get("since"), "since"),
        "until": _day(q.get("until"), "until"),
        "before_id": int(before) if before else None,
    }


@page()
async def audit(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    filters = _audit_filters(request)
    rows = await run_in_threadpool(lambda: console.queries.audit(me.org_id, **filters))
    shown = {k: request.query_params.get(k, "") for k in ("actor", "action", "fact", "since", "until")}
    older = None
    if len(rows) == 100:
        older = httpx.QueryParams({**{k: v for k, v in shown.items() if v}, "before": str(rows[-1]["id"])})
    return _render(
        console,
        request,
        "audit.html",
        **_ctx(session_id, me),
        rows=rows,
        filters=shown,
        older=older,
        export=httpx.QueryParams({k: v for k, v in shown.items() if v}),
    )


@page()
async def audit_csv(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    filters = {**_audit_filters(request), "limit": CSV_MAX_ROWS}
    rows = await run_in_threadpool(lambda: console.queries.audit(me.org_id, **filters))
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["id", "at", "actor", "action", "assignment", "fact", "note", "details"])
    for r in rows:
        found = r["details"] or {}
        details = json.dumps(found, sort_keys=True, default=str)
        note = found.get("note") or found.get("reason") or ""
        cells = (r["id"], _when(r["at"]), r["actor"], r["action"], r["assignment_id"], r["document_id"], note, details)
        writer.writerow([csv_cell(v) for v in cells])
    return Response(
        buffer.getvalue(),
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": 'attachment; filename="audit.csv"'},
    )


@page(admin=True)
async def tokens(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    rows = await run_in_threadpool(console.tokens.list, me.org_id)
    return _render(
        console,
        request,
        "tokens.html",
        **_ctx(session_id, me),
        tokens=rows,
        now=datetime.now(UTC),
        done=DONE_MESSAGES.get(request.query_params.get("done", "")),
    )


@page(admin=True, post=True)
async def token_revoke(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    token_id = request.path_params["token_id"]
    if await run_in_threadpool(console.tokens.org_of, token_id) != me.org_id:
        raise HTTPException(404)
    await run_in_threadpool(lambda: console.tokens.revoke(token_id, actor=me.actor))
    if token_id == me.token_id:
        return RedirectResponse("/signin?m=expired", status_code=303)
    return RedirectResponse("/tokens?done=revoked", status_code=303)


def _serve_status(url: str | None) -> dict[str, Any] | None:
    if not url:
        return None
    try:
        answer = httpx.get(url, timeout=2)
        data: dict[str, Any] = answer.json() if answer.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _chart(days: list[dict[str, Any]]) -> dict[str, Any]:
    """Bars for facts stored and reviews done per day, scaled into a 600 x 160 SVG."""
    width, height, pad = 600, 160, 20
    top = max([1, *(d["stored"] for d in days), *(d["reviews"] for d in days)])
    slot = (width - 2 * pad) / max(1, len(days))
    bars = []
    for i, d in enumerate(days):
        x = pad + i * slot
        for j, key in enumerate(("stored", "reviews")):
            h = (height - 2 * pad) * d[key] / top
            bars.append(
                {
                    "x": round(x + j * slot / 2.4 + 2, 1),
                    "y": round(height - pad - h, 1),
                    "w": round(slot / 2.6, 1),
                    "h": round(h, 1),
                    "kind": key,
                    "label": f"{d['day']}: {d[key]} {key}",
                }
            )
    oldest = max([1.0, *(d["queue_age"] for d in days)])
    line = " ".join(
        f"{round(pad + (i + 0.5) * slot, 1)},{round(height - pad - (height - 2 * pad) * d['queue_age'] / oldest, 1)}"
        for i, d in enumerate(days)
    )
    chart = {"width": width, "height": height, "bars": bars, "top": top, "days": days}
    return {**chart, "age_line": line, "oldest": oldest}


@page()
async def health(request: Request, console: Console, session_id: str, me: ConsoleIdentity) -> Response:
    if console.store is not None:
        state, detail = await run_in_threadpool(console.store.probe)
    else:
        state, detail = await run_in_threadpool(probe, console.conn_str, console.config)
    counts = await run_in_threadpool(console.queries.assignments, me.org_id)
    waiting = await run_in_threadpool(console.queries.queue, me.org_id, QueueFilter(), None)
    days = await run_in_threadpool(console.queries.daily, me.org_id)
    serve = await run_in_threadpool(_serve_status, console.settings.status_url)
    oldest = waiting["oldest"]
    return _render(
        console,
        request,
        "health.html",
        **_ctx(session_id, me),
        db_state=state,
        db_detail=detail,
        counts=counts,
        waiting=waiting["counts"],
        queue_age=(datetime.now(UTC) - oldest) if oldest else None,
        chart=_chart(days),
        serve=serve,
        status_url=console.settings.status_url,
    )


async def not_found(request: Request, exc: Exception) -> Response:
    console: Console = request.app.state.console
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = "Not found." if status == 404 else "Something went wrong."
    return _error(console, request, status, message)


def _closing(store: MemoryStore) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the store lets go of its connection pool when the server stops."""

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            store.close()

    return lifespan


def create_console_app(conn_str: str, config: MemoryConfig, settings: ConsoleSettings | None = None) -> Starlette:
    """The console as an ASGI app (`osa-memory console` serves it with uvicorn)."""
    settings = settings or ConsoleSettings()
    store = MemoryStore.from_config(config.model_copy(update={"pg_conn_str": conn_str}))
    console = Console(
        conn_str=conn_str,
        config=config,
        settings=settings,
        tokens=store.tokens,
        sessions=store.console_sessions(idle=settings.idle, absolute=settings.absolute),
        lifecycle=store.lifecycle,
        queries=store.repository(ConsoleQueries),
        env=_environment(),
        limiter=RateLimiter(settings.signin_attempts, settings.signin_window_s),
        store=store,
    )
    routes = [
        Route("/", home),
        Route("/signin", signin_form, methods=["GET"]),
        Route("/signin", signin, methods=["POST"]),
        Route("/signout", signout, methods=["POST"]),
        Route("/queue", queue, methods=["GET"]),
        Route("/queue/bulk", bulk, methods=["POST"]),
        Route("/facts/{document_id}", fact_page, methods=["GET"]),
        Route("/facts/{document_id}", fact_action, methods=["POST"]),
        Route("/assignments", assignments, methods=["GET"]),
        Route("/assignments/{assignment}", browse_get, methods=["GET"]),
        Route("/assignments/{assignment}", browse_post, methods=["POST"]),
        Route("/switches", switches, methods=["GET"]),
        Route("/switches", switch_set, methods=["POST"]),
        Route("/audit", audit, methods=["GET"]),
        Route("/audit.csv", audit_csv, methods=["GET"]),
        Route("/tokens", tokens, methods=["GET"]),
        Route("/tokens/{token_id}/revoke", token_revoke, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={HTTPException: not_found, 500: not_found},
        lifespan=_closing(store),
    )
    app.state.console = console
    return app
