"""The review console in-process (Starlette's test client over a real embedded PostgreSQL), and helpers
to sign in and post its forms as a browser would."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from starlette.testclient import TestClient

from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.console import ConsoleSettings, create_console_app
from haystack_osa_memory.store.tokens import TokenStore

ORIGIN = "http://testserver"
_CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')


def csrf_of(html: str) -> str:
    found = _CSRF.search(html)
    assert found, "no CSRF token on the page"
    return found.group(1)


class Browser:
    """A test client that sends what a browser sends on a same-origin form post."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.client.get(path, follow_redirects=False, **kwargs)

    def post(self, path: str, data: dict[str, Any] | list[tuple[str, str]], *, origin: str | None = ORIGIN) -> Any:
        headers = {"origin": origin} if origin is not None else {}
        if isinstance(data, list):  # repeated fields (ids=a&ids=b) as a mapping of lists
            grouped: dict[str, list[str]] = {}
            for key, value in data:
                grouped.setdefault(key, []).append(value)
            data = dict(grouped)
        return self.client.post(path, data=data, headers=headers, follow_redirects=False)

    def sign_in(self, token: str) -> Any:
        answer = self.post("/signin", {"token": token})
        assert answer.status_code == 303, answer.text
        return answer

    def use_session(self, session_id: str) -> None:
        """Send this session cookie from now on (as a browser that kept an old one would)."""
        self.client.cookies.clear()
        self.client.cookies.set("osam_console", session_id, domain="testserver.local")

    def csrf(self, path: str = "/queue") -> str:
        page = self.get(path)
        assert page.status_code == 200, page.text
        return csrf_of(page.text)


def person(config: MemoryConfig, pg_conn_str: str, role: str = "reviewer", org: str = "acme", **kw: Any) -> str:
    issued = TokenStore(pg_conn_str, config).create_person(
        org_id=org, role=role, name=kw.pop("name", "Ana Silva"), **kw
    )
    return issued.token


@pytest.fixture
def console_settings() -> ConsoleSettings:
    return ConsoleSettings(idle=timedelta(minutes=30), absolute=timedelta(hours=8))


@pytest.fixture
def browser(config: MemoryConfig, pg_conn_str: str, console_settings: ConsoleSettings) -> Iterator[Browser]:
    app = create_console_app(pg_conn_str, config, console_settings)
    with TestClient(app, base_url=ORIGIN) as client:
        yield Browser(client)
