"""The LLM-free rules behind `possibly_supersedes` and `conflicts_with`, and the periods questions name."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from haystack_osa_memory.supersession import (
    Weights,
    fact_words,
    probable_succession,
    similarity,
    subject_words,
    value_changed,
)
from haystack_osa_memory.time_phrases import Period, period_of


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("Staging uses the VPN profile stg-eu", "Staging now uses the VPN profile stg-eu2"),
        ("Staging uses the VPN profile stg-eu", "We moved staging to VPN profile stg-eu4"),
        ("The swift cluster runs in eu-west-1.", "Swift now runs in sa-east-1."),
        ("Alice is on call for payments", "Bob is on call for payments"),
        ("The nightly export job times out after 30 minutes.", "The nightly export job timeout is now 45 minutes."),
        ("Nimbus 2.3 ships on 3 April 2027.", "Nimbus 2.3 now ships on 12 May 2027."),
    ],
)
def test_restatements_with_a_changed_value(old: str, new: str) -> None:
    assert probable_succession(old, new, similarity_min=0.3)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("Staging uses the VPN profile stg-eu", "Staging uses the VPN profile stg-eu"),  # the same fact
        ("Staging uses the VPN profile stg-eu", "Staging deploys need a change ticket"),  # another statement
        ("Staging uses the VPN profile stg-eu", "Staging uses the VPN profile stg-eu, as agreed"),  # no value changed
        ("The robin cluster runs in eu-west-1.", "Swift now runs in sa-east-1."),  # another subject
    ],
)
def test_not_restatements(old: str, new: str) -> None:
    assert not probable_succession(old, new, similarity_min=0.3)


def test_values_names_and_content_words() -> None:
    words = fact_words("Maria Novak took over on-call for the platform team on 2026-03-01.")
    assert {"maria", "novak", "on-call", "2026-03-01"} <= words.values
    assert {"platform", "team", "took"} <= words.content
    assert "stag" in fact_words("Staging VPN: use stg-eu").content  # an acronym after it is no surname
    assert "castillo" in fact_words("What is Ingrid Castillo's phone extension?").values


def test_weights_make_template_words_light() -> None:
    texts = [f"The {name} service listens on port {port}." for name, port in (("billing", 1), ("search", 2))]
    texts += ["The mail service listens on port 3.", "Billing moved to port 8443."]
    weights = Weights(texts)
    assert weights("bill") > weights("port")
    a, b = fact_words(texts[0]), fact_words(texts[3])
    c = fact_words(texts[1])
    assert similarity(a, b, weights) > similarity(a, c, weights)
    subject = subject_words("Which port does the billing service listen on?", weights, texts)
    assert "bill" in subject
    assert "port" not in subject
    assert similarity(a, b, weights, ignore=frozenset({"bill"})) < 1.0
    assert value_changed(a, b)
    assert not value_changed(a, a)


def test_a_weight_is_log_of_facts_over_their_document_frequency_every_time_it_is_asked() -> None:
    import math

    texts = ["The billing service listens on port 1.", "The search service listens on port 2.", "Port 3 is free."]
    weights = Weights(texts)
    assert weights.n == 3
    for word, df in (("port", 3), ("bill", 1), ("service", 2), ("unseen", 0)):
        assert weights.df.get(word, 0) == df
        expected = math.log(1 + 3 / max(df, 1))
        assert [weights(word), weights(word)] == [expected, expected]
    assert Weights(["alone"])("alone") == math.log(1 + 2 / 1)  # n counts as at least 2


def test_similarity_through_the_weights_lookup_is_similarity_through_any_callable() -> None:
    texts = [
        "The billing service listens on port 8080.",
        "The search service listens on port 9200.",
        "Billing moved to port 8443 last week.",
        "Engineer 4 owns the billing repository.",
    ]
    weights = Weights(texts)
    words = [fact_words(t) for t in texts]
    for a in words:
        assert a.tokens == a.content | a.values
        assert a.tokens is a.tokens  # worked out once per instance
        for b in words:
            for ignore in (frozenset(), frozenset({"bill"})):
                as_callable = similarity(a, b, lambda w: weights(w), ignore=ignore)
                assert similarity(a, b, weights, ignore=ignore) == as_callable
                shared = (a.tokens & b.tokens) - ignore
                counted = (a.content | b.content | shared) - ignore
                unweighted = len(shared) / len(counted) if counted else (1.0 if ignore else 0.0)
                assert similarity(a, b, ignore=ignore) == unweighted


NOW = datetime(2026, 3, 18, 12, tzinfo=UTC)  # a Wednesday


def day(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("question", "period"),
    [
        ("what did we decide last week?", Period(day("2026-03-09"), day("2026-03-16"))),
        ("what changed yesterday", Period(day("2026-03-17"), day("2026-03-18"))),
        ("anything new today?", Period(day("2026-03-18"), day("2026-03-19"))),
        ("what did we ship this month", Period(day("2026-03-01"), day("2026-04-01"))),
        ("the plan from 2 weeks ago", Period(day("2026-03-02"), day("2026-03-09"))),
        ("which region before the March migration?", Period(None, day("2026-03-01"))),
        ("what was decided in December", Period(day("2025-12-01"), day("2026-01-01"))),
        ("since 2026-02-01, who is on call?", Period(day("2026-02-01"), None)),
        ("what did we do in 2025", Period(day("2025-01-01"), day("2026-01-01"))),
        ("what happened in may", Period(day("2025-05-01"), day("2025-06-01"))),
        ("after March 2026", Period(day("2026-04-01"), None)),
    ],
)
def test_periods(question: str, period: Period) -> None:
    assert period_of(question, NOW) == period


@pytest.mark.parametrize(
    "question",
    ["which region is the swift cluster in?", "may I ask which port billing uses?", "When did Caroline go hiking?"],
)
def test_no_period(question: str) -> None:
    assert period_of(question, NOW) is None


def test_period_holds() -> None:
    week = Period(day("2026-03-09"), day("2026-03-16"))
    assert week.holds(day("2026-03-09"))
    assert not week.holds(day("2026-03-16"))
    assert Period(None, day("2026-03-01")).holds(day("1999-01-01"))
