"""docs/lifecycle.md shows the transition table and diagram rendered from `tools.TRANSITIONS`."""

from __future__ import annotations

from pathlib import Path

import pytest

from haystack_osa_memory import tools

DOC = Path(__file__).resolve().parents[2] / "docs" / "lifecycle.md"
START = "<!-- transitions: rendered from tools.TRANSITIONS -->\n"
END = "\n<!-- /transitions -->"


def test_the_lifecycle_doc_shows_the_table_in_the_code() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text.count(START) == 1
    rendered = text.split(START, 1)[1].split(END, 1)[0]
    assert rendered == tools.transitions_markdown(), "regenerate it with tools.transitions_markdown()"


def test_a_changed_transition_changes_the_rendering(monkeypatch: pytest.MonkeyPatch) -> None:
    before = tools.transitions_markdown()
    monkeypatch.setitem(tools.TRANSITIONS, (tools.PROPOSED, "store"), (tools.APPROVED, False))
    assert tools.transitions_markdown() != before


def test_the_rules_derive_from_the_table() -> None:
    assert tools.SUPERSEDABLE_STATUSES == (tools.APPROVED,)
    assert set(tools.REVIEWABLE_STATUSES) == {tools.PROPOSED, tools.FLAGGED}
    assert set(tools.HELD_STATUSES) == {tools.PROPOSED, tools.FLAGGED, tools.REJECTED}
    assert tools.FLAGGABLE_STATUSES == (tools.APPROVED,)
    # no agent action takes a held fact into recall
    for (status, action), (after, refused) in tools.TRANSITIONS.items():
        if status in tools.HELD_STATUSES and action in tools.AGENT_ACTIONS and not refused:
            assert after != tools.APPROVED, (status, action)
