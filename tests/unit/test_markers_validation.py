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
from haystack_osa_memory.validation import check_fact, check_limit, check_query, check_topic


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
