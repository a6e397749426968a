"""The console's defences that do not need the database: response headers, the CSRF token and the Origin
check of state changes, the sign-in rate limit, link schemes, and CSV cells safe from formula injection."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

from cachetools import TTLCache
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = "default-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'"
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
# Every page may show facts or tokens: none is kept by a browser or proxy cache.
NO_STORE = (b"cache-control", b"no-store")
LINK_SCHEMES = ("http", "https")
# A spreadsheet evaluates a cell that starts with one of these (tab and carriage return: LibreOffice).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: Keys (client addresses) the sign-in rate limit remembers; past this many, the least recently seen is
#: forgotten. A key is forgotten anyway once its last attempt is older than the window.
RATE_LIMIT_KEYS_MAX = 10_000


class SecurityHeaders:
    """Pure ASGI middleware: the security headers and ``Cache-Control: no-store`` on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                extra = [h for h in (*SECURITY_HEADERS, NO_STORE) if h[0] not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def csrf_token(session_id: str) -> str:
    """The CSRF token of a session: derived from its (HttpOnly, never shown) id, so nothing more is stored."""
    return hmac.new(session_id.encode(), b"osa-memory console csrf", hashlib.sha256).hexdigest()


def csrf_ok(session_id: str, submitted: str | None) -> bool:
    """Whether a form's CSRF token is the session's (constant-time compare)."""
    return bool(submitted) and hmac.compare_digest(csrf_token(session_id), str(submitted))


def same_origin(origin: str | None, fetch_site: str | None, own_origin: str) -> bool:
    """Whether a state-changing request comes from the console's own pages.

    Browsers send ``Origin`` on every POST; under ``Referrer-Policy: no-referrer`` it is ``null`` even for
    a same-origin form, and then ``Sec-Fetch-Site: same-origin`` tells. Neither header: refused.
    """
    if origin and origin != "null":
        return hmac.compare_digest(origin.rstrip("/").lower(), own_origin.rstrip("/").lower())
    return fetch_site == "same-origin"


def safe_link(url: str | None) -> str | None:
    """``url`` when its scheme is allowed (http, https), else ``None`` (shown as text, never as a link)."""
    if not url:
        return None
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    if parts.scheme.lower() not in LINK_SCHEMES or not parts.netloc:
        return None
    return url.strip()


def csv_cell(value: object) -> str:
    """A CSV cell a spreadsheet shows as text: a leading ``=``, ``+``, ``-``, ``@``, tab or CR gets a ``'``."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class RateLimiter:
    """At most ``limit`` events per ``window`` seconds per key (sign-in attempts per client address), for at
    most ``max_keys`` keys at a time; ``timer`` is the clock (seconds)."""

    def __init__(
        self,
        limit: int,
        window: float,
        *,
        max_keys: int = RATE_LIMIT_KEYS_MAX,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self._timer = timer
        # A key's attempts expire `window` seconds after the last one was recorded: by then all are outside
        # the window. cachetools' caches are not thread-safe: every use holds `_lock`.
        self._events: TTLCache[str, deque[float]] = TTLCache(max_keys, window, timer=timer)
        self._lock = threading.Lock()

    def allow(self, key: str) -> bool:
        """Record one attempt for ``key``; ``False`` when it is over the limit (the attempt is not run)."""
        now = self._timer()
        with self._lock:
            events = self._events.get(key)
            if events is None:
                events = deque()
            while events and now - events[0] >= self.window:
                events.popleft()
            if len(events) >= self.limit:
                return False
            events.append(now)
            self._events[key] = events  # (again: its time to live starts from this attempt)
            return True
