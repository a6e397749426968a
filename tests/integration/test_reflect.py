"""Reflect: deterministic consolidation of repeated facts, idempotent, scoped, audited."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from haystack.components.generators.chat import MockChatGenerator

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.embedders import build_embedders
from haystack_osa_memory.reflect import chat_summariser
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.store.schema import ensure_schema
from tests.conftest import drop_schema, new_schema_config

pytestmark = pytest.mark.integration

REPEATS = [
    "The nightly backup job runs at 02:00 UTC on db-main",
    "the nightly backup job runs at 02:00 UTC on db-main.",
    "Nightly backup job runs at 02:00 UTC on db-main and takes an hour",
]


def test_groups_become_one_observation_and_leave_recall(
    memory: Memory, alice: Caller, bob: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    raw = [memory.store(t, topic="backup", caller=alice)["document_id"] for t in REPEATS]
    lone = memory.store("Lunch orders close at eleven", caller=alice)["document_id"]
    bobs = memory.store(REPEATS[0], caller=bob)["document_id"]
    report = memory.reflect(caller=alice)
    assert report["groups"] == 1
    assert report["facts_consolidated"] == 3
    assert report["changed"] is True
    (obs,) = report["observations_created"]
    facts = memory.recall("nightly backup job", limit=20, caller=alice)["facts"]
    assert facts[0]["document_id"] == obs
    assert not set(raw) & {f["document_id"] for f in facts}  # consolidated facts left recall
    assert facts[0]["kind"] == "observation"
    assert facts[0]["content"].startswith(REPEATS[2])  # the most complete member
    assert facts[0]["content"].endswith("(consolidated from 3 facts)")
    got = memory.read(obs, caller=alice)
    assert (got["evidence"], got["count"], got["topic"]) == (raw, 3, "backup")
    assert memory.recall("lunch orders", caller=alice)["facts"][0]["document_id"] == lone
    # other scopes are untouched
    assert [f["document_id"] for f in memory.recall("nightly backup", caller=bob)["facts"]] == [bobs]
    repo = LifecycleRepository(pg_conn_str, config)
    assert "reflect" in [a["action"] for a in repo.audit(assignment_id="asg-alpha")]


def test_reflect_is_idempotent_and_absorbs_new_repeats(memory: Memory, alice: Caller) -> None:
    for t in REPEATS:
        memory.store(t, caller=alice)
    first = memory.reflect(caller=alice)
    second = memory.reflect(caller=alice)
    assert second == {**second, "groups": 0, "facts_consolidated": 0, "changed": False}
    (obs,) = first["observations_created"]
    newcomer = memory.store("THE NIGHTLY BACKUP JOB RUNS AT 02:00 UTC ON DB-MAIN!", caller=alice)["document_id"]
    third = memory.reflect(caller=alice)
    assert (third["observations_created"], third["observations_updated"], third["facts_consolidated"]) == ([], [obs], 1)
    assert memory.read(obs, caller=alice)["count"] == 4
    assert newcomer in memory.read(obs, caller=alice)["evidence"]
    assert memory.reflect(caller=alice)["changed"] is False


def test_optional_summariser_is_any_chat_generator(memory: Memory, alice: Caller) -> None:
    for t in REPEATS:
        memory.store(t, caller=alice)
    summariser = chat_summariser(MockChatGenerator(responses="Backups: nightly at 02:00 UTC on db-main (1 h)."))
    report = memory.reflect(caller=alice, summariser=summariser)
    facts = memory.recall("backups nightly", caller=alice)["facts"]
    assert [f["document_id"] for f in facts] == report["observations_created"]
    assert facts[0]["content"].startswith("Backups: nightly at 02:00 UTC on db-main (1 h).")


@pytest.fixture
def hybrid_memory(pg_conn_str: str) -> Iterator[Memory]:
    cfg = new_schema_config(pg_conn_str, embedder="minilm")
    ensure_schema(pg_conn_str, cfg)
    doc, text = build_embedders(cfg)
    yield Memory(cfg, document_embedder=doc, text_embedder=text)
    drop_schema(pg_conn_str, cfg.kb_schema)


@pytest.mark.embeddings
def test_embedding_similarity_groups_paraphrases(hybrid_memory: Memory) -> None:
    me = Caller(org_id="acme", assignment_id="asg-1")
    a = hybrid_memory.store("Deployments to production need approval from two reviewers", caller=me)
    b = hybrid_memory.store("Production deployments need approval from two reviewers", caller=me)
    c = hybrid_memory.store("The office coffee machine is broken", caller=me)
    report: dict[str, Any] = hybrid_memory.reflect(caller=me)
    assert report["facts_consolidated"] == 2
    (obs,) = report["observations_created"]
    evidence = hybrid_memory.read(obs, caller=me)["evidence"]
    assert sorted(evidence) == sorted([a["document_id"], b["document_id"]])
    assert c["document_id"] not in evidence
