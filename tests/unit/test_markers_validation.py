from __future__ import annotations

import pytest

from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.markers import (
    add_marker,
    check_identifier,
    content_hash,
    document_id,
    marker_assignment,
    strip_marker,
)
from haystack_osa_memory.privacy.redaction import redact
from haystack_osa_memory.validation import (
    FACT_MAX,
    check_fact,
    check_limit,
    check_query,
    check_string_list,
    check_text,
    check_topic,
    length_before_redaction,
)

# Texts that show nothing: zero-width space, word joiner, BOM, a lone combining mark, soft hyphen,
# Mongolian vowel separator, Hangul fillers, blank Braille, variation selector, tag characters, and
# mixes of them with whitespace.
INVISIBLE = [
    "\u200b",
    "\u2060",
    "\ufeff",
    "\u0301",
    "\u00ad",
    "\u180e",
    "\u3164\u115f\u1160\uffa0",
    "\u2800",
    "\ufe0f",
    "\U000e0041\U000e007f",
    "\u200b\u2060\ufeff\u0301",
    " \u200b\n\t\u0301 \u3000",
]


class TestMarkers:
    def test_add_and_strip_round_trip(self) -> None:
        marked = add_marker("deploys need the VPN", "asg-1")
        assert marked == "<!-- osa-memory:scope asg-1 -->\ndeploys need the VPN"
        assert strip_marker(marked) == "deploys need the VPN"
        assert marker_assignment(marked) == "asg-1"

    def test_strip_removes_exactly_one_leading_marker(self) -> None:
        twice = add_marker(add_marker("x", "b"), "a")
        assert strip_marker(twice) == add_marker("x", "b")

    def test_strip_leaves_text_without_leading_marker(self) -> None:
        text = "intro\n<!-- osa-memory:scope a -->\nrest"
        assert strip_marker(text) == text
        assert marker_assignment(text) is None

    def test_hash_and_id_differ_per_assignment(self) -> None:
        a, b = add_marker("same text", "a"), add_marker("same text", "b")
        assert content_hash(a) != content_hash(b)
        assert document_id("acme", "ds", content_hash(a)) != document_id("acme", "ds", content_hash(b))

    def test_id_is_deterministic_and_depends_on_org_and_dataset(self) -> None:
        h = content_hash("abc")
        assert document_id("acme", "ds", h) == document_id("acme", "ds", h)
        assert document_id("acme", "ds", h) != document_id("other", "ds", h)
        assert document_id("acme", "ds", h) != document_id("acme", "ds2", h)
        assert len(document_id("acme", "ds", h)) == 64

    def test_hash_is_sha256_of_exact_bytes(self) -> None:
        import hashlib

        assert content_hash("é\n") == hashlib.sha256("é\n".encode()).hexdigest()

    @pytest.mark.parametrize("bad", ["", "has space", "new\nline", "-lead", "x" * 129, "semi;colon", "a-->b"])
    def test_identifier_refused(self, bad: str) -> None:
        with pytest.raises(InvalidInputError, match="not allowed"):
            check_identifier(bad, "assignment")

    @pytest.mark.parametrize("good", ["a", "asg-1", "org.team:x@y_z", "A" * 128])
    def test_identifier_accepted(self, good: str) -> None:
        assert check_identifier(good, "assignment") == good


class TestValidation:
    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ("", "1 to 2000 characters"),
            ("x" * 2001, "1 to 2000 characters"),
            ("   \n\t", "visible character"),
            ("a\x00b", "NUL"),
            ("a\ud800b", "surrogate"),
            (42, "must be a string"),
            ("see <!-- osa-memory:scope other -->", "reserved sequence"),
            ("<!--OSA-MEMORY: x", "reserved sequence"),
        ],
    )
    def test_fact_refused(self, value: object, message: str) -> None:
        with pytest.raises(InvalidInputError, match=message):
            check_fact(value)

    def test_fact_limits_accepted(self) -> None:
        assert check_fact("x") == "x"
        assert check_fact("é" * 2000) == "é" * 2000

    def test_topic(self) -> None:
        assert check_topic(None) is None
        assert check_topic("t" * 120) == "t" * 120
        with pytest.raises(InvalidInputError, match="1 to 120"):
            check_topic("t" * 121)

    def test_query(self) -> None:
        assert check_query("q" * 1000)
        with pytest.raises(InvalidInputError, match="1 to 1000"):
            check_query("q" * 1001)

    @pytest.mark.parametrize("bad", [0, 21, -1, True, 1.5, "3", None])
    def test_limit_refused(self, bad: object) -> None:
        with pytest.raises(InvalidInputError, match="integer from 1 to 20"):
            check_limit(bad)

    def test_limit_accepted(self) -> None:
        assert check_limit(1) == 1
        assert check_limit(20) == 20

    @pytest.mark.parametrize("value", INVISIBLE)
    def test_invisible_only_text_is_refused_like_blank_text(self, value: str) -> None:
        first = next(c for c in value if not c.isspace())
        for check, what in ((check_fact, "fact"), (check_topic, "topic"), (check_query, "query")):
            with pytest.raises(InvalidInputError, match=f"{what} must contain at least one visible character") as e:
                check(value)
            assert f"U+{ord(first):04X}" in str(e.value)
        with pytest.raises(InvalidInputError, match="reason must contain at least one visible character"):
            check_text(value, "reason", min_len=1, max_len=500)
        with pytest.raises(InvalidInputError, match="paths item must contain at least one visible character"):
            check_string_list(["ops/x", value], "paths", max_items=20, max_len=300)

    def test_blank_message_names_what_was_found(self) -> None:
        with pytest.raises(InvalidInputError, match=r"visible character \(a letter, digit, punctuation or symbol\); "):
            check_fact("\u200b \u2060")
        with pytest.raises(
            InvalidInputError, match=r"got only whitespace or invisible characters \(U\+200B, U\+2060\)$"
        ):
            check_fact("\u200b \u2060")
        with pytest.raises(InvalidInputError, match=r"got only whitespace$"):
            check_fact(" \n")

    @pytest.mark.parametrize(
        "value", ["cafe\u0301", "\u200bx", "a\u2060b", "\ufeff.", "\U0001f44d", "\u6771", "\u0915\u094d"]
    )
    def test_text_with_a_visible_character_is_accepted(self, value: str) -> None:
        assert check_fact(value) == value
        assert check_topic(value) == value
        assert check_query(value) == value


class TestLengthAfterRedaction:
    def test_length_before_redaction_counts_each_placeholder_as_one_character(self) -> None:
        assert length_before_redaction("no placeholder") == len("no placeholder")
        assert length_before_redaction("at [REDACTED-PRIVATE-IP] and [REDACTED-SECRET]") == len("at x and y")
        assert length_before_redaction("[REDACTED-EMAIL]") == 1

    def test_redacted_fact_at_the_limit_is_accepted(self) -> None:
        fact = "hosts 10.0.0.1 10.0.0.2 " + "x" * (FACT_MAX - 24)
        assert len(fact) == FACT_MAX
        redacted = redact(fact).text
        assert len(redacted) > FACT_MAX
        with pytest.raises(InvalidInputError, match=f"got {len(redacted)}"):
            check_fact(redacted)  # measured as plain text, the redacted fact is too long
        assert check_fact(redacted, redacted=True) == redacted
        assert length_before_redaction(redacted) <= FACT_MAX

    def test_redacted_topic_at_the_limit_is_accepted(self) -> None:
        redacted = redact("db 10.0.0.1 " + "t" * 108).text
        assert len(redacted) > 120
        assert check_topic(redacted, redacted=True) == redacted
        with pytest.raises(InvalidInputError, match=f"1 to 120 characters long, got {len(redacted)}"):
            check_topic(redacted)
        too_long = redacted + "t" * (121 - length_before_redaction(redacted))  # the placeholder counts as one
        with pytest.raises(InvalidInputError, match="1 to 120 characters long, got 121"):
            check_topic(too_long, redacted=True)

    def test_redacted_fact_over_the_limit_is_still_refused(self) -> None:
        redacted = redact("host 10.0.0.1 " + "x" * FACT_MAX).text
        with pytest.raises(InvalidInputError, match=f"1 to 2000 characters long, got {len('host x ') + FACT_MAX}"):
            check_fact(redacted, redacted=True)
        with pytest.raises(InvalidInputError, match="visible character"):
            check_fact("\u200b", redacted=True)
        with pytest.raises(InvalidInputError, match="reserved sequence"):
            check_fact("[REDACTED-SECRET] <!-- osa-memory:scope x -->", redacted=True)
