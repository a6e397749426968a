"""Tokens that grant several assignments: kb_memory_scopes and the validated `assignment` argument."""

from __future__ import annotations

import pytest

from tests.conftest import row_counts
from tests.e2e.conftest import Server, call

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_multi_assignment_token(server: Server) -> None:
    issued = server.token("asg-main", "acme", "--assignment", "asg-side", via_cli=True)
    token = issued["token"]
    assert issued["assignments"] == ["asg-main", "asg-side"]
    _, scopes = call(server.url, token, "kb_memory_scopes", {})
    assert scopes == {"org_id": "acme", "default_assignment": "asg-main", "assignments": ["asg-main", "asg-side"]}
    _, main = call(server.url, token, "kb_memory_store", {"fact": "Main assignment fact about kites"})
    _, side = call(
        server.url, token, "kb_memory_store", {"fact": "Side assignment fact about kites", "assignment": "asg-side"}
    )
    assert (main["assignment_id"], side["assignment_id"]) == ("asg-main", "asg-side")
    _, default = call(server.url, token, "kb_memory_recall", {"query": "kites"})
    assert [f["content"] for f in default["facts"]] == ["Main assignment fact about kites"]
    _, other = call(server.url, token, "kb_memory_recall", {"query": "kites", "assignment": "asg-side"})
    assert [f["content"] for f in other["facts"]] == ["Side assignment fact about kites"]
    _, status = call(server.url, token, "kb_memory_status", {"assignment": "asg-side"})
    assert status["scope"]["assignment_id"] == "asg-side"

    single = server.token("asg-single")["token"]
    before = row_counts(server.pg_conn_str, server.config)
    is_error, text = call(server.url, token, "kb_memory_store", {"fact": "x", "assignment": "asg-other"})
    assert is_error
    assert "not granted" in text
    is_error, text = call(server.url, single, "kb_memory_recall", {"query": "kites", "assignment": "asg-main"})
    assert is_error
    assert "not granted" in text
    assert row_counts(server.pg_conn_str, server.config) == before
