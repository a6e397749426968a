"""Reflect: deterministic consolidation of repeated facts, idempotent, scoped, audited."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from haystack import Document
from haystack.components.generators.chat import MockChatGenerator
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.errors import NotFoundError
from haystack_osa_memory.reflect import chat_summariser, repair_observations
from haystack_osa_memory.store.lifecycle import LifecycleRepository

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


# -- nothing lost: only facts that say the same thing merge ---------------------------------------------------


def covered(memory: Memory, query: str, caller: Caller, limit: int = 10) -> set[str]:
    """Ids of the raw facts a recall finds: a fact itself, or an observation standing for its evidence."""
    ids: set[str] = set()
    for fact in memory.recall(query, limit, caller=caller)["facts"]:
        if fact["kind"] == "observation":
            ids.update(memory.read(fact["document_id"], caller=caller)["evidence"])
        else:
            ids.add(fact["document_id"])
    return ids


KIWI = "In the staging cluster of the shop the kiwi service uses port {}"


@pytest.mark.parametrize(
    "template", [KIWI, "The kiwi service uses port {}", "The kiwi service runs version {} of the client"]
)
def test_facts_with_different_values_are_never_merged(memory: Memory, alice: Caller, template: str) -> None:
    values = ("9911", "9912") if "port" in template else ("2.4.1", "2.4.2")
    texts = [template.format(v) for v in values]
    ids = [memory.store(t, caller=alice)["document_id"] for t in texts]
    before = covered(memory, "kiwi service", alice)
    assert set(ids) <= before
    report = memory.reflect(caller=alice)
    assert (report["groups"], report["facts_consolidated"], report["observations_created"]) == (0, 0, [])
    facts = memory.recall("kiwi service", caller=alice)["facts"]
    assert sorted(f["content"] for f in facts) == texts
    assert covered(memory, "kiwi service", alice) >= before


@pytest.mark.parametrize(
    "texts",
    [
        (
            "Maria Novak is on call for the payments team this week",
            "Ivan Petrov is on call for the payments team this week",
        ),
        (
            "The payments team deploys on 2026-03-01 after the freeze",
            "The payments team deploys on 2026-03-08 after the freeze",
        ),
        (
            "The payments service talks to the broker at mq-eu1.internal",
            "The payments service talks to the broker at mq-eu2.internal",
        ),
    ],
)
def test_names_dates_and_identifiers_that_differ_are_never_merged(
    memory: Memory, alice: Caller, texts: tuple[str, str]
) -> None:
    for t in texts:
        memory.store(t, caller=alice)
    assert memory.reflect(caller=alice)["facts_consolidated"] == 0
    assert sorted(f["content"] for f in memory.recall("payments", caller=alice)["facts"]) == sorted(texts)


def test_recall_after_reflect_finds_every_fact_it_found_before(memory: Memory, alice: Caller) -> None:
    """Near-duplicates that do merge: the observation answers each member's words, not only its own text's."""
    texts = [
        "The nightly backup job of db-main runs at 02:00 UTC and takes about an hour",
        "The nightly backup task of db-main runs at 02:00 UTC and takes about an hour",
    ]
    ids = [memory.store(t, caller=alice)["document_id"] for t in texts]
    memory.store("The release task list lives in the wiki", caller=alice)
    queries = ["nightly backup job", "backup task", "job", "task"]
    before = {q: covered(memory, q, alice) for q in queries}
    assert ids[0] in before["job"]
    assert ids[1] in before["task"]
    report = memory.reflect(caller=alice)
    assert report["facts_consolidated"] == 2
    for q in queries:
        assert before[q] <= covered(memory, q, alice), q
    (obs,) = report["observations_created"]
    for fact_id, text in zip(memory.read(obs, caller=alice)["evidence"], texts, strict=True):
        source = memory.read(fact_id, caller=alice)  # readable through the observation's evidence
        assert (source["status"], source["content"]) == ("consolidated", text)


def test_observation_holds_for_the_union_of_its_sources_validity(memory: Memory, alice: Caller) -> None:
    period = {"valid_from": "2020-01-01", "valid_to": "2021-01-01"}
    ids = [memory.store(t, caller=alice, **period)["document_id"] for t in REPEATS[:2]]
    report = memory.reflect(caller=alice)
    (obs,) = report["observations_created"]
    got = memory.read(obs, caller=alice)
    assert sorted(got["evidence"]) == sorted(ids)
    assert got["valid_from"].startswith("2020-01-01")
    assert got.get("valid_to", "").startswith("2021-01-01")
    assert memory.recall("nightly backup job", caller=alice)["facts"] == []  # not current
    then = memory.recall("nightly backup job", caller=alice, as_of="2020-06-01")["facts"]
    assert [f["document_id"] for f in then] == [obs]


def test_touching_periods_merge_into_their_union(memory: Memory, alice: Caller) -> None:
    a = memory.store(REPEATS[0], caller=alice, valid_from="2020-01-01", valid_to="2020-06-01")["document_id"]
    b = memory.store(REPEATS[1], caller=alice, valid_from="2020-06-01", valid_to="2021-01-01")["document_id"]
    (obs,) = memory.reflect(caller=alice)["observations_created"]
    got = memory.read(obs, caller=alice)
    assert sorted(got["evidence"]) == sorted([a, b])
    assert (got["valid_from"][:10], got.get("valid_to", "")[:10]) == ("2020-01-01", "2021-01-01")


def test_an_open_source_keeps_the_observation_open(memory: Memory, alice: Caller) -> None:
    memory.store(REPEATS[0], caller=alice, valid_from="2020-01-01", valid_to="2021-01-01")
    memory.store(REPEATS[1], caller=alice, valid_from="2020-06-01")
    (obs,) = memory.reflect(caller=alice)["observations_created"]
    got = memory.read(obs, caller=alice)
    assert (got["valid_from"][:10], got.get("valid_to")) == ("2020-01-01", None)
    assert [f["document_id"] for f in memory.recall("nightly backup job", caller=alice)["facts"]] == [obs]


def test_disjoint_periods_are_never_merged(memory: Memory, alice: Caller) -> None:
    a = memory.store(REPEATS[0], caller=alice, valid_from="2020-01-01", valid_to="2020-06-01")["document_id"]
    b = memory.store(REPEATS[1], caller=alice, valid_from="2021-01-01", valid_to="2021-06-01")["document_id"]
    report = memory.reflect(caller=alice)
    assert report["facts_consolidated"] == 0
    for day, fact in (("2020-03-01", a), ("2021-03-01", b)):
        then = memory.recall("nightly backup job", caller=alice, as_of=day)["facts"]
        assert [f["document_id"] for f in then] == [fact]


def test_absorbing_a_repeat_widens_the_observation_validity(memory: Memory, alice: Caller) -> None:
    for t in REPEATS[:2]:
        memory.store(t, caller=alice, valid_from="2020-03-01")
    (obs,) = memory.reflect(caller=alice)["observations_created"]
    earlier = memory.store(REPEATS[2], caller=alice, valid_from="2020-01-01", valid_to="2020-03-01")["document_id"]
    report = memory.reflect(caller=alice)
    assert report["observations_updated"] == [obs]
    got = memory.read(obs, caller=alice)
    assert earlier in got["evidence"]
    assert (got["valid_from"][:10], got.get("valid_to")) == ("2020-01-01", None)


def test_facts_filed_under_different_topics_are_not_merged(memory: Memory, alice: Caller) -> None:
    memory.store(REPEATS[0], topic="backup", caller=alice)
    memory.store(REPEATS[1], topic="database", caller=alice)
    assert memory.reflect(caller=alice)["facts_consolidated"] == 0


def test_a_summary_that_drops_a_value_is_not_used(memory: Memory, alice: Caller) -> None:
    for t in REPEATS:
        memory.store(t, caller=alice)
    summariser = chat_summariser(MockChatGenerator(responses="Backups run every night."))
    (obs,) = memory.reflect(caller=alice, summariser=summariser)["observations_created"]
    assert memory.read(obs, caller=alice)["content"].startswith(REPEATS[2])


def test_the_observation_expires_when_the_last_source_does(memory: Memory, alice: Caller) -> None:
    short = memory.store(REPEATS[0], caller=alice, ttl_days=1)["document_id"]
    long = memory.store(REPEATS[1], caller=alice, ttl_days=30)["document_id"]
    (obs,) = memory.reflect(caller=alice)["observations_created"]
    got = memory.read(obs, caller=alice)
    assert (
        got["expires_at"]
        == memory.read(long, caller=alice)["expires_at"]
        != memory.read(short, caller=alice)["expires_at"]
    )


def test_a_source_without_expiry_keeps_the_observation_fresh(memory: Memory, alice: Caller) -> None:
    memory.store(REPEATS[0], caller=alice, ttl_days=1)
    memory.store(REPEATS[1], caller=alice)
    (obs,) = memory.reflect(caller=alice)["observations_created"]
    assert memory.read(obs, caller=alice)["expires_at"] is None


@pytest.mark.embeddings
def test_parallel_facts_keep_every_value_with_embeddings(hybrid_memory: Memory) -> None:
    """Twenty facts one number apart: their vectors are nearly equal, their values are not."""
    me = Caller(org_id="acme", assignment_id="asg-1")
    ids = [hybrid_memory.store(f"Parallel fact {n} about otters", caller=me)["document_id"] for n in range(20)]
    ports = [hybrid_memory.store(f"The kiwi service uses port {p}", caller=me)["document_id"] for p in (9911, 9912)]
    queries = {**{f"Parallel fact {n}": ids[n] for n in range(20)}, "kiwi service port": ports[0]}
    before = {q: covered(hybrid_memory, q, me) for q in queries}
    assert all(fact in before[q] for q, fact in queries.items())
    report = hybrid_memory.reflect(caller=me)
    assert report["facts_consolidated"] == 0
    for q in queries:
        assert before[q] <= covered(hybrid_memory, q, me), q
    top = hybrid_memory.recall("Parallel fact 7", caller=me)["facts"]
    assert "Parallel fact 7 about otters" in [f["content"] for f in top]
    assert set(ports) <= covered(hybrid_memory, "kiwi service port", me)


# -- repair of observations an earlier reflect damaged ------------------------------------------------------


def damaged_observation(
    memory: Memory, caller: Caller, pg_conn_str: str, config: MemoryConfig, raws: list[str], body: str
) -> str:
    """An observation as reflect used to leave it: written now (holding from now, no end), its evidence
    linked, its raw facts consolidated, whatever their values or validity."""
    (obs,), _ = memory._write(
        [Document(content=f"{body}\n(consolidated from {len(raws)} facts)", meta={"kind": "observation"})],
        caller,
        action="reflect",
    )
    names = config.sql_names()
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {schema}.{gov} SET metadata = metadata"
                " || jsonb_build_object('evidence', %s::jsonb, 'count', %s) WHERE id = %s"
            ).format(**names),
            (json.dumps(raws), len(raws), obs),
        )
        conn.execute(
            sql.SQL(
                "UPDATE {schema}.{gov} SET status = 'consolidated',"
                " metadata = metadata || jsonb_build_object('consolidated_into', %s::text) WHERE id = ANY(%s)"
            ).format(**names),
            (obs, raws),
        )
    return obs


def test_repair_puts_back_facts_merged_with_another_value(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    texts = [KIWI.format(port) for port in (9911, 9912)]
    raws = [memory.store(t, caller=alice)["document_id"] for t in texts]
    obs = damaged_observation(memory, alice, pg_conn_str, config, raws, texts[1])
    assert [f["document_id"] for f in memory.recall("kiwi service", caller=alice)["facts"]] == [obs]
    repo = LifecycleRepository(pg_conn_str, config)
    assert repair_observations(repo, dry_run=True) == 1
    assert [f["document_id"] for f in memory.recall("kiwi service", caller=alice)["facts"]] == [obs]  # dry run
    assert repair_observations(repo) == 1
    facts = memory.recall("kiwi service", caller=alice)["facts"]
    assert sorted(f["content"] for f in facts) == texts  # nothing the same is left: the observation is retired
    assert {memory.read(r, caller=alice)["status"] for r in raws} == {"approved"}
    with pytest.raises(NotFoundError):
        memory.read(obs, caller=alice)
    audit = [a for a in repo.audit(assignment_id=alice.assignment_id) if a["action"] == "repair"]
    assert [a["document_id"] for a in audit] == [obs]
    assert repair_observations(repo) == 0  # idempotent
    assert memory.reflect(caller=alice)["facts_consolidated"] == 0


def test_repair_keeps_what_says_the_same_and_fixes_validity(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    period = {"valid_from": "2020-01-01", "valid_to": "2021-01-01"}
    same = [memory.store(t, caller=alice, **period)["document_id"] for t in REPEATS[:2]]
    other = memory.store("The nightly backup job runs at 03:00 UTC on db-main", caller=alice, **period)["document_id"]
    obs = damaged_observation(memory, alice, pg_conn_str, config, [*same, other], REPEATS[0])
    assert [f["document_id"] for f in memory.recall("nightly backup job", caller=alice)["facts"]] == [obs]
    repo = LifecycleRepository(pg_conn_str, config)
    assert repair_observations(repo) == 1
    got = memory.read(obs, caller=alice)
    assert (got["evidence"], got["count"]) == (same, 2)
    assert (got["valid_from"][:10], got.get("valid_to", "")[:10]) == ("2020-01-01", "2021-01-01")
    assert memory.read(other, caller=alice)["status"] == "approved"
    assert memory.recall("nightly backup job", caller=alice)["facts"] == []  # held in 2020 only, as its facts
    then = memory.recall("nightly backup job", caller=alice, as_of="2020-06-01")["facts"]
    assert sorted(f["document_id"] for f in then) == sorted([obs, other])
    assert repair_observations(repo) == 0


def test_repair_splits_evidence_whose_periods_never_meet(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    early = [
        memory.store(t, caller=alice, valid_from="2020-01-01", valid_to="2020-06-01")["document_id"]
        for t in REPEATS[:2]
    ]
    late = memory.store(REPEATS[2], caller=alice, valid_from="2022-01-01")["document_id"]
    obs = damaged_observation(memory, alice, pg_conn_str, config, [*early, late], REPEATS[2])
    repo = LifecycleRepository(pg_conn_str, config)
    assert repair_observations(repo) == 1
    got = memory.read(obs, caller=alice)
    assert got["evidence"] == early
    assert (got["valid_from"][:10], got.get("valid_to", "")[:10]) == ("2020-01-01", "2020-06-01")
    assert [f["document_id"] for f in memory.recall("nightly backup job", caller=alice)["facts"]] == [late]


def test_the_observation_keeps_its_evidence_place_among_its_neighbours(memory: Memory, alice: Caller) -> None:
    """Recall's context window counts the facts stored around a fact: the observation stands where its
    earliest evidence was stored, not after the scope's latest facts."""
    memory.store("The kayak club meets every Thursday at the old harbour", caller=alice)
    first = memory.store(REPEATS[0], caller=alice)["document_id"]
    for n in range(8):
        memory.store(f"Unrelated note number {n} about the office plants", caller=alice)
    memory.store(REPEATS[1], caller=alice)
    before = covered(memory, "old harbour", alice)
    assert first in before  # found through its neighbour's words
    (obs,) = memory.reflect(caller=alice)["observations_created"]
    after = covered(memory, "old harbour", alice)
    assert before <= after
    assert obs in {f["document_id"] for f in memory.recall("old harbour", caller=alice)["facts"]}


def test_consolidated_facts_still_lend_context_to_their_neighbours(memory: Memory, alice: Caller) -> None:
    """A fact reflect consolidated is never returned, but its words still reach the facts stored beside it
    (the context window), as before reflect: "talked for hours" after the apple fact answers an apple
    question better than a shorter fact with the same words stored far from it. (The observation takes the
    place of the earliest apple fact; the neighbour here is the later one's.)"""
    filler = [f"Parking garage level {n} closes at {n + 6} pm" for n in range(12)]
    apple = memory.store("Apple picking at the orchard on Saturday", caller=alice)["document_id"]
    for text in filler[:6]:
        memory.store(text, caller=alice)
    control = memory.store("Ben talked for hours", caller=alice)["document_id"]
    for text in filler[6:]:
        memory.store(text, caller=alice)
    repeat = memory.store("apple picking at the orchard on Saturday.", caller=alice)["document_id"]
    neighbour = memory.store(
        "Afterwards we all sat together on the old porch swing and talked for hours about nothing much in particular",
        caller=alice,
    )["document_id"]
    query = "apple talked hours"

    def order() -> list[str]:
        return [f["document_id"] for f in memory.recall(query, limit=20, caller=alice)["facts"]]

    before = order()
    assert before.index(neighbour) < before.index(control)
    report = memory.reflect(caller=alice)
    assert report["facts_consolidated"] == 2
    after = order()
    assert not {apple, repeat} & set(after)  # read for context, never returned
    assert after.index(neighbour) < after.index(control)
