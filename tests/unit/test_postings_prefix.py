"""Which of a query's rare lexemes bring big-scope candidates (`haystack_osa_memory.store.facts.postings_prefix`)."""

from __future__ import annotations

import pytest

from haystack_osa_memory.store.facts import postings_prefix


@pytest.mark.parametrize(
    ("counts", "budget", "expected"),
    [
        ([], 500, 0),
        ([3, 40, 200], 500, 3),  # all fit
        ([3, 40, 200, 300], 500, 3),  # the fourth would take the sum to 543
        ([3, 40, 457], 500, 3),  # exactly at the budget still fits
        ([600, 700], 500, 1),  # the rarest always brings its facts, even past the budget
        ([10, 10, 10], 0, 1),
    ],
)
def test_the_rarest_lexemes_fit_the_budget(counts: list[float], budget: float, expected: int) -> None:
    assert postings_prefix(counts, budget) == expected
