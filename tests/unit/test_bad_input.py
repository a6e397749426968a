"""Bad input gets a typed refusal that says what is allowed, never an internal error: timestamps at the edge
of the calendar, forged list cursors, facts made of code points no text is made of, dates in queries."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.store.lifecycle import decode_cursor, encode_cursor
from haystack_osa_memory.time_phrases import period_of
from haystack_osa_memory.tools import SPECS
from haystack_osa_memory.validation import check_fact, check_timestamp, check_topic

DOC_ID = "ab" * 32


class TestTimestamps:
    @pytest.mark.parametrize(
        "value",
        [
            "9999-12-31T23:59:59-23:59",  # its offset moves it past the year 9999
            "0001-01-01T00:00:00+23:59",  # and this one before the year 1
            "9999-12-31T23:59:59.999999-00:01",
            "0001-01-01+00:01",
        ],
    )
    @pytest.mark.parametrize("what", ["as_of", "valid_from", "valid_to"])
    def test_offsets_past_the_calendar_are_refused_with_the_range(self, value: str, what: str) -> None:
        with pytest.raises(InvalidInputError) as info:
            check_timestamp(value, what)
        assert str(info.value).startswith(f"{what} must lie between the years 1900 and 9000 (UTC), got ")

    def test_datetimes_past_the_calendar_are_refused_too(self) -> None:
        late = datetime(9999, 12, 31, 23, 59, tzinfo=timezone(-timedelta(hours=23, minutes=59)))
        early = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=23, minutes=59)))
        for value in (late, early, datetime.max, datetime.min):
            with pytest.raises(InvalidInputError, match="between the years 1900 and 9000"):
                check_timestamp(value, "as_of")

    def test_every_timestamp_argument_tells_agents_the_range(self) -> None:
        described = {
            (spec.name, name): field.description
            for spec in SPECS.values()
            for name, field in spec.Arguments.model_fields.items()
            if name in ("as_of", "valid_from", "valid_to")
        }
        assert len(described) == 3
        for description in described.values():
            assert "between the years 1900 and 9000 (without an offset: UTC)" in (description or "")

    def test_ordinary_offsets_still_convert_to_utc(self) -> None:
        assert check_timestamp("2026-03-01T09:30:00+01:00", "as_of") == datetime(2026, 3, 1, 8, 30, tzinfo=UTC)
        assert check_timestamp("8999-12-31T23:00:00-00:59", "as_of") == datetime(8999, 12, 31, 23, 59, tzinfo=UTC)


class TestInvisibleFacts:
    @pytest.mark.parametrize(
        "text",
        [
            "\uffff",  # a noncharacter
            "\U0010ffff",  # the last noncharacter
            "\ue000",  # private use
            "\U000f0000",  # supplementary private use
            "\u0378",  # unassigned
            "\ue000\u0378 \uffff\u200b",
        ],
    )
    def test_facts_without_a_visible_character_are_refused(self, text: str) -> None:
        with pytest.raises(InvalidInputError) as info:
            check_fact(text)
        message = str(info.value)
        assert message.startswith("fact must contain at least one visible character")
        assert "got only whitespace or invisible, private-use or unassigned characters (" in message
        assert f"U+{ord(text[0]):04X}" in message
        with pytest.raises(InvalidInputError, match="topic must contain at least one visible"):
            check_topic(text)

    def test_such_characters_beside_visible_text_are_kept(self) -> None:
        text = "\ue0a0 branch main is protected \uffff"
        assert check_fact(text) == text


def _cursor(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


class TestCursors:
    def test_a_cursor_the_server_wrote_round_trips(self) -> None:
        at = datetime(2026, 3, 1, 9, 30, 0, 123456, tzinfo=UTC)
        assert decode_cursor(encode_cursor(at, DOC_ID)) == (at.isoformat(), DOC_ID)

    def test_times_are_handed_on_in_one_form_postgresql_reads(self) -> None:
        # Python reads ISO week dates and compact forms; the database gets the canonical UTC form.
        assert decode_cursor(_cursor(["2026-W10-1T09:30:00+01:00", DOC_ID]))[0] == "2026-03-02T08:30:00+00:00"
        assert decode_cursor(_cursor(["20260301T093000Z", DOC_ID]))[0] == "2026-03-01T09:30:00+00:00"

    @pytest.mark.parametrize(
        "cursor",
        [
            _cursor(["2026-03-01T00:00:00+00:00", "\ud800" * 64]),  # lone surrogates
            _cursor(["2026-03-01T00:00:00+00:00", "\x00" * 64]),  # NUL
            _cursor(["2026-03-01T00:00:00+00:00", "a\x00b"]),
            _cursor(["2026-03-01T00:00:00+00:00", "Z" * 64]),  # not a fact id
            _cursor(["2026-03-01T00:00:00+00:00", DOC_ID.upper()]),
            _cursor(["2026-03-01\x00", DOC_ID]),
            _cursor(["\ud800", DOC_ID]),
            _cursor(["not a date", DOC_ID]),
            _cursor(["2026-03-01T00:00:00", DOC_ID]),  # no offset: not one this server wrote
            _cursor(["9999-12-31T23:59:59-23:59", DOC_ID]),
            _cursor(["0001-01-01T00:00:00+23:59", DOC_ID]),
            _cursor([12, DOC_ID]),
            _cursor(["2026-03-01T00:00:00+00:00", 12]),
            _cursor(["2026-03-01T00:00:00+00:00"]),
            _cursor(["2026-03-01T00:00:00+00:00", DOC_ID, "x"]),
            _cursor({"at": "2026-03-01T00:00:00+00:00", "id": DOC_ID}),
            _cursor("ab"),
            _cursor(None),
            base64.urlsafe_b64encode(b"[" * 5000 + b"]" * 5000).decode(),  # nested past the recursion limit
            base64.urlsafe_b64encode(b"\xff\xfe[1]").decode(),  # not UTF-8
            "\ud800",
            "é",
            "!!!!",
            "",
        ],
    )
    def test_forged_cursors_are_refused_before_the_database(self, cursor: str) -> None:
        with pytest.raises(InvalidInputError) as info:
            decode_cursor(cursor)
        assert str(info.value) == (
            "cursor is not valid: pass the next_cursor value of a previous kb_memory_list answer"
        )


class TestDatesInQueries:
    @pytest.mark.parametrize(
        "query",
        ["what changed on 9999-12-31?", "since 9999-12-31", "what happened in March 0000?", "December 9999 plans"],
    )
    def test_dates_the_calendar_cannot_hold_name_no_period(self, query: str) -> None:
        assert period_of(query, datetime(2026, 3, 18, tzinfo=UTC)) is None

    def test_a_later_phrase_still_names_its_period(self) -> None:
        period = period_of("December 9999 or last week?", datetime(2026, 3, 18, tzinfo=UTC))
        assert period is not None
        assert period.start == datetime(2026, 3, 9, tzinfo=UTC)
