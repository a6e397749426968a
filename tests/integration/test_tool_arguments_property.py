"""Every tool, driven with any arguments through the MCP server an agent talks to (the locked-down Hayhooks
server of `osa-memory serve`, in process), on a real database: each call gets a result or a typed,
human-readable refusal; never an internal error, a traceback or a database error's text. And every tool,
`kb_memory_scopes` included, refuses while a kill switch is off.

The tools are read from `tools.SPECS`, so a tool added later is driven too."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.types import CallToolResult, TextContent

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory import memory as memory_module
from haystack_osa_memory.caller import caller_scope
from haystack_osa_memory.errors import MemoryOffError
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.tools import SPECS
from tests.conftest import drop_schema, new_schema_config, row_counts
from tests.integration import test_side_channels_outage
from tests.integration.test_side_channels_outage import OutageDb

pytestmark = [pytest.mark.integration, pytest.mark.slow]

outage_db = test_side_channels_outage.outage_db  # the fixture: a PostgreSQL of the test's own, stoppable

CALLER = Caller(org_id="acme", assignment_id="asg-alpha", specialist_id="spec-1", grants=("asg-beta",))
OFF = MemoryOffError.MESSAGE
#: What must never reach an agent: our own wrapper's internal-error text, a traceback, a database's words.
LEAKS = re.compile(
    r"internal error|Traceback|File \"|psycopg|InvalidDatetimeFormat|DataError|cannot contain NUL \(0x00\)|"
    r"invalid input syntax|syntax error|violates|\bLINE \d|\bERROR:|OverflowError|UnicodeEncodeError|RecursionError",
    re.IGNORECASE,
)


def _cursor(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


EDGE_DATES = [
    "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+23:59",
    "0001-01-01",
    "9999-12-31",
    "2026-02-30",
    "2026-W10-1",
    "20260301T093000Z",
    "2026-03-01T24:00:00",
    "1899-12-31",
    "2026-03-01T09:30:00+01:00",
    "2026-03-01",
]
EDGE_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "fact \udfff",
    "\uffff",
    "\U0010ffff",
    "\ue000",
    "\u0378",
    "\u200b\u2060\ufeff",
    "<!-- osa-memory: x -->",
    "x" * 2001,
    "what changed on 9999-12-31?",
    "March 0000",
    "host10.12.34.56 tokenxoxb-1234567890-aB3dE6xY9zaB3dE6xY9z",
    "postgresql%3A%2F%2Fadmin%3Ahunter2x%40db",
    "ＡＫＩＡＩＯＳＦＯＤＮＮ７ＥＸＡＭＰＬＥ",  # noqa: RUF001
    "' OR 1=1 --",
    "%s %(x)s {} {0}",
    "\\",
    "🙂" * 10,
]
FORGED_CURSORS = [
    _cursor(["2026-03-01T00:00:00+00:00", "\ud800"]),
    _cursor(["2026-03-01T00:00:00+00:00", "a\x00b"]),
    _cursor(["2026-03-01T00:00:00\x00", "ab" * 32]),
    _cursor(["not a date", "ab" * 32]),
    _cursor(["9999-12-31T23:59:59-23:59", "ab" * 32]),
    _cursor(["2026-W10-1", "ab" * 32]),
    base64.urlsafe_b64encode(b"[" * 360).decode(),
    base64.urlsafe_b64encode(b"\xff\xfe").decode(),
]


@dataclass
class Harness:
    portal: BlockingPortal
    session: ClientSession
    config: MemoryConfig
    pg_conn_str: str
    ids: list[str]
    next_cursor: str

    def call(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        result: CallToolResult = self.portal.call(self.session.call_tool, name, arguments)
        return result


def text_of(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def assert_answered_or_refused(result: CallToolResult) -> None:
    """A result that matches the tool's result model, or a typed refusal in words."""
    text = text_of(result)
    assert text.strip(), "an answer without text"
    assert not LEAKS.search(text), text
    if not result.isError:
        assert isinstance(result.structuredContent, dict), text


@asynccontextmanager
async def _session_as(caller: Caller) -> AsyncIterator[ClientSession]:
    from hayhooks.server.pipelines.loader import load_pipeline_registry
    from hayhooks.server.utils.mcp_utils import create_mcp_server

    from haystack_osa_memory.mcp.call_slots import CallSlots
    from haystack_osa_memory.mcp.server import _lock_down, default_pipelines_dir

    registry = load_pipeline_registry(default_pipelines_dir())
    server = create_mcp_server(name="osa-memory", registry=registry)
    _lock_down(server, registry, CallSlots(2, 0.05))  # as `serve` runs its calls (a loop per session here)
    # The server's tasks start inside this block and inherit the caller, as under the auth middleware.
    with caller_scope(caller):
        async with create_connected_server_and_client_session(server) as session:
            yield session


@pytest.fixture(scope="module")
def served(pg_conn_str: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """The MCP server of `serve` in process, on a knowledge base of its own, called as ``CALLER``.

    One for the module (loading the tools and storing a page of facts takes seconds on a busy machine):
    tests compare row counts before and after their own calls, and put back any switch they turn off.
    """
    config = new_schema_config(pg_conn_str)
    ensure_schema(pg_conn_str, config)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("PG_CONN_STR", pg_conn_str)
        monkeypatch.setenv("OSA_MEMORY_KB_SCHEMA", config.kb_schema)
        monkeypatch.setenv("OSA_MEMORY_SCHEMA", config.memory_schema)
        monkeypatch.setenv("OSA_MEMORY_EMBEDDER", "none")
        monkeypatch.setenv("OSA_MEMORY_BUFFER", str(tmp_path_factory.mktemp("buffer") / "buffer.jsonl"))
        monkeypatch.setattr(memory_module, "_shared", None)
        with start_blocking_portal() as portal, portal.wrap_async_context_manager(_session_as(CALLER)) as session:
            harness = Harness(portal, session, config, pg_conn_str, [], "")
            for i in range(21):  # more than a page, so that a real next_cursor exists
                stored = harness.call(
                    "kb_memory_store", {"fact": f"Deploy step {i} runs on host db-{i}", "topic": "ops"}
                )
                assert not stored.isError, text_of(stored)
                assert stored.structuredContent is not None
                harness.ids.append(stored.structuredContent["document_id"])
            listed = harness.call("kb_memory_list", {})
            assert listed.structuredContent is not None
            harness.next_cursor = listed.structuredContent["next_cursor"]
            assert harness.next_cursor
            yield harness
    drop_schema(pg_conn_str, config.kb_schema)


class TestRegressions:
    """Each of these answered "internal error" or a database error's text before."""

    @pytest.mark.parametrize("value", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"])
    def test_timestamps_past_the_calendar_are_refused(self, served: Harness, value: str) -> None:
        before = row_counts(served.pg_conn_str, served.config)
        calls = [
            ("kb_memory_recall", {"query": "deploy", "as_of": value}, "as_of"),
            ("kb_memory_store", {"fact": "A fact with an edge date", "valid_from": value}, "valid_from"),
            ("kb_memory_store", {"fact": "A fact with an edge date", "valid_to": value}, "valid_to"),
        ]
        for name, arguments, what in calls:
            result = served.call(name, arguments)
            assert result.isError
            assert text_of(result) == f"{what} must lie between the years 1900 and 9000 (UTC), got {value!r}"
        assert row_counts(served.pg_conn_str, served.config) == before

    @pytest.mark.parametrize("cursor", FORGED_CURSORS)
    def test_forged_cursors_are_refused_as_cursors(self, served: Harness, cursor: str) -> None:
        result = served.call("kb_memory_list", {"cursor": cursor})
        assert result.isError
        assert text_of(result) == "cursor is not valid: pass the next_cursor value of a previous kb_memory_list answer"

    def test_a_real_cursor_still_pages(self, served: Harness) -> None:
        result = served.call("kb_memory_list", {"cursor": served.next_cursor})
        assert not result.isError, text_of(result)
        assert result.structuredContent is not None
        assert [f["document_id"] for f in result.structuredContent["facts"]] == served.ids[20:]

    @pytest.mark.parametrize("fact", ["\uffff", "\U0010ffff", "\ue000", "\u0378"])
    def test_facts_without_visible_text_are_refused_and_nothing_is_written(self, served: Harness, fact: str) -> None:
        before = row_counts(served.pg_conn_str, served.config)
        result = served.call("kb_memory_store", {"fact": fact})
        assert result.isError
        assert text_of(result).startswith("fact must contain at least one visible character")
        assert f"U+{ord(fact):04X}" in text_of(result)
        assert row_counts(served.pg_conn_str, served.config) == before

    def test_a_query_naming_a_date_past_the_calendar_is_answered(self, served: Harness) -> None:
        for query in ("what changed on 9999-12-31?", "deploy plans for March 0000", "December 9999 deploy"):
            result = served.call("kb_memory_recall", {"query": query})
            assert not result.isError, text_of(result)

    def test_hidden_secrets_are_redacted_before_they_are_stored(self, served: Harness) -> None:
        fact = "Replica DSN postgresql%3A%2F%2Fadmin%3AWinter2026x%40db and host10.12.34.56"
        result = served.call("kb_memory_store", {"fact": fact})
        assert result.structuredContent is not None
        assert result.structuredContent["redactions"] == 2
        read = served.call("kb_memory_read", {"document_id": result.structuredContent["document_id"]})
        assert read.structuredContent is not None
        assert read.structuredContent["content"] == (
            "Replica DSN postgresql%3A%2F%2Fadmin%3A[REDACTED-PASSWORD]%40db and host[REDACTED-PRIVATE-IP]"
        )


def _minimal(name: str, harness: Harness) -> dict[str, Any]:
    """Arguments a tool accepts."""
    doc = harness.ids[0]
    return {
        "kb_memory_store": {"fact": "A fact while off"},
        "kb_memory_recall": {"query": "deploy"},
        "kb_memory_read": {"document_id": doc},
        "kb_memory_feedback": {"document_id": doc, "verdict": "confirm"},
        "kb_memory_propose": {"kind": "fact", "title": "t", "body": "a proposal"},
        "kb_memory_forget": {"document_id": doc, "reason": "why"},
        "kb_memory_list": {},
        "kb_memory_reflect": {},
        "kb_memory_status": {},
        "kb_memory_scopes": {},
    }.get(name, {})


class TestKillSwitch:
    @pytest.mark.parametrize("target", [("acme", "asg-alpha"), ("acme", "*")], ids=["assignment", "org"])
    def test_every_tool_refuses_while_off(self, served: Harness, target: tuple[str, str]) -> None:
        repo = LifecycleRepository(served.pg_conn_str, served.config)
        repo.set_switch(*target, enabled=False, actor="cli:test", reason="incident")
        before = row_counts(served.pg_conn_str, served.config)
        answers = {name: served.call(name, _minimal(name, served)) for name in SPECS}
        assert {name: (r.isError, text_of(r)) for name, r in answers.items()} == dict.fromkeys(SPECS, (True, OFF))
        assert row_counts(served.pg_conn_str, served.config) == before
        repo.set_switch(*target, enabled=True, actor="cli:test", reason=None)
        scopes = served.call("kb_memory_scopes", {})
        assert scopes.structuredContent == {
            "org_id": "acme",
            "default_assignment": "asg-alpha",
            "assignments": ["asg-alpha", "asg-beta"],
        }

    def test_scopes_refuses_when_the_server_switch_is_off(self, config: MemoryConfig) -> None:
        memory = Memory(config.model_copy(update={"enabled": False}), use_default_embedders=False)
        with pytest.raises(MemoryOffError):
            memory.scopes(caller=CALLER)


def test_scopes_during_an_outage_answers_from_the_token_unless_the_scope_was_seen_off(outage_db: OutageDb) -> None:
    memory = Memory(outage_db.config, use_default_embedders=False)
    working = Caller(org_id="orgA", assignment_id="works", grants=("other",))
    killed = Caller(org_id="orgA", assignment_id="killme")
    LifecycleRepository(outage_db.uri, outage_db.config).set_switch(
        "orgA", "killme", enabled=False, actor="operator", reason=None
    )
    assert memory.scopes(caller=working)["assignments"] == ["works", "other"]
    with pytest.raises(MemoryOffError):
        memory.scopes(caller=killed)
    outage_db.down()
    assert memory.scopes(caller=working) == {
        "org_id": "orgA",
        "default_assignment": "works",
        "assignments": ["works", "other"],
    }
    with pytest.raises(MemoryOffError):
        memory.scopes(caller=killed)


# -- any arguments ---------------------------------------------------------------------------------------
_JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(EDGE_TEXT),
)
_ANY = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


_WORDS = st.sampled_from(["deploy", "host", "db", "step", "9999-12-31", "March 0000", "since", "last week", "ops"])
_PROSE = st.lists(_WORDS, min_size=1, max_size=6).map(" ".join)


def _values_for(argument: str, harness: Harness) -> st.SearchStrategy[Any]:
    """Values an agent might send for ``argument``: mostly well-formed ones (so that calls get past the
    schema and reach the memory), edge cases of its kind, and anything at all."""
    ids = st.sampled_from(harness.ids)
    valid: dict[str, st.SearchStrategy[Any]] = {
        "document_id": ids,
        "supersedes": st.lists(ids, max_size=2),
        "as_of": st.sampled_from(EDGE_DATES),
        "valid_from": st.sampled_from(EDGE_DATES),
        "valid_to": st.sampled_from(EDGE_DATES),
        "cursor": st.sampled_from([harness.next_cursor, *FORGED_CURSORS]),
        "assignment": st.sampled_from(["asg-alpha", "asg-beta"]),
        "kind": st.sampled_from(["fact", "procedure", "pitfall", "preference", "reference"]),
        "verdict": st.sampled_from(["confirm", "flag"]),
        "status": st.sampled_from(["approved", "proposed", "flagged", "rejected", "superseded"]),
        "limit": st.integers(min_value=1, max_value=20),
        "ttl_days": st.integers(min_value=1, max_value=3650),
        "include_superseded": st.booleans(),
        "paths": st.lists(st.sampled_from(["/home/alice/x", "src/app.py"]), max_size=3),
        "personas": st.lists(st.sampled_from(["reviewer", "ops"]), max_size=3),
    }
    shaped = valid.get(argument, _PROSE | st.text(min_size=1, max_size=40))
    edge = st.sampled_from(EDGE_TEXT) | st.text(max_size=80)
    if argument in ("assignment", "kind", "verdict", "status"):
        edge = edge | st.sampled_from(["asg-other", "*", "decision", "observation", "retired", "CONFIRM"])
    # one_of picks a branch uniformly: the well-formed value three times out of five.
    return st.one_of(shaped, shaped, shaped, edge, _ANY)


def _arguments(name: str, harness: Harness) -> st.SearchStrategy[dict[str, Any]]:
    fields = SPECS[name].Arguments.model_fields
    required = {f: _values_for(f, harness) for f, info in fields.items() if info.is_required()}
    optional = {f: _values_for(f, harness) for f, info in fields.items() if not info.is_required()}
    chosen = st.fixed_dictionaries(required, optional=optional)
    extra = st.dictionaries(st.sampled_from(["org_id", "scope", "x"]), _ANY, max_size=1)
    return st.tuples(chosen, extra | st.just({}) | st.just({})).map(lambda pair: {**pair[0], **pair[1]})


@pytest.mark.parametrize("name", list(SPECS))
def test_any_arguments_get_a_result_or_a_typed_refusal(served: Harness, name: str) -> None:
    @settings(
        max_examples=100,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(arguments=_arguments(name, served))
    def run(arguments: dict[str, Any]) -> None:
        assert_answered_or_refused(served.call(name, arguments))

    run()
