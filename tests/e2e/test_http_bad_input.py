"""Bodies that are not JSON-RPC at the HTTP level get a JSON-RPC / HTTP 400-class refusal from `osa-memory serve`,
never an HTTP 500 or a traceback in its log."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Server

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

CALL_PREFIX = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "kb_memory_recall", '


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


#: (case, body): each must be refused cleanly.
BAD_BODIES: list[tuple[str, bytes]] = [
    ("arrays nested 5000 deep", nested(5000)),
    ("arguments nested 5000 deep", CALL_PREFIX + b'"arguments": {"query": ' + nested(5000) + b"}}}"),
    ("arguments nested 500 deep", CALL_PREFIX + b'"arguments": {"query": ' + nested(500) + b"}}}"),
    ("objects nested 5000 deep", b'{"a": ' * 5000 + b"1" + b"}" * 5000),
    ("a 0xFF byte", b'{"jsonrpc": "2.0", "id": 1, "method": "ping"\xff}'),
    ("0xFF bytes inside a string", CALL_PREFIX + b'"arguments": {"query": "caf\xff\xfe"}}}'),
    ("a truncated UTF-8 sequence", b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "x": "\xe2\x82"}'),
    ("a 5000-digit id", b'{"jsonrpc": "2.0", "id": ' + b"9" * 5000 + b', "method": "ping"}'),
    ("a 5000-digit argument", CALL_PREFIX + b'"arguments": {"query": "q", "limit": ' + b"1" * 5000 + b"}}}"),
    ("a lone surrogate as the method", b'{"jsonrpc": "2.0", "id": 1, "method": "\\ud800"}'),
    ("a lone surrogate as the id", b'{"jsonrpc": "2.0", "id": "\\udc00", "method": "ping"}'),
    (
        "a lone surrogate as the tool name",
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "\\udfff", "arguments": {}}}',
    ),
    ("an empty body", b""),
    ("null", b"null"),
    ("an empty batch", b"[]"),
    ("a number", b"1e999999"),
]


def post(server: Server, token: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        server.url,
        content=body,
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            **headers,
        },
        timeout=60,
    )


def json_rpc_error(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC error object of an answer (the SSE framing of a 200 answer removed)."""
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = "".join(line.removeprefix("data:") for line in text.splitlines() if line.startswith("data:"))
    error: dict[str, Any] = json.loads(text)["error"]
    return error


@pytest.fixture(scope="module")
def token(server: Server) -> str:
    return str(server.token("asg-http-bad-input")["token"])


@pytest.mark.parametrize(("case", "body"), BAD_BODIES, ids=[case for case, _ in BAD_BODIES])
def test_a_bad_body_gets_a_clean_refusal(server: Server, token: str, case: str, body: bytes) -> None:
    before = server.log.stat().st_size
    answer = post(server, token, body)
    assert answer.status_code < 500, f"{case}: HTTP {answer.status_code} {answer.text[:300]}"
    error = json_rpc_error(answer)
    assert isinstance(error["code"], int), error
    assert error["code"] < 0, error
    assert error["message"], error
    if answer.status_code == 200:  # a JSON-RPC answer to a message that was read: it is an error all the same
        assert answer.headers["content-type"].startswith(("application/json", "text/event-stream"))
    else:
        assert 400 <= answer.status_code < 500
    with server.log.open("rb") as log:
        log.seek(before)
        written = log.read().decode("utf-8", "replace")
    assert "Traceback" not in written, f"{case}:\n{written}"
    assert " 500" not in written, f"{case}:\n{written}"


def test_the_refusals_say_what_was_wrong(server: Server, token: str) -> None:
    deep = post(server, token, nested(5000))
    assert deep.status_code == 400
    assert deep.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Parse error: JSON nested deeper than 32 levels"},
    }
    not_utf8 = post(server, token, b'{"jsonrpc": "2.0", "id": 1, "method": "ping"\xff}')
    assert not_utf8.status_code == 400
    assert not_utf8.json()["error"] == {
        "code": -32700,
        "message": "Parse error: the body must be UTF-8 JSON; byte 44 (0xff) is not UTF-8",
    }
    utf16 = post(server, token, '{"jsonrpc": "2.0", "id": 1, "method": "ping"}'.encode("utf-16"))
    assert utf16.status_code == 400
    assert utf16.json()["error"]["message"].startswith("Parse error: the body must be UTF-8 JSON")


def test_a_request_nested_within_the_limit_still_works(server: Server, token: str) -> None:
    """The check refuses only what is too deep: an ordinary call with many brackets in its text is served."""
    query = "[{(" * 40 + "brackets"
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "kb_memory_recall", "arguments": {"query": query, "limit": 3}},
        }
    ).encode()
    answer = post(server, token, body)
    assert answer.status_code == 200, answer.text
    assert '"isError":false' in answer.text.replace(" ", ""), answer.text
