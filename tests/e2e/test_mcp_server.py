"""End to end: `osa-memory serve` in its own process, driven by the official MCP client over HTTP."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from mcp import ClientSession

from tests.conftest import row_counts
from tests.e2e.conftest import Server, call, with_session

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

OUR_TOOLS = {
    "kb_memory_store",
    "kb_memory_recall",
    "kb_memory_read",
    "kb_memory_feedback",
    "kb_memory_propose",
    "kb_memory_forget",
    "kb_memory_list",
    "kb_memory_scopes",
    "kb_memory_status",
    "kb_memory_reflect",
}


def test_only_our_tools_are_listed(server: Server) -> None:
    token = server.token("asg-list")["token"]

    async def names(session: ClientSession) -> dict[str, Any]:
        return {t.name: t for t in (await session.list_tools()).tools}

    tools = with_session(server.url, token, names)
    assert set(tools) == OUR_TOOLS
    store = tools["kb_memory_store"]
    assert store.description
    assert store.description.startswith("Store a durable fact")
    props = store.inputSchema["properties"]
    assert set(props) == {"fact", "topic", "kind", "ttl_days", "supersedes", "valid_from", "valid_to", "assignment"}
    assert store.inputSchema["additionalProperties"] is False
    assert tools["kb_memory_recall"].inputSchema["properties"]["limit"]["maximum"] == 20


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        (
            "deploy_pipeline",
            {"name": "evil", "files": {"pipeline_wrapper.py": "import os"}, "save_files": False, "overwrite": True},
        ),
        ("undeploy_pipeline", {"pipeline_name": "kb_memory_store"}),
        ("get_all_pipeline_statuses", {}),
        ("get_pipeline_status", {"pipeline_name": "kb_memory_store"}),
        ("hidden_tool", {}),
    ],
)
def test_core_and_unknown_tools_are_refused(server: Server, tool: str, arguments: dict[str, Any]) -> None:
    token = server.token("asg-refuse")["token"]
    before = row_counts(server.pg_conn_str, server.config)
    is_error, text = call(server.url, token, tool, arguments)
    assert is_error
    assert "Unknown tool" in text
    assert row_counts(server.pg_conn_str, server.config) == before
    # the store tool still works after the refusal
    is_error, _ = call(server.url, token, "kb_memory_store", {"fact": "still serving"})
    assert not is_error


def test_store_recall_and_restart(server: Server) -> None:
    token = server.token("asg-restart")["token"]
    is_error, stored = call(
        server.url, token, "kb_memory_store", {"fact": "The staging VPN profile is called stg-eu", "topic": "vpn"}
    )
    assert not is_error
    assert stored["stored"] is True
    assert stored["assignment_id"] == "asg-restart"
    # identifiers, a count, and the facts it may replace (none here)
    assert set(stored) == {"stored", "assignment_id", "document_id", "redactions", "possibly_supersedes"}
    assert stored["possibly_supersedes"] == []
    server.stop()
    server.start()
    is_error, recalled = call(server.url, token, "kb_memory_recall", {"query": "staging VPN profile", "limit": 3})
    assert not is_error
    assert recalled["assignment_id"] == "asg-restart"
    (fact,) = recalled["facts"]
    assert fact["content"] == "The staging VPN profile is called stg-eu"
    assert fact["document_id"] == stored["document_id"]
    assert fact["topic"] == "vpn"
    assert set(fact) == {
        "document_id",
        "content",
        "topic",
        "score",
        "stored_at",
        "kind",
        "stale",
        "valid_from",
        "valid_to",
    }


def test_two_tokens_never_see_each_other(server: Server) -> None:
    t1 = server.token("asg-one")["token"]
    t2 = server.token("asg-two")["token"]
    _, s1 = call(server.url, t1, "kb_memory_store", {"fact": "Shared wording: the deploy key rotates weekly"})
    _, s2 = call(server.url, t2, "kb_memory_store", {"fact": "Shared wording: the deploy key rotates weekly"})
    _, only2 = call(server.url, t2, "kb_memory_store", {"fact": "Assignment two secret: the canary is pod-7"})
    assert s1["document_id"] != s2["document_id"]
    _, r1 = call(server.url, t1, "kb_memory_recall", {"query": "deploy key rotates canary pod", "limit": 20})
    _, r2 = call(server.url, t2, "kb_memory_recall", {"query": "deploy key rotates canary pod", "limit": 20})
    assert [f["document_id"] for f in r1["facts"]] == [s1["document_id"]]
    assert {f["document_id"] for f in r2["facts"]} == {s2["document_id"], only2["document_id"]}
    assert r1["assignment_id"] == "asg-one"


def test_scope_argument_cannot_be_smuggled(server: Server) -> None:
    token = server.token("asg-smuggle")["token"]
    before = row_counts(server.pg_conn_str, server.config)
    for args in (
        {"fact": "x", "assignment_id": "asg-one"},
        {"fact": "x", "org_id": "globex"},
        {"fact": "x", "headers": {"authorization": "y"}},
    ):
        is_error, text = call(server.url, token, "kb_memory_store", args)
        assert is_error, args
        assert "unknown argument" in text
    assert row_counts(server.pg_conn_str, server.config) == before


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("kb_memory_store", {"fact": ""}, "fact"),
        ("kb_memory_store", {"fact": "x" * 2001}, "fact"),
        ("kb_memory_store", {"fact": "   "}, "visible character"),
        ("kb_memory_store", {"fact": "nul\u0000byte"}, "NUL"),
        ("kb_memory_store", {"fact": 42}, "fact"),
        ("kb_memory_store", {"fact": "ok", "topic": "t" * 121}, "topic"),
        ("kb_memory_store", {"fact": "ok", "topic": 7}, "topic"),
        ("kb_memory_store", {}, "fact"),
        ("kb_memory_store", {"fact": "<!-- osa-memory:scope asg-one -->\nspoof"}, "reserved"),
        ("kb_memory_recall", {"query": ""}, "query"),
        ("kb_memory_recall", {"query": "q" * 1001}, "query"),
        ("kb_memory_recall", {"query": "ok", "limit": 0}, "limit"),
        ("kb_memory_recall", {"query": "ok", "limit": 21}, "limit"),
        ("kb_memory_recall", {"query": "ok", "limit": "many"}, "limit"),
        ("kb_memory_recall", {"query": "ok", "extra": 1}, "unknown argument"),
    ],
)
def test_bad_input_is_an_error_and_writes_nothing(
    server: Server, tool: str, arguments: dict[str, Any], expected: str
) -> None:
    token = server.token("asg-bad")["token"]
    before = row_counts(server.pg_conn_str, server.config)
    is_error, text = call(server.url, token, tool, arguments)
    assert is_error
    assert expected in text
    assert row_counts(server.pg_conn_str, server.config) == before


def test_lone_surrogate_is_an_error_and_writes_nothing(server: Server) -> None:
    """Sent as raw JSON (the escape \\ud800 is valid JSON text; Python clients refuse to encode it)."""
    token = server.token("asg-surrogate")["token"]
    before = row_counts(server.pg_conn_str, server.config)
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "kb_memory_store", "arguments": {"fact": "lone \ud800 surrogate"}},
    }
    raw = json.dumps(body)  # ensure_ascii: the surrogate travels as an escape
    assert "\\ud800" in raw
    response = httpx.post(
        server.url,
        content=raw,
        timeout=10,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
    )
    assert response.status_code == 200
    assert '"isError":true' in response.text.replace(" ", "")
    assert "surrogate" in response.text
    assert row_counts(server.pg_conn_str, server.config) == before


def _post(server: Server, headers: dict[str, str]) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    return httpx.post(
        server.url, json=body, timeout=10, headers={"Accept": "application/json, text/event-stream", **headers}
    )


def test_unauthenticated_requests_get_401(server: Server) -> None:
    issued = server.token("asg-auth", via_cli=True)
    assert issued["token"].startswith("osam_")
    assert _post(server, {}).status_code == 401
    assert _post(server, {"Authorization": "Basic abc"}).status_code == 401
    assert _post(server, {"Authorization": "Bearer osam_0123456789abcdef_" + "A" * 43}).status_code == 401
    assert _post(server, {"Authorization": "Bearer " + issued["token"][:-1] + "x"}).status_code == 401
    ok = _post(server, {"Authorization": f"Bearer {issued['token']}"})
    assert ok.status_code == 200
    revoked = server.cli("token", "revoke", issued["token_id"])
    assert revoked.returncode == 0, revoked.stderr
    response = _post(server, {"Authorization": f"Bearer {issued['token']}"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_expired_token_gets_401(server: Server) -> None:
    issued = server.token("asg-expiring", "acme", "--expires-in", "2s")
    assert _post(server, {"Authorization": f"Bearer {issued['token']}"}).status_code == 200
    time.sleep(2.5)
    assert _post(server, {"Authorization": f"Bearer {issued['token']}"}).status_code == 401


def test_other_routes_are_not_served(server: Server) -> None:
    token = server.token("asg-routes")["token"]
    for path in ("/sse", "/messages/", "/deploy_pipeline", "/docs", "/openapi.json"):
        r = httpx.get(f"http://127.0.0.1:{server.port}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert r.status_code == 404, path
    assert httpx.get(f"http://127.0.0.1:{server.port}/status", timeout=5).json() == {"status": "ok"}


def test_database_trouble_is_a_clear_error_and_the_server_keeps_serving(
    pg_conn_str: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import threading

    import psycopg
    from psycopg import sql

    from haystack_osa_memory.store.schema import ensure_schema
    from tests.conftest import drop_schema, new_schema_config

    config = new_schema_config(pg_conn_str)
    ensure_schema(pg_conn_str, config)
    srv = Server(config, pg_conn_str, tmp_path_factory.mktemp("trouble") / "server.log")
    srv.env = lambda: {**Server.env(srv), "OSA_MEMORY_STATEMENT_TIMEOUT_MS": "2500"}  # type: ignore[method-assign]
    srv.start()
    try:
        token = srv.token("asg-trouble")["token"]
        assert not call(srv.url, token, "kb_memory_store", {"fact": "before the trouble"})[0]
        locked, release = threading.Event(), threading.Event()

        def hold_lock() -> None:
            with psycopg.connect(pg_conn_str) as conn:
                conn.execute(
                    sql.SQL("LOCK TABLE {}.{} IN ACCESS EXCLUSIVE MODE").format(
                        sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table)
                    )
                )
                locked.set()
                release.wait(30)

        holder = threading.Thread(target=hold_lock)
        holder.start()
        assert locked.wait(10)
        try:
            start = time.monotonic()
            is_error, text = call(srv.url, token, "kb_memory_store", {"fact": "during the trouble"})
            assert time.monotonic() - start < 10
            assert is_error
            assert "database error" in text
            assert "statement timeout" in text
        finally:
            release.set()
            holder.join()
        assert not call(srv.url, token, "kb_memory_store", {"fact": "after the trouble"})[0]
        _, recalled = call(srv.url, token, "kb_memory_recall", {"query": "trouble", "limit": 10})
        assert sorted(f["content"] for f in recalled["facts"]) == ["after the trouble", "before the trouble"]
    finally:
        srv.stop()
        drop_schema(pg_conn_str, config.kb_schema)
