"""Reflect's grouping rules without a database: which facts may share an observation, and what it holds for."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from haystack_osa_memory.reflect import ReflectSettings, group_facts, says_same, validity_of

CREATED = datetime(2026, 1, 1, tzinfo=UTC)


def fact(content: str, **meta: Any) -> dict[str, Any]:
    return {"document_id": content, "content": content, "embedding": None, "metadata": meta, "created_at": CREATED}


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (
            "The nightly backup job runs at 02:00 UTC on db-main",
            "the nightly backup job runs at 02:00 UTC on db-main.",
            True,
        ),
        (
            "The nightly backup job runs at 02:00 UTC on db-main",
            "THE NIGHTLY BACKUP JOB RUNS AT 02:00 UTC ON DB-MAIN!",
            True,
        ),
        ("The kiwi service uses port 9911", "The kiwi service uses port 9912", False),
        ("Parallel fact 7 about otters", "Parallel fact 19 about otters", False),
        ("The client runs version 2.4.1", "The client runs version 2.4.2", False),
        ("Deploys go through stg-eu1 first", "Deploys go through stg-eu2 first", False),
        ("Maria Novak is on call this week", "Ivan Petrov is on call this week", False),
        ("The freeze starts on 2026-03-01", "The freeze starts on 2026-03-08", False),
        ("The api is at api.example.com", "The api is at api-example.com", False),
    ],
)
def test_says_same_compares_values(a: str, b: str, same: bool) -> None:
    assert says_same(a, b) is same
    assert says_same(b, a) is same


def test_twenty_parallel_facts_form_no_group_even_with_equal_vectors() -> None:
    facts = [fact(f"Parallel fact {n} about otters") for n in range(20)]
    for f in facts:
        f["embedding"] = [1.0, 0.0, 0.0]  # cosine 1 between every pair
    assert group_facts(facts, ReflectSettings()) == []


def test_a_chain_through_an_untopiced_fact_is_split() -> None:
    """a ~ b ~ c are near-duplicates; a and c are filed under different topics, so they never share a group."""
    text = "The nightly backup job runs at 02:00 UTC on db-main"
    facts = [fact(text, topic="backup"), fact(text + "."), fact(text + "!", topic="database")]
    groups = group_facts(facts, ReflectSettings())
    assert groups == [[0, 1]]


def test_periods_must_meet() -> None:
    text = "The nightly backup job runs at 02:00 UTC on db-main"
    early = fact(text, valid_from="2020-01-01T00:00:00+00:00", valid_to="2020-06-01T00:00:00+00:00")
    touching = fact(text + ".", valid_from="2020-06-01T00:00:00+00:00", valid_to="2021-01-01T00:00:00+00:00")
    late = fact(text + "!", valid_from="2022-01-01T00:00:00+00:00", valid_to="2023-01-01T00:00:00+00:00")
    assert group_facts([early, touching, late], ReflectSettings()) == [[0, 1]]
    assert validity_of([early, touching]) == {
        "valid_from": "2020-01-01T00:00:00+00:00",
        "valid_to": "2021-01-01T00:00:00+00:00",
        "expires_at": None,
    }


def test_validity_of_an_open_member_and_of_expiries() -> None:
    closed = fact("a", valid_from="2020-01-01T00:00:00+00:00", valid_to="2021-01-01T00:00:00+00:00")
    undated = fact("b")  # holds from its creation, no end
    assert validity_of([closed, undated])["valid_from"] == "2020-01-01T00:00:00+00:00"
    assert validity_of([closed, undated])["valid_to"] is None
    soon = fact("c", expires_at="2026-02-01T00:00:00+00:00")
    later = fact("d", expires_at="2026-03-01T00:00:00+00:00")
    assert validity_of([soon, later])["expires_at"] == "2026-03-01T00:00:00+00:00"
    assert validity_of([soon, undated])["expires_at"] is None


def test_close_vectors_alone_do_not_merge_different_words() -> None:
    """Two greetings under one date prefix: their vectors are close, their names and words agree, what they
    say does not (conversation turns of two speakers)."""
    facts = [
        fact("(1:56 pm on 8 May, 2023) Jon: Hey Gina! What's up? How's the store going?"),
        fact("(1:56 pm on 8 May, 2023) Gina: Hey Jon! The store's doing great! How's the biz?"),
        fact("(1:56 pm on 8 May, 2023) Gina: Can't wait for tomorrow's grand opening!"),
        fact("(1:56 pm on 8 May, 2023) Gina: Can't wait to make more memories at your dance studio!"),
    ]
    for f in facts:
        f["embedding"] = [1.0, 0.0, 0.0]
    assert group_facts(facts, ReflectSettings()) == []
    paraphrases = [
        fact("Deployments to production need approval from two reviewers"),
        fact("Production deployments need approval from two reviewers"),
    ]
    for f in paraphrases:
        f["embedding"] = [1.0, 0.0, 0.0]
    assert group_facts(paraphrases, ReflectSettings()) == [[0, 1]]


def test_a_short_fact_contained_in_two_others_does_not_join_them() -> None:
    """ "Can't wait too!" is contained in both longer turns; they do not say the same thing."""
    prefix = "(1:56 pm on 8 May, 2023) Gina: "
    facts = [
        fact(prefix + "Can't wait to make more memories at your dance studio!"),
        fact(prefix + "Can't wait for tomorrow's grand opening!"),
        fact(prefix + "Can't wait too!"),
    ]
    groups = group_facts(facts, ReflectSettings())
    assert len(groups) <= 1
    assert [0, 1] not in [[i for i in g if i != 2] for g in groups]
