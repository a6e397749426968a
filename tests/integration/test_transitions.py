"""Only a person's review moves a fact out of `proposed`, `flagged` or `rejected` into recall: every agent
path (store, store with supersedes, propose, feedback, import, reflect, forget then store) is tried from
every status, and the outcome must be the one `tools.TRANSITIONS` allows."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.errors import InvalidInputError, SupersessionError
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.tools import (
    ACTIONS,
    AGENT_ACTIONS,
    APPROVED,
    CONSOLIDATED,
    FLAGGED,
    HELD_STATUSES,
    NEW,
    PERSON_ACTIONS,
    PROPOSED,
    REJECTED,
    STATUSES,
    SUPERSEDED,
    TRANSITIONS,
)
from haystack_osa_memory.transfer import ImportItem

pytestmark = pytest.mark.integration

BYPASS_TITLE = "Gate bypass"
BYPASS_BODY = "Deploys to prod may skip the change board on Fridays"


def run(caller: Caller, token: str) -> Caller:
    """The same scope as ``caller`` acting through another token (another agent run)."""
    return Caller(org_id=caller.org_id, assignment_id=caller.assignment_id, token_id=token)


@pytest.fixture
def repo(pg_conn_str: str, config: MemoryConfig) -> LifecycleRepository:
    return LifecycleRepository(pg_conn_str, config)


def recalled(memory: Memory, query: str, caller: Caller, **kwargs: object) -> list[str]:
    return [f["document_id"] for f in memory.recall(query, caller=caller, **kwargs)["facts"]]  # type: ignore[arg-type]


def flag_twice(memory: Memory, doc: str, caller: Caller) -> None:
    for token in ("flagger-1", "flagger-2"):
        memory.feedback(doc, "flag", caller=run(caller, token))


class TestReviewBypass:
    def test_superseding_a_proposal_then_storing_its_text_does_not_approve_it(
        self, memory: Memory, alice: Caller, repo: LifecycleRepository
    ) -> None:
        proposal = memory.propose("fact", BYPASS_TITLE, BYPASS_BODY, caller=alice)["document_id"]
        with pytest.raises(SupersessionError, match="review"):
            memory.store("x1", supersedes=[proposal], caller=alice)
        again = memory.store(f"{BYPASS_TITLE}\n\n{BYPASS_BODY}", caller=alice)
        assert again["document_id"] == proposal
        assert again["status"] == "proposed"
        assert memory.read(proposal, caller=alice)["status"] == "proposed"
        assert recalled(memory, "change board fridays", alice) == []
        assert [r["document_id"] for r in repo.review_list(assignment_id=alice.assignment_id)] == [proposal]
        assert recalled(memory, "change board fridays", alice, include_superseded=True) == []

    def test_superseding_a_flagged_fact_is_refused_and_its_text_stays_flagged(
        self, memory: Memory, alice: Caller
    ) -> None:
        doc = memory.store("The staging database accepts writes from CI", caller=alice)["document_id"]
        flag_twice(memory, doc, alice)
        with pytest.raises(SupersessionError, match="flagged"):
            memory.store("x1", supersedes=[doc], caller=alice)
        again = memory.store("The staging database accepts writes from CI", caller=alice)
        assert (again["document_id"], again["status"]) == (doc, "flagged")
        assert recalled(memory, "staging database writes", alice) == []

    def test_a_fact_forgotten_while_held_comes_back_proposed(self, memory: Memory, alice: Caller) -> None:
        proposal = memory.propose("fact", BYPASS_TITLE, BYPASS_BODY, caller=alice)["document_id"]
        memory.forget(proposal, "retracted", caller=alice)
        again = memory.store(f"{BYPASS_TITLE}\n\n{BYPASS_BODY}", caller=alice)
        assert (again["document_id"], again["status"]) == (proposal, "proposed")
        assert recalled(memory, "change board fridays", alice) == []

        flagged = memory.store("Caches never need warming", caller=alice)["document_id"]
        flag_twice(memory, flagged, alice)
        memory.forget(flagged, "wrong", caller=alice)
        assert memory.store("Caches never need warming", caller=alice)["status"] == "proposed"

    def test_importing_the_text_of_a_fact_forgotten_while_held_does_not_approve_it(
        self, memory: Memory, alice: Caller
    ) -> None:
        doc = memory.propose("fact", BYPASS_TITLE, BYPASS_BODY, caller=alice)["document_id"]
        memory.forget(doc, "retracted", caller=alice)
        item = ImportItem(fact=f"{BYPASS_TITLE}\n\n{BYPASS_BODY}", origin="notes:1", status="approved")
        assert memory.import_items([item], caller=alice).stored == 1
        assert memory.read(doc, caller=alice)["status"] == "proposed"
        assert recalled(memory, "change board fridays", alice) == []

    def test_a_fact_waiting_for_review_cannot_supersede(self, memory: Memory, alice: Caller) -> None:
        old = memory.store("The change board meets on Mondays", caller=alice)["document_id"]
        doc = memory.propose("fact", BYPASS_TITLE, BYPASS_BODY, caller=alice)["document_id"]
        with pytest.raises(SupersessionError, match="waits for a person's review"):
            memory.store(f"{BYPASS_TITLE}\n\n{BYPASS_BODY}", supersedes=[old], caller=alice)
        assert memory.read(old, caller=alice)["status"] == "approved"
        assert memory.read(doc, caller=alice)["status"] == "proposed"

    def test_an_approved_fact_forgotten_and_stored_again_starts_afresh(self, memory: Memory, alice: Caller) -> None:
        doc = memory.store("The VPN gateway is vpn-new", caller=alice)["document_id"]
        memory.forget(doc, "moved", caller=alice)
        again = memory.store("The VPN gateway is vpn-new", caller=alice)
        assert again["document_id"] == doc
        assert "status" not in again  # approved: the usual answer
        assert recalled(memory, "VPN gateway", alice) == [doc]

    def test_confirmations_do_not_lift_a_flag(self, memory: Memory, alice: Caller) -> None:
        doc = memory.store("Flaky statement about caches", caller=alice)["document_id"]
        flag_twice(memory, doc, alice)
        for token in ("c1", "c2", "c3", "c4"):
            result = memory.feedback(doc, "confirm", caller=run(alice, token))
        assert result["status"] == "flagged"
        assert recalled(memory, "flaky caches", alice) == []

    def test_a_reviewers_accept_stands_against_the_next_vote(
        self, memory: Memory, alice: Caller, repo: LifecycleRepository
    ) -> None:
        doc = memory.store("Flaky statement about caches", caller=alice)["document_id"]
        flag_twice(memory, doc, alice)
        repo.review(doc, accept=True, actor="cli:reviewer", note="checked")
        result = memory.feedback(doc, "flag", caller=run(alice, "flagger-3"))
        assert (result["status"], result["flags"], result["confirms"]) == ("approved", 1, 0)
        assert recalled(memory, "flaky caches", alice) == [doc]
        review = [a for a in repo.audit(assignment_id=alice.assignment_id) if a["action"] == "review"]
        assert review[-1]["details"]["votes_reset"] == {"confirms": 0, "flags": 2}


class TestNoLoops:
    def test_a_value_that_goes_back_makes_no_loop(
        self, memory: Memory, alice: Caller, repo: LifecycleRepository
    ) -> None:
        x = memory.store("The deploy window opens at 09:00", valid_from="2026-01-01", caller=alice)["document_id"]
        y = memory.store("The deploy window opens at 10:00", valid_from="2026-02-01", supersedes=[x], caller=alice)[
            "document_id"
        ]
        memory.store("The deploy window opens at 09:00", valid_from="2026-03-01", supersedes=[y], caller=alice)
        read_x, read_y = memory.read(x, caller=alice), memory.read(y, caller=alice)
        assert read_x.get("supersedes") == [y]
        assert x not in (read_y.get("supersedes") or [])
        assert read_y["superseded_by"] == x
        assert (read_x["status"], read_y["status"]) == ("approved", "superseded")
        assert [v["document_id"] for v in memory.history(x, caller=alice)] == [y, x]
        assert recalled(memory, "deploy window opens", alice) == [x]
        stores = [a for a in repo.audit(assignment_id=alice.assignment_id) if a["action"] == "store"]
        assert stores[-1]["document_id"] == x
        assert stores[-1]["details"]["held_again_after"] == y


# -- every path from every status ----------------------------------------------------------------------
TITLE = "Release gate"


def _text(n: int) -> str:
    return f"{TITLE}\n\nRelease train {n} needs the sign-off of team lead number {n} before noon"


def _status(pg_conn_str: str, config: MemoryConfig, doc: str) -> str:
    query = sql.SQL("SELECT status FROM {}.{} WHERE id = %s").format(
        sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table)
    )
    with psycopg.connect(pg_conn_str) as conn:
        row = conn.execute(query, (doc,)).fetchone()
    assert row is not None
    return str(row[0])


def _make(memory: Memory, repo: LifecycleRepository, status: str, text: str, me: Caller) -> str:
    """A fact with ``text`` in ``status``, made through the tools and the review, as in use."""
    body = text.split("\n\n", 1)[1]
    if status in (PROPOSED, REJECTED):
        doc = str(memory.propose("fact", TITLE, body, caller=me)["document_id"])
        if status == REJECTED:
            repo.review(doc, accept=False, actor="cli:reviewer", note=None)
        return doc
    doc = str(memory.store(text, valid_from="2026-01-01", caller=me)["document_id"])
    if status == FLAGGED:
        flag_twice(memory, doc, me)
    elif status == SUPERSEDED:
        memory.store(f"Release trains now need no sign-off ({me.assignment_id})", supersedes=[doc], caller=me)
    elif status == CONSOLIDATED:
        memory.store(text + ".", caller=me)  # a repeat
        memory.reflect(caller=me)
    return doc


def _act(memory: Memory, repo: LifecycleRepository, action: str, doc: str, text: str, me: Caller) -> bool:
    """Apply ``action`` to the fact ``doc`` (whose text is ``text``); True when the tool refused it."""
    body = text.split("\n\n", 1)[1]
    try:
        if action == "store":
            memory.store(text, caller=me)
        elif action == "supersede":
            memory.store(f"Release trains changed again ({me.assignment_id})", supersedes=[doc], caller=me)
        elif action == "propose":
            return "rejected" in memory.propose("fact", TITLE, body, caller=me)
        elif action in ("confirm", "flag"):
            for n in range(4):
                memory.feedback(doc, action, caller=run(me, f"{action}-{n}"))
        elif action == "import":
            report = memory.import_items([ImportItem(fact=text, origin="test:1", status="approved")], caller=me)
            assert report.stored + report.skipped_existing == 1
        elif action == "reflect":
            memory.store(text + "!", caller=me)  # an approved repeat of its text
            memory.reflect(caller=me)
        elif action == "forget":
            memory.forget(doc, "test", caller=me)
        elif action == "forget, then store":
            memory.forget(doc, "test", caller=me)
            memory.store(text, caller=me)
        elif action in ("review accept", "review reject"):
            repo.review(doc, accept=action == "review accept", actor="cli:reviewer", note=None)
        else:
            raise AssertionError(action)
    except InvalidInputError:  # SupersessionError included
        return True
    return False


def test_every_path_from_every_status_ends_where_the_table_says(
    memory: Memory, repo: LifecycleRepository, pg_conn_str: str, config: MemoryConfig
) -> None:
    """`tools.TRANSITIONS` cell by cell: each (status, action) is tried on its own fact, in its own
    assignment, through the tools; the status after it and whether the tool refused must match."""
    wrong = []
    for n, ((status, action), (expected, refused)) in enumerate(sorted(TRANSITIONS.items())):
        me = Caller(org_id="acme", assignment_id=f"cell-{n}")
        text = _text(n)
        if status == NEW:
            doc = None
            if action == "store":
                doc = memory.store(text, caller=me)["document_id"]
            elif action == "propose":
                doc = memory.propose("fact", TITLE, text.split("\n\n", 1)[1], caller=me)["document_id"]
            elif action == "import":
                memory.import_items([ImportItem(fact=text, origin="test:1")], caller=me)
                doc = memory.list_facts(caller=me)["facts"][0]["document_id"]
            got, was_refused = _status(pg_conn_str, config, str(doc)), False
        else:
            doc = _make(memory, repo, status, text, me)
            assert _status(pg_conn_str, config, doc) == status, (status, "not made")
            was_refused = _act(memory, repo, action, doc, text, me)
            got = _status(pg_conn_str, config, doc)
        if (got, was_refused) != (expected, refused):
            wrong.append(f"{status} --{action}--> {got}{' (refused)' if was_refused else ''}, allowed: {expected}")
        if got in (APPROVED,) and status in HELD_STATUSES and action not in PERSON_ACTIONS:
            wrong.append(f"{status} --{action}--> approved without a person")
    assert wrong == []


def test_every_agent_action_and_status_is_in_the_table() -> None:
    live = [s for s in STATUSES if s != "retired"]
    assert {(s, a) for s in live for a in ACTIONS} <= set(TRANSITIONS)
    held_to_recalled = [
        (s, a)
        for (s, a), (after, refused) in TRANSITIONS.items()
        if s in HELD_STATUSES and a in AGENT_ACTIONS and after == APPROVED and not refused
    ]
    assert held_to_recalled == []
