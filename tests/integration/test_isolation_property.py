"""Property: random interleavings of store / propose / feedback / forget / read / list / recall across
several orgs and assignments never return or alter another scope's fact."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from haystack_osa_memory import Caller, Memory
from haystack_osa_memory.errors import NotFoundError
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import drop_schema, new_schema_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCOPES = [
    Caller(org_id="acme", assignment_id="a1", token_id="t-acme-a1"),
    Caller(org_id="acme", assignment_id="a2", token_id="t-acme-a2"),
    Caller(org_id="globex", assignment_id="a1", token_id="t-globex-a1"),
    Caller(org_id="globex", assignment_id="b7", token_id="t-globex-b7"),
]
# Shared words across scopes so that every query matches other scopes' facts too.
TEXTS = [
    "the deploy key rotates weekly",
    "the staging deploy needs the VPN",
    "cache the build artifacts on NFS",
    "the deploy key lives in the vault",
]
QUERIES = ["deploy key", "staging VPN deploy", "build cache NFS", "vault"]

operation = st.tuples(
    st.sampled_from(["store", "propose", "confirm", "flag", "forget", "read", "list", "recall"]),
    st.integers(0, len(SCOPES) - 1),  # who acts
    st.integers(0, len(TEXTS) - 1),  # which text / query
    st.integers(0, 50),  # which known document to target (any scope's)
)


@pytest.fixture(scope="module")
def shared_memory_kb(pg_conn_str: str) -> Any:
    """One knowledge base for all examples, with the owner of every document ever created in it."""
    config = new_schema_config(pg_conn_str)
    ensure_schema(pg_conn_str, config)
    owners: dict[str, int] = {}
    yield Memory(config, use_default_embedders=False), owners
    drop_schema(pg_conn_str, config.kb_schema)


def _state(memory: Memory, caller: Caller, doc: str) -> dict[str, Any] | None:
    """A fact's observable state as its owner sees it (reading records a read event, so use list)."""
    assert memory.lifecycle is not None
    for status in ("approved", "proposed", "flagged", "rejected"):
        cursor = None
        while True:
            page = memory.list_facts(status=status, cursor=cursor, caller=caller)
            for fact in page["facts"]:
                if fact["document_id"] == doc:
                    return fact
            cursor = page["next_cursor"]
            if cursor is None:
                break
    return None


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(operation, min_size=5, max_size=25))
def test_no_call_returns_or_alters_another_scopes_fact(
    shared_memory_kb: tuple[Memory, dict[str, int]], ops: list[Any]
) -> None:
    memory, owner = shared_memory_kb  # owner: document id -> index of the scope that created it
    memory.warm_up()
    for kind, who, text_index, target_index in ops:
        caller = SCOPES[who]
        text = f"{TEXTS[text_index]} ({caller.org_id}/{caller.assignment_id} #{target_index % 3})"
        known = sorted(owner)
        target = known[target_index % len(known)] if known else "f" * 64
        foreign = target in owner and owner[target] != who
        before = _state(memory, SCOPES[owner[target]], target) if foreign else None
        try:
            if kind == "store":
                owner[memory.store(text, caller=caller)["document_id"]] = who
            elif kind == "propose":
                result = memory.propose("fact", f"P{target_index}", text + " proposal", caller=caller)
                if "document_id" in result:
                    owner[result["document_id"]] = who
            elif kind in ("confirm", "flag"):
                memory.feedback(target, kind, caller=caller)
            elif kind == "forget":
                memory.forget(target, "property test", caller=caller)
            elif kind == "read":
                got = memory.read(target, caller=caller)
                assert owner[got["document_id"]] == who
            elif kind == "list":
                for fact in memory.list_facts(caller=caller)["facts"]:
                    assert owner[fact["document_id"]] == who
            else:
                for fact in memory.recall(QUERIES[text_index], limit=20, caller=caller)["facts"]:
                    assert owner[fact["document_id"]] == who, "recall returned another scope's fact"
        except NotFoundError:
            assert target not in owner or foreign or kind in ("read", "confirm", "flag", "forget")
        else:
            assert not (foreign and kind in ("read", "confirm", "flag", "forget")), f"{kind} reached a foreign fact"
        if foreign:
            assert _state(memory, SCOPES[owner[target]], target) == before, f"{kind} altered a foreign fact"
