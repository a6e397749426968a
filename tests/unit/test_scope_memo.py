"""`ScopeMemo`'s bookkeeping without a database: rows of `MEMO_ROWS`' shape are kept least recently used
first out within ``max_facts``, a scope too big or holding a fact without a usable recall row routes to the
exact path, and a changed print is caught up with when the facts stored since make it (their rows after the rows
read), else makes the next recalls skip it, 1, 2, 4, ... up to `MAX_SKIPS`. A fact written joins the rows kept at
the print it makes with them, waiting until a print matches, unless it would not be their last row."""

from __future__ import annotations

import math
import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from haystack_osa_memory.store import scope_memo
from haystack_osa_memory.store.scope_cache import HeldScope
from haystack_osa_memory.store.scope_memo import MAX_SKIPS, Kept, Print, ScopeMemo

DIM = 4


#: The time recalls ask facts to hold at (microseconds since the epoch), and a fact's validity that holds always.
AT = 1.8e15
ALWAYS = (0.0, math.inf)


def rows_of(
    facts: int, total: int, *, usable: bool = True, validity: list[tuple[float, float]] | None = None
) -> list[tuple[Any, ...]]:
    """`MEMO_ROWS`' columns: the print (`printed`), then id, expiry, seq, vector (pgvector's binary form), dl,
    terms, scored, usable, content, metadata, created_at, updated_at, valid from, valid to (``validity``, by
    default always), then the read's time (`AT`)."""
    vector = struct.pack(">hh4f", DIM, 0, 1.0, 0.0, 0.0, 0.0)
    head = (facts, Decimal(total), facts, Decimal(total), facts, Decimal(total))
    t, meta = datetime(2026, 12, 5, tzinfo=UTC), {"topic": "t"}
    valid = validity or [ALWAYS] * facts
    return [
        (*head, f"d{i}", None, i + 1, vector, 3.0, b"", True, usable or i > 0, f"fact {i}", meta, t, t, *v, AT)
        for i, v in enumerate(valid)
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


def since_rows(facts: list[tuple[tuple[Any, ...], Any, int]]) -> list[tuple[Any, ...]]:
    """`MEMO_SINCE`'s rows: each fact's `MEMO_ROWS` columns (``facts``: the row and detail `joining` gives, and the
    hash it adds to the print)."""
    return [(*row, True, *detail, h, h, h, *ALWAYS) for row, detail, h in facts]


def miss(memo: ScopeMemo, key: tuple[str, str], now: Print, *facts: tuple[tuple[Any, ...], Any, int]) -> Any:
    """A recall's print ``now`` against the rows kept, as `FactRepository` takes it: when they changed, the facts
    stored since (``facts``) are read."""
    route = memo.current(key, now, AT)
    if route != "since":
        return route
    cursor = Rows(since_rows(list(facts)))
    return memo.caught_up(cursor, b"", {"org_id": key[0], "assignment_id": key[1]}, now, AT)  # type: ignore[arg-type]


def caught_up(
    memo: ScopeMemo, key: tuple[str, str], now: Print, *facts: tuple[tuple[Any, ...], Any, int]
) -> tuple[Kept, HeldScope]:
    """`miss`, which must catch up: the rows kept then, and their scope."""
    caught = miss(memo, key, now, *facts)
    assert isinstance(caught, Kept)
    assert caught.scope is not None
    return caught, caught.scope


def stored(seq: int, h: int) -> tuple[tuple[Any, ...], Any, int]:
    """A fact another process stored (`joining`'s row and detail) and the hash it adds to the print."""
    return (*joining(seq), h)


def test_kept_rows_answer_while_the_print_is_the_same() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    assert memo.route(key) == "rows"
    kept = read(memo, key, rows_of(3, 7))
    assert kept.scope is not None
    assert kept.scope.document_ids == ["d0", "d1", "d2"]
    assert memo.route(key) == "print"
    assert memo.current(key, printed(3, 7), AT) is kept
    assert memo.current(("acme", "a2"), printed(3, 7), AT) == "rows"  # another scope: never these rows
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
        assert memo.current(key, printed(3, 100 + n), AT) == "since"  # changed since the last print: what changed?
        # Not a fact stored since the rows were read (the print does not add up): the exact path.
        assert miss(memo, key, printed(3, 100 + n)) == "exact"
        skipped.append(skips(memo, key))
    assert skipped == [1, 2, 4, 8, 16, 16, 16]
    assert MAX_SKIPS == 16
    assert memo.reads == 1  # never read again while it changes
    # Two prints in a row agree: read the rows again; then they answer, and the streak ends.
    assert memo.current(key, printed(3, 106), AT) == "rows"
    read(memo, key, rows_of(3, 106))
    assert memo.route(key) == "print"
    assert memo.current(key, printed(3, 106), AT) is not None
    assert miss(memo, key, printed(4, 106)) == "exact"
    assert skips(memo, key) == 1  # one skip again
    assert (memo.reads, memo.hits, memo.changed, memo.caught) == (2, 1, 16, 0)


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
    assert memo.current(("acme", "a1"), printed(2, 1), AT) is not None  # a1 used last
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


def joining(seq: int) -> tuple[tuple[Any, ...], Any]:
    """A new fact's row (id to scored) and detail, as `FactRepository._written` hands them to `written`."""
    unit = [0.0] * DIM
    unit[seq % DIM] = 1.0  # a vector of its own
    vector = struct.pack(">hh4f", DIM, 0, *unit)
    at = datetime(2026, 12, 6, tzinfo=UTC)
    return (f"new{seq}", None, seq, vector, 2.0, b"", True), (f"fact {seq}", {"topic": "t"}, at, at)


def test_a_written_fact_joins_at_the_print_it_makes_and_leaves_the_rows_before_it_as_they_were() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    before = read(memo, key, rows_of(3, 7))
    assert memo.route(key) == "print"
    row, detail = joining(9)
    assert memo.written(key, Print.of_new_fact(5), row, detail, ALWAYS)
    joined = memo.current(key, Print(4, 12, 4, 12, 4, 12), AT)
    assert not isinstance(joined, str)
    assert joined.scope is not None
    assert before.scope is not None
    assert joined.scope.document_ids == ["d0", "d1", "d2", "new9"]
    assert joined.details["new9"] == detail
    assert joined.scope.unit[3].tolist() == [0.0, 1.0, 0.0, 0.0]  # 9 % 4
    assert joined.last_seq == 9
    # The rows read before are unchanged (a recall may be ranking them), and so are their vectors.
    assert before.scope.document_ids == ["d0", "d1", "d2"]
    assert len(before.scope.unit) == 3
    assert "new9" not in before.details
    assert memo.joined == 1
    # Joining the rows before again (they are no longer kept) would write past them: a copy is made instead.
    other = before.scope.extended([joining(10)[0]])
    assert other.unit[3].tolist() == [0.0, 0.0, 1.0, 0.0]  # 10 % 4
    assert joined.scope.unit[3].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert other.unit is not joined.scope.unit


def test_a_written_fact_does_not_join_rows_that_it_would_not_end() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    assert not memo.written(key, Print.of_new_fact(5), *joining(9), ALWAYS)  # nothing kept
    read(memo, key, rows_of(3, 7))  # seqs 1 to 3
    assert not memo.written(key, Print.of_new_fact(5), *joining(2), ALWAYS)  # stored before the last row kept
    held = ("d1", *joining(9)[0][1:])
    assert not memo.written(key, Print.of_new_fact(5), held, joining(9)[1], ALWAYS)  # kept already
    assert miss(memo, key, Print(4, 12, 4, 12, 4, 12)) == "exact"  # changed otherwise: skips its print now
    assert not memo.written(key, Print.of_new_fact(5), *joining(9), ALWAYS)
    assert memo.joined == 0


def test_facts_stored_elsewhere_are_caught_up_with_and_nothing_else_read() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    before = read(memo, key, rows_of(3, 7))  # seqs 1 to 3
    now = printed(3, 7) + Print.of_new_fact(11) + Print.of_new_fact(13)
    caught, held = caught_up(memo, key, now, stored(5, 11), stored(6, 13))
    assert held.document_ids == ["d0", "d1", "d2", "new5", "new6"]
    assert held.unit[3:].tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]  # 5 % 4, 6 % 4
    assert caught.details["new6"] == joining(6)[1]
    assert caught.print == now
    assert caught.last_seq == 6
    assert caught.read is not None
    assert (caught.read.print, caught.read.seq, caught.read.rows) == (now, 6, 5)
    assert memo.current(key, now, AT) is caught  # kept: the next recalls read the print alone
    assert memo.route(key) == "print"  # no skipping: the change was caught up with
    assert (memo.reads, memo.caught, memo.changed, memo.hits) == (1, 1, 1, 1)
    assert memo._facts == 5
    assert before.scope.document_ids == ["d0", "d1", "d2"]  # a recall may be ranking them


def test_facts_joined_are_read_again_with_those_stored_elsewhere_in_storing_order() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    read(memo, key, rows_of(3, 7))
    assert memo.written(key, Print.of_new_fact(5), *joining(9), ALWAYS)  # this process's fact joins (seq 9)
    joined = memo.current(key, printed(3, 7) + Print.of_new_fact(5), AT)
    assert not isinstance(joined, str)
    # Another process stored seq 8 meanwhile: its print counts both; the rows read are caught up with both.
    now = printed(3, 7) + Print.of_new_fact(4) + Print.of_new_fact(5)
    _, held = caught_up(memo, key, now, stored(8, 4), stored(9, 5))
    assert held.document_ids == ["d0", "d1", "d2", "new8", "new9"]
    assert held.unit[3:].tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]  # 8 % 4, 9 % 4
    # The rows joined before are as they were (their vectors were copied, not written over).
    assert joined.scope is not None
    assert joined.scope.document_ids == ["d0", "d1", "d2", "new9"]
    assert joined.scope.unit[3].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert len(held.terms) == 5
    assert memo._facts == 5


def test_a_fact_joined_that_left_is_not_kept_and_a_change_that_does_not_add_up_is_the_exact_paths() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    read(memo, key, rows_of(3, 7))
    assert memo.written(key, Print.of_new_fact(5), *joining(9), ALWAYS)
    # The joined fact left the scope (retired elsewhere) and another came: only the other is past the rows read.
    caught, held = caught_up(memo, key, printed(3, 7) + Print.of_new_fact(4), stored(10, 4))
    assert held.document_ids == ["d0", "d1", "d2", "new10"]
    assert "new9" not in caught.details
    # A fact read before changed too (the print misses by more than the facts past the rows): the exact path.
    assert miss(memo, key, printed(4, 7) + Print.of_new_fact(3), stored(11, 3)) == "exact"
    assert memo.current(key, printed(4, 7) + Print.of_new_fact(3), AT) == "rows"  # the same change again: read
    # A fact past the rows without a usable recall row: the exact path too.
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    read(memo, key, rows_of(3, 7))
    now = printed(3, 7) + Print.of_new_fact(4)
    assert memo.current(key, now, AT) == "since"
    rows = since_rows([stored(10, 4)])
    rows[0] = (*rows[0][:7], False, *rows[0][8:])  # usable
    params = {"org_id": "acme", "assignment_id": "a1"}
    assert memo.caught_up(Rows(rows), b"", params, now, AT) == "exact"  # type: ignore[arg-type]
    assert memo.caught == 0


def test_catching_up_again_and_again_keeps_the_vectors_buffer_within_twice_the_rows() -> None:
    memo = ScopeMemo(max_facts=10_000, dimension=DIM)
    key = ("acme", "a1")
    read(memo, key, rows_of(3, 7))
    now = printed(3, 7)
    for seq in range(10, 400, 2):
        # This process's fact joins (its buffer shared), then another's comes before it is read: each catch-up
        # copies the vectors (rows past the rows read are the joined ones').
        assert memo.written(key, Print.of_new_fact(seq + 1), *joining(seq + 1), ALWAYS)
        now = now + Print.of_new_fact(seq) + Print.of_new_fact(seq + 1)
        caught = miss(memo, key, now, stored(seq, seq), stored(seq + 1, seq + 1))
        assert not isinstance(caught, str)
        assert caught.scope is not None
        assert caught.scope._unit.shape[0] <= max(2 * len(caught.scope), 64)
    assert len(caught.scope) == 3 + 2 * 195
    assert memo.caught == 195


def test_a_fact_joined_waits_for_a_print_that_matches_and_one_that_misses_reads_it_again() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    read(memo, key, rows_of(3, 7))
    before = memo._entries[key].kept
    assert memo.written(key, Print.of_new_fact(5), *joining(9), ALWAYS)
    waiting = memo._entries[key].kept
    assert waiting.scope is before.scope  # not extended yet
    assert len(waiting) == 4
    assert memo._facts == 4
    assert waiting.print == printed(3, 7) + Print.of_new_fact(5)
    assert not memo.written(key, Print.of_new_fact(5), *joining(9), ALWAYS)  # pending already
    # Another process stored seq 8 meanwhile: the print misses, both are read, the rows read extended in place.
    now = printed(3, 7) + Print.of_new_fact(4) + Print.of_new_fact(5)
    caught, held = caught_up(memo, key, now, stored(8, 4), stored(9, 5))
    assert before.scope is not None
    assert held._unit is before.scope._unit  # no copy: nothing was written past the rows read
    assert held.document_ids == ["d0", "d1", "d2", "new8", "new9"]
    assert caught.pending == ()
    assert before.scope.document_ids == ["d0", "d1", "d2"]
    assert memo._facts == 5


def test_rows_kept_are_those_that_hold_until_one_starts_or_stops_holding() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    later, sooner = AT + 5_000_000, AT + 2_000_000
    # d1 held until before the read; d2 holds from later; d3 until sooner.
    validity = [ALWAYS, (0.0, AT), (later, math.inf), (0.0, sooner), (AT, math.inf)]
    kept = read(memo, key, rows_of(5, 7, validity=validity))
    assert kept.scope is not None
    assert kept.scope.document_ids == ["d0", "d3", "d4"]
    assert kept.window == (AT, sooner)
    assert kept.last_seq == 5  # rows that do not hold were read too: only facts past them are new
    assert memo.current(key, printed(5, 7), AT + 1) is kept
    assert memo.current(key, printed(5, 7), AT - 1) == "since"  # before the read: not known to be the same
    # The same print once d3 stops holding: not these rows; nothing was stored since, but the rows read do not
    # hold, so the exact path, and the rows are read again at the next print.
    assert memo.current(key, printed(5, 7), sooner) == "since"
    params = {"org_id": "acme", "assignment_id": "a1"}
    assert memo.caught_up(Rows([]), b"", params, printed(5, 7), sooner) == "exact"  # type: ignore[arg-type]
    assert skips(memo, key) == 1
    assert memo.current(key, printed(5, 7), sooner) == "rows"


def test_a_fact_that_does_not_hold_yet_waits_outside_the_rows_caught_up_with() -> None:
    memo = ScopeMemo(max_facts=100, dimension=DIM)
    key = ("acme", "a1")
    read(memo, key, rows_of(3, 7))
    later = AT + 1_000_000
    # Written with a validity that starts later: it joins, but the rows kept are not the ones that hold now.
    row, detail = joining(9)
    assert memo.written(key, Print.of_new_fact(5), row, detail, (later, math.inf))
    now = printed(3, 7) + Print.of_new_fact(5)
    assert memo.current(key, now, AT) == "since"
    # Caught up with: it is read, counted in the print, but not ranked until it holds.
    since = since_rows([(row, detail, 5)])
    since[0] = (*since[0][:15], later, math.inf)
    caught = memo.caught_up(Rows(since), b"", {"org_id": "acme", "assignment_id": "a1"}, now, AT)  # type: ignore[arg-type]
    assert isinstance(caught, Kept)
    assert caught.scope is not None
    assert caught.scope.document_ids == ["d0", "d1", "d2"]
    assert "new9" not in caught.details
    assert caught.window == (AT, later)
    assert caught.last_seq == 9
    assert memo.current(key, now, AT + 1) is caught
    assert memo.current(key, now, later) == "since"


def test_a_written_facts_validity_is_read_as_postgresql_reads_it_or_not_at_all() -> None:
    created = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    us = (created - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1e6
    assert scope_memo.written_validity({}, created) == (us, math.inf)
    start = "2026-12-06T12:00:00.000001+00:00"
    assert scope_memo.written_validity({"valid_from": start, "valid_to": "2026-12-07T13:00:00+01:00"}, created) == (
        us + 1,
        us + 86_400e6,
    )
    for odd in ("2026-12-06", "2026-12-06T12:00:00", "2026-12-06T12:00:00Z", "infinity", 5):
        assert scope_memo.written_validity({"valid_from": odd}, created) is None
        assert scope_memo.written_validity({"valid_to": odd}, created) is None


def test_a_row_whose_validity_the_database_could_not_compute_never_holds() -> None:
    rows = [("a", 0.0, math.inf), ("b", None, math.inf), ("c", 0.0, None), ("d", AT + 7, math.inf)]
    held, window = scope_memo.holding(rows, AT, 1)
    assert [r[0] for r in held] == ["a"]
    assert window == (AT, AT + 7)
