"""`ScopeMemo`'s bookkeeping without a database: rows of `MEMO_ROWS`' shape are kept least recently used
first out within ``max_facts``, a scope too big or holding a fact without a usable recall row routes to the
exact path, and a changed print makes the next recalls skip it, 1, 2, 4, ... up to `MAX_SKIPS`. A fact
stored after the rows kept joins them, in a copy, when the print adds up."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from haystack_osa_memory.store import scope_memo
from haystack_osa_memory.store.scope_memo import MAX_SKIPS, Print, ScopeMemo

DIM = 4


def rows_of(facts: int, total: int, *, usable: bool = True) -> list[tuple[Any, ...]]:
    """`MEMO_ROWS`' columns: the print (`printed`), then id, expiry, seq, vector (pgvector's binary form), dl,
    terms, scored, usable, content, metadata, created_at, updated_at."""
    vector = struct.pack(">hh4f", DIM, 0, 1.0, 0.0, 0.0, 0.0)
    head = (facts, Decimal(total), facts, Decimal(total), facts, Decimal(total))
    at = datetime(2026, 12, 5, tzinfo=UTC)
    return [
        (*head, f"d{i}", None, i + 1, vector, 3.0, b"", True, usable or i > 0, f"fact {i}", {"topic": "t"}, at, at)
        for i in range(facts)
    ]


def printed(facts: int, total: int) -> Print:
    """The print `rows_of(facts, total)` was read at."""
    return Print(facts, total, facts, total, facts, total)


class Rows:
    """A cursor that returns the rows given (the statement is `MEMO_ROWS`, run for real in the integration
    tests)."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def execute(self, statement: Any, params: Any) -> Rows:
        return self

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


def read(memo: ScopeMemo, key: tuple[str, str], rows: list[tuple[Any, ...]]) -> Any:
    return memo.read(Rows(rows), b"", {"org_id": key[0], "assignment_id": key[1]})  # type: ignore[arg-type]


def test_kept_rows_answer_while_the_print_is_the_same() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    assert memo.route(key) == "rows"
    kept = read(memo, key, rows_of(3, 7))
    assert kept.scope is not None
    assert kept.scope.document_ids == ["d0", "d1", "d2"]
    assert memo.route(key) == "print"
    assert memo.current(key, printed(3, 7)) is kept
    assert memo.current(("acme", "a2"), printed(3, 7)) == "rows"  # another scope: never these rows
    assert (memo.reads, memo.hits, memo.changed) == (1, 1, 0)


def skips(memo: ScopeMemo, key: tuple[str, str]) -> int:
    """The recalls that take the exact path before the next print."""
    n = 0
    while memo.route(key) == "exact":
        n += 1
    return n


def test_a_changing_scope_takes_the_exact_path_skipping_the_print_doubling_up_to_the_bound() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    read(memo, key, rows_of(3, 7))
    skipped = []
    for n in range(7):
        assert memo.route(key) == "print"
        assert memo.current(key, printed(3, 100 + n)) == "exact"  # changed since the last print
        skipped.append(skips(memo, key))
    assert skipped == [1, 2, 4, 8, 16, 16, 16]
    assert MAX_SKIPS == 16
    assert memo.reads == 1  # never read again while it changes
    # Two prints in a row agree: read the rows again; then they answer, and the streak ends.
    assert memo.current(key, printed(3, 106)) == "rows"
    read(memo, key, rows_of(3, 106))
    assert memo.route(key) == "print"
    assert memo.current(key, printed(3, 106)) is not None
    assert memo.current(key, printed(4, 106)) == "exact"
    assert skips(memo, key) == 1  # one skip again
    assert (memo.reads, memo.hits, memo.changed) == (2, 1, 9)


@pytest.mark.parametrize("usable", [False, True])
def test_a_scope_not_kept_takes_the_exact_path_until_looked_at_again(
    usable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo = ScopeMemo(max_facts=2 if usable else 100, dimension=DIM)  # too big, or a fact without recall row
    key = ("acme", "a1")
    kept = read(memo, key, rows_of(3, 7, usable=usable))
    assert (kept.scope is None) == (not usable)  # rows too many to keep still answer the recall that read them
    assert memo.route(key) == "exact"
    assert memo.unusable(key) == (not usable)  # only a fact without its rows sends the exact path to the fallback
    assert not memo.unusable(("acme", "a2"))
    monkeypatch.setattr(scope_memo.time, "monotonic", lambda: 10**9)
    assert memo.route(key) == "rows"


def test_the_least_recently_used_scope_goes_first() -> None:
    memo = ScopeMemo(max_facts=5, dimension=DIM)
    read(memo, ("acme", "a1"), rows_of(2, 1))
    read(memo, ("acme", "a2"), rows_of(2, 2))
    assert memo.current(("acme", "a1"), printed(2, 1)) is not None  # a1 used last
    read(memo, ("acme", "a3"), rows_of(2, 3))  # 6 facts: one scope out
    assert memo.route(("acme", "a2")) == "rows"
    assert memo.route(("acme", "a1")) == "print"
    assert memo.route(("acme", "a3")) == "print"


def test_kept_metadata_is_copied_all_the_way_down() -> None:
    from haystack_osa_memory.store.candidates import plain_copy

    kept = {"topic": "t", "tags": ["a", {"nested": [1, {"deep": "x"}]}], "scores": {"lexical": 1.5}, "n": None}
    copied = plain_copy(kept)
    assert copied == kept
    copied["tags"][1]["nested"][1]["deep"] = "changed"
    copied["tags"].append("b")
    copied["scores"]["lexical"] = 0.0
    assert kept == {"topic": "t", "tags": ["a", {"nested": [1, {"deep": "x"}]}], "scores": {"lexical": 1.5}, "n": None}


def stored_after(seq: int, version: int = 5) -> tuple[Any, ...]:
    """A fact stored after the rows kept as `MEMO_PRINT` reads it: id to scored, usable, content, metadata, created_at,
    updated_at, then the hashes of its governing row, recall row and chunk."""
    unit = [0.0] * DIM
    unit[seq % DIM] = 1.0  # a vector of its own
    at = datetime(2026, 12, 6, tzinfo=UTC)
    vector = struct.pack(">hh4f", DIM, 0, *unit)
    return (
        f"new{seq}",
        None,
        seq,
        vector,
        2.0,
        b"",
        True,
        True,
        f"fact {seq}",
        {"topic": "t"},
        at,
        at,
        version,
        version,
        version,
    )


def test_facts_stored_after_the_rows_join_them_when_the_print_adds_up() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    before = read(memo, key, rows_of(3, 7))  # seqs 1 to 3
    assert memo.after(key) == 3
    assert before.scope is not None
    joined = memo.current(
        key, Print(5, 7 + 5 + 6, 5, 7 + 5 + 6, 5, 7 + 5 + 6), [stored_after(9, 5), stored_after(10, 6)]
    )
    assert not isinstance(joined, str)
    assert joined.scope is not None
    assert joined.scope.document_ids == ["d0", "d1", "d2", "new9", "new10"]
    assert joined.details["new10"] == (
        "fact 10",
        {"topic": "t"},
        datetime(2026, 12, 6, tzinfo=UTC),
        datetime(2026, 12, 6, tzinfo=UTC),
    )
    assert joined.scope.unit[3].tolist() == [0.0, 1.0, 0.0, 0.0]  # 9 % 4
    assert (joined.last_seq, memo.after(key), memo.caught_up, memo.hits) == (10, 10, 2, 1)
    # The rows read before are unchanged (a recall may be ranking them), and so are their vectors.
    assert before.scope.document_ids == ["d0", "d1", "d2"]
    assert len(before.scope.unit) == 3
    assert "new9" not in before.details
    # Extending the rows before again (they are no longer kept) would write past them: a copy is made instead.
    other = before.scope.extended([stored_after(11)[:7]])
    assert other.unit[3].tolist() == [0.0, 0.0, 0.0, 1.0]  # 11 % 4
    assert joined.scope.unit[3].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert other.unit is not joined.scope.unit


def test_facts_stored_after_the_rows_do_not_join_them_when_it_does_not_add_up() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    assert memo.after(key) == scope_memo.NO_SEQ
    read(memo, key, rows_of(3, 7))
    now = Print(4, 12, 4, 12, 4, 12)
    unusable = (*stored_after(9)[:7], False, *stored_after(9)[8:])
    without_chunk = (*stored_after(9)[:14], None)
    kept_already = ("d1", *stored_after(9)[1:])
    for case in (unusable, without_chunk, kept_already):
        memo._entries[key].skips, memo._entries[key].seen = 0, None
        assert memo.current(key, now, [case]) == "exact"
    memo._entries[key].skips, memo._entries[key].seen = 0, None
    assert memo.current(key, Print(4, 13, 4, 12, 4, 12), [stored_after(9)]) == "exact"  # another change too
    assert memo.caught_up == 0
    assert memo.after(key) == 3
