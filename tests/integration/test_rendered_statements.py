"""Statements rendered once (`database.rendered`) are the bytes psycopg renders on a real connection without
their lines' indentation (`database.compact`: literals, quoted identifiers and comments kept as they are), short
enough for psycopg to parse each once, and a store and a recall still run through them."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.errors import ConfigurationError
from haystack_osa_memory.store import facts as facts_module
from haystack_osa_memory.store.database import compact, rendered
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.store.tokens import TokenStore

pytestmark = pytest.mark.integration


def test_rendered_is_what_psycopg_sends_on_a_connection(pg_conn_str: str, config: MemoryConfig) -> None:
    names = config.sql_names()
    repo = facts_module.FactRepository(pg_conn_str, config)
    composed = {
        "scope rows": repo.scope_rows_statement,
        "scope facts": facts_module.SCOPE_FACTS.format(
            **names,
            valid_at=facts_module.VALID_AT,
            governing_row=facts_module.governing_row_by_id(names, sql.SQL("r.document_id")),
        ),
        "governing rows": facts_module.GOVERNING_ROWS.format(**names),
    }
    ours = {"scope rows": repo._scope_rows, "scope facts": repo._scope_facts, "governing rows": repo._governing_rows}
    with psycopg.connect(pg_conn_str) as conn, conn.cursor() as cur:
        for name, statement in composed.items():
            assert ours[name] == compact(statement.as_bytes(cur)), name
    # Every statement a store, a recall and a token check run is rendered, not composed again per call.
    lifecycle = LifecycleRepository(pg_conn_str, config)
    tokens = TokenStore(pg_conn_str, config)
    held = [repo._write_fact, repo._inherit_terms, repo._big_rows, lifecycle._q["IS_OFF"], tokens._select_with_switch]
    assert all(isinstance(s, bytes) and s.isascii() for s in held)


def test_every_statement_is_short_enough_for_psycopg_to_parse_it_once(pg_conn_str: str, config: MemoryConfig) -> None:
    # psycopg parses a longer statement's placeholders again on every execute (docs/traps.md).
    repos = [
        facts_module.FactRepository(pg_conn_str, config),
        LifecycleRepository(pg_conn_str, config),
        TokenStore(pg_conn_str, config),
    ]
    statements = {
        f"{type(repo).__name__}.{name}": value
        for repo in repos
        for name, value in [*vars(repo).items(), *getattr(repo, "_q", {}).items()]
        if isinstance(value, bytes)
    }
    assert "FactRepository._write_fact" in statements
    too_long = {name: len(s) for name, s in statements.items() if len(s) > MAX_CACHED_STATEMENT_LENGTH}
    assert too_long == {}


def test_compacting_keeps_literals_identifiers_and_comments(pg_conn_str: str) -> None:
    raw = (
        b"SELECT 'a\n    b' AS plain,\n"
        b"       E'it\\'s\n    x' AS escaped,  -- the fact's text, 'quoted'\n"
        b"       $tag$ one\n    two $tag$ AS dollar,\n"
        b'       "we\n   ird" FROM (SELECT 1 AS "we\n   ird") t /* a\n   block */'
    )
    small = compact(raw)
    assert b"\n       " not in small  # the indentation between them went
    assert len(small) < len(raw)
    with psycopg.connect(pg_conn_str) as conn:
        assert (
            conn.execute(small).fetchone()
            == conn.execute(raw).fetchone()
            == (
                "a\n    b",
                "it's\n    x",
                " one\n    two ",
                1,
            )
        )


def test_a_quoted_identifier_renders_as_on_a_connection(pg_conn_str: str) -> None:
    statement = sql.SQL("SELECT {} FROM (SELECT 1 AS {}) t").format(sql.Identifier('we"ird'), sql.Identifier('we"ird'))
    with psycopg.connect(pg_conn_str) as conn:
        assert rendered(statement) == statement.as_bytes(conn)
        assert conn.execute(rendered(statement)).fetchone() == (1,)


def test_a_non_ascii_statement_is_refused_with_what_is_allowed() -> None:
    with pytest.raises(ConfigurationError, match="must be ASCII"):
        rendered(sql.SQL("SELECT 1 FROM {}").format(sql.Identifier("schéma")))


def test_store_and_recall_run_through_the_rendered_statements(memory: Memory, alice: Caller, bob: Caller) -> None:
    memory.store("staging deploys go through the blue VPN profile", "ops", caller=alice)
    memory.store("staging deploys go through the red VPN profile", "ops", caller=bob)
    facts = memory.recall("which VPN profile for staging deploys?", limit=5, caller=alice)["facts"]
    assert [f["content"] for f in facts] == ["staging deploys go through the blue VPN profile"]
