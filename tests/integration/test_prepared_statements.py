"""Prepared statements (`prepared_statements`, on by default): a call's statements are prepared on the pool's
connections and planned for their own parameters on every run (`plan_cache_mode = force_custom_plan`), never
with a generic plan; off, nothing is prepared. The answers are the same either way."""

from __future__ import annotations

from typing import Any

import pytest

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.database import PREPARE_AFTER, connection_kwargs, get_pool

pytestmark = pytest.mark.integration

PREPARED = "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"


def _sessions(config: MemoryConfig) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """``plan_cache_mode`` and the prepared statements of every idle connection of the pool (each checked out once,
    all at once, so that none is seen twice)."""
    pool = get_pool(config.pg_conn_str or "", config)
    held = []
    try:
        while pool.get_stats().get("pool_available", 0):
            held.append(pool.getconn())
        return [
            (str(conn.execute("SHOW plan_cache_mode").fetchone()[0]), conn.execute(PREPARED).fetchall())  # type: ignore[index]
            for conn in held
        ]
    finally:
        for conn in held:
            pool.putconn(conn)


def _work(memory: Memory, alice: Caller, bob: Caller) -> list[list[str]]:
    memory.store("The launch review is on Thursday with the vendor", caller=alice)
    memory.store("The budget for the vendor is 40k", caller=alice)
    memory.store("The vendor of the other team is Initech", caller=bob)
    memory.store("The vendor call moved to Friday", caller=alice)
    answers = []
    for _ in range(12):  # more runs than PostgreSQL's five before it would consider a generic plan
        answers.append([f["content"] for f in memory.recall("vendor launch budget", caller=alice)["facts"]])
        memory.store("The vendor call moved to Friday", caller=alice)  # the same fact: written in place
    return answers


def test_connection_settings_follow_the_setting() -> None:
    on = connection_kwargs(MemoryConfig())
    assert on["prepare_threshold"] == PREPARE_AFTER
    assert "plan_cache_mode=force_custom_plan" in on["options"]
    off = connection_kwargs(MemoryConfig(prepared_statements=False))
    assert off["prepare_threshold"] is None
    assert "plan_cache_mode=force_custom_plan" in off["options"]  # custom plans whatever prepares
    assert connection_kwargs(MemoryConfig(), prepared=False)["prepare_threshold"] is None


def test_a_calls_statements_are_prepared_with_custom_plans_only(
    memory: Memory, config: MemoryConfig, alice: Caller, bob: Caller
) -> None:
    answers = _work(memory, alice, bob)
    assert all(a == answers[0] for a in answers)
    assert answers[0]
    assert not any("Initech" in fact for fact in answers[0])
    sessions = _sessions(config)
    assert sessions
    assert all(mode == "force_custom_plan" for mode, _ in sessions)
    ours = [row for _, rows in sessions for row in rows if config.kb_schema in str(row[0])]
    assert len(ours) >= 5, "a recall's and a store's statements were not prepared"
    planned = [row for row in ours if str(row[0]).lstrip().upper().startswith(("SELECT", "WITH", "INSERT"))]
    assert sum(row[2] for row in planned) >= 20
    assert [row for row in planned if row[1]] == [], "a statement ran with a generic plan"


def test_nothing_is_prepared_when_the_setting_is_off(config: MemoryConfig, alice: Caller, bob: Caller) -> None:
    off = config.model_copy(update={"prepared_statements": False})
    on_answers = _work(Memory(config, use_default_embedders=False), alice, bob)
    off_answers = _work(Memory(off, use_default_embedders=False), alice, bob)
    assert off_answers == on_answers
    sessions = _sessions(off)
    assert sessions
    assert all(mode == "force_custom_plan" for mode, _ in sessions)
    assert [row for _, rows in sessions for row in rows] == []
