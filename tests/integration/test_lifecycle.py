"""The governed lifecycle on a real PostgreSQL: read, feedback and trust, propose and review, forget,
list, time to live, kill switches and the audit log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.errors import InvalidInputError, MemoryOffError, NotFoundError
from haystack_osa_memory.store.lifecycle import LifecycleRepository, trust_of
from tests.conftest import row_counts

pytestmark = pytest.mark.integration


def run(caller: Caller, token: str) -> Caller:
    """The same scope as ``caller`` acting through another token (another agent run)."""
    return Caller(org_id=caller.org_id, assignment_id=caller.assignment_id, token_id=token)


@pytest.fixture
def repo(pg_conn_str: str, config: MemoryConfig) -> LifecycleRepository:
    return LifecycleRepository(pg_conn_str, config)


class TestRead:
    def test_read_returns_provenance(self, memory: Memory, alice: Caller) -> None:
        me = run(alice, "tok-1")
        doc = memory.store("CI runners use 4 cores", topic="ci", kind="reference", caller=me)["document_id"]
        got = memory.read(doc, caller=me)
        assert got["content"] == "CI runners use 4 cores"
        assert (got["kind"], got["topic"], got["status"]) == ("reference", "ci", "approved")
        assert got["stored_by"] == {"token_id": "tok-1", "specialist_id": None}
        assert (got["trust"], got["confirms"], got["flags"]) == (0.5, 0, 0)
        assert got["stored_at"]
        assert got["created_at"]

    def test_one_read_event_per_run_and_fact(self, memory: Memory, alice: Caller) -> None:
        doc = memory.store("Read me often", caller=alice)["document_id"]
        for _ in range(5):
            memory.read(doc, caller=run(alice, "run-a"))
        last = memory.read(doc, caller=run(alice, "run-b"))
        assert last["reads"] == 2

    def test_other_scopes_answer_like_missing(self, memory: Memory, alice: Caller, bob: Caller) -> None:
        doc = memory.store("Alice only", caller=alice)["document_id"]
        missing = "0" * 64
        errors = []
        for target, who in ((doc, bob), (missing, bob), (doc, Caller(org_id="globex", assignment_id="asg-alpha"))):
            with pytest.raises(NotFoundError) as info:
                memory.read(target, caller=who)
            errors.append(str(info.value).replace(target, "<id>"))
        assert len(set(errors)) == 1


class TestFeedback:
    def test_trust_follows_the_formula(self, memory: Memory, alice: Caller) -> None:
        doc = memory.store("Trust me", caller=alice)["document_id"]
        confirms = flags = 0
        for i, verdict in enumerate(["confirm", "confirm", "flag", "confirm", "flag", "confirm"]):
            result = memory.feedback(doc, verdict, caller=run(alice, f"run-{i}"))
            confirms += verdict == "confirm"
            flags += verdict == "flag"
            assert result["trust"] == round((confirms + 1) / (confirms + flags + 2), 6)
            assert (result["confirms"], result["flags"]) == (confirms, flags)

    def test_a_vote_repeated_ten_times_counts_once(self, memory: Memory, alice: Caller) -> None:
        doc = memory.store("Vote once", caller=alice)["document_id"]
        for _ in range(10):
            result = memory.feedback(doc, "confirm", caller=run(alice, "same-run"))
        assert (result["confirms"], result["flags"]) == (1, 0)
        assert result["trust"] == round(trust_of(1, 0), 6)

    def test_changed_verdict_replaces_the_old_one(self, memory: Memory, alice: Caller) -> None:
        doc = memory.store("Change my mind", caller=alice)["document_id"]
        memory.feedback(doc, "confirm", caller=run(alice, "r"))
        result = memory.feedback(doc, "flag", note="turned out wrong", caller=run(alice, "r"))
        assert (result["confirms"], result["flags"]) == (0, 1)

    def test_flags_below_the_floor_hide_the_fact_from_recall(self, memory: Memory, alice: Caller) -> None:
        doc = memory.store("Flaky statement about caches", caller=alice)["document_id"]
        assert memory.feedback(doc, "flag", caller=run(alice, "r1"))["status"] == "approved"  # 1/3 >= 0.3
        result = memory.feedback(doc, "flag", caller=run(alice, "r2"))  # 1/4 < 0.3
        assert result == {**result, "status": "flagged", "trust": 0.25}
        assert memory.recall("flaky caches", caller=alice)["facts"] == []
        assert memory.read(doc, caller=alice)["status"] == "flagged"
        # confirmations that lift trust back above the floor do not restore it: only a person's review does
        memory.feedback(doc, "confirm", caller=run(alice, "r3"))
        assert memory.feedback(doc, "confirm", caller=run(alice, "r4"))["status"] == "flagged"
        assert memory.recall("flaky caches", caller=alice)["facts"] == []

    def test_note_with_a_secret_is_refused_and_nothing_written(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        doc = memory.store("Noted", caller=alice)["document_id"]
        before = row_counts(pg_conn_str, config)
        with pytest.raises(InvalidInputError, match="secret"):
            memory.feedback(doc, "flag", note="use password=hunter2hunter2", caller=alice)
        with pytest.raises(InvalidInputError, match="500"):
            memory.feedback(doc, "flag", note="x" * 501, caller=alice)
        with pytest.raises(InvalidInputError, match="verdict"):
            memory.feedback(doc, "love", caller=alice)
        assert row_counts(pg_conn_str, config) == before

    def test_feedback_on_another_scope_is_not_found_and_changes_nothing(
        self, memory: Memory, alice: Caller, bob: Caller
    ) -> None:
        doc = memory.store("Alice's fact", caller=alice)["document_id"]
        with pytest.raises(NotFoundError):
            memory.feedback(doc, "flag", caller=bob)
        assert memory.read(doc, caller=alice)["flags"] == 0


class TestProposeAndReview:
    def test_proposal_is_not_recalled_until_accepted(
        self, memory: Memory, alice: Caller, repo: LifecycleRepository
    ) -> None:
        result = memory.propose(
            "procedure", "Rotate keys", "Rotate the signing keys every quarter", ["ops/keys.md"], ["sre"], caller=alice
        )
        doc = result["document_id"]
        assert result == {"document_id": doc, "status": "proposed", "redactions": 0}
        assert memory.recall("rotate signing keys", caller=alice)["facts"] == []
        assert memory.read(doc, caller=alice)["paths"] == ["ops/keys.md"]
        assert [r["document_id"] for r in repo.review_list(assignment_id="asg-alpha")] == [doc]
        assert repo.review(doc, accept=True, actor="cli:test", note="ok")["status"] == "approved"
        facts = memory.recall("rotate signing keys", caller=alice)["facts"]
        assert [f["document_id"] for f in facts] == [doc]
        assert facts[0]["kind"] == "procedure"

    def test_rejected_proposal_is_never_recalled(
        self, memory: Memory, alice: Caller, repo: LifecycleRepository
    ) -> None:
        doc = memory.propose("pitfall", "Bad idea", "Deploy on Fridays", caller=alice)["document_id"]
        repo.review(doc, accept=False, actor="cli:test", note="no")
        assert memory.recall("deploy fridays", caller=alice)["facts"] == []
        with pytest.raises(InvalidInputError, match="no proposed or flagged fact"):
            repo.review(doc, accept=True, actor="cli:test", note=None)

    def test_curation_gate(self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig) -> None:
        memory.store("The build cache lives on NFS", caller=alice)
        before = row_counts(pg_conn_str, config)
        assert "duplicate" in memory.propose("fact", "Cache", "The build cache lives on NFS!", caller=alice)["rejected"]
        assert "secret" in memory.propose("fact", "Creds", "token: ghp_" + "a" * 36, caller=alice)["rejected"]
        for kind in ("decision", "opinion"):
            with pytest.raises(InvalidInputError, match="kind"):
                memory.propose(kind, "t", "b", caller=alice)
        with pytest.raises(InvalidInputError, match="title"):
            memory.propose("fact", "t" * 121, "b", caller=alice)
        with pytest.raises(InvalidInputError, match="paths"):
            memory.propose("fact", "t", "b", paths=["p"] * 21, caller=alice)
        assert row_counts(pg_conn_str, config) == before


class TestForget:
    def test_forgotten_fact_is_gone_everywhere_and_can_be_stored_afresh(
        self, memory: Memory, alice: Caller, repo: LifecycleRepository, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        doc = memory.store("Obsolete: the VPN gateway is vpn-old", caller=alice)["document_id"]
        memory.feedback(doc, "confirm", caller=run(alice, "r1"))
        memory.read(doc, caller=run(alice, "r1"))
        assert memory.forget(doc, "gateway replaced", caller=alice) == {"forgotten": True, "document_id": doc}
        assert memory.recall("VPN gateway", caller=alice)["facts"] == []
        with pytest.raises(NotFoundError):
            memory.read(doc, caller=alice)
        with pytest.raises(NotFoundError):
            memory.feedback(doc, "confirm", caller=alice)
        with pytest.raises(NotFoundError):
            memory.forget(doc, "again", caller=alice)
        assert memory.list_facts(caller=alice)["facts"] == []
        assert memory.customer_search("VPN gateway", org_id="acme") == []
        counts = row_counts(pg_conn_str, config)
        assert (counts["haystack_documents"], counts["feedback"], counts["reads"]) == (0, 0, 0)
        with psycopg.connect(pg_conn_str) as conn:
            row = conn.execute(
                sql.SQL("SELECT status, metadata->'retired'->>'reason' FROM {}.{} WHERE id = %s").format(
                    sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table)
                ),
                (doc,),
            ).fetchone()
        assert row == ("retired", "gateway replaced")
        again = memory.store("Obsolete: the VPN gateway is vpn-old", caller=alice)["document_id"]
        assert again == doc
        fresh = memory.read(doc, caller=alice)
        assert (fresh["status"], fresh["confirms"], fresh["reads"]) == ("approved", 0, 1)
        assert [a["action"] for a in repo.audit(assignment_id="asg-alpha")] == ["store", "feedback", "forget", "store"]

    def test_forget_needs_a_reason(self, memory: Memory, alice: Caller) -> None:
        doc = memory.store("x fact", caller=alice)["document_id"]
        with pytest.raises(InvalidInputError, match="reason"):
            memory.forget(doc, "", caller=alice)


class TestList:
    def test_pages_filters_and_scope(self, memory: Memory, alice: Caller, bob: Caller) -> None:
        ids = [
            memory.store(f"Alpha fact {i}", topic="even" if i % 2 == 0 else "odd", caller=alice)["document_id"]
            for i in range(45)
        ]
        memory.store("Bob's fact", caller=bob)
        seen, cursor, pages = [], None, 0
        while True:
            page = memory.list_facts(cursor=cursor, caller=alice)
            seen += [f["document_id"] for f in page["facts"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 3
        assert seen == ids
        evens = memory.list_facts(topic="even", caller=alice)
        assert len(evens["facts"]) == 20
        assert all(f["topic"] == "even" for f in evens["facts"])
        assert memory.list_facts(status="proposed", caller=alice)["facts"] == []
        with pytest.raises(InvalidInputError, match="cursor"):
            memory.list_facts(cursor="not-a-cursor", caller=alice)
        with pytest.raises(InvalidInputError, match="status"):
            memory.list_facts(status="retired", caller=alice)


class TestTimeToLive:
    def test_stale_facts_are_marked_and_ranked_below_fresh_ones(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        old = memory.store("Release freeze starts Monday release freeze", ttl_days=1, caller=alice)["document_id"]
        fresh = memory.store("Release notes go to the wiki", caller=alice)["document_id"]
        past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {}.{} SET metadata = jsonb_set(metadata, '{{expires_at}}', to_jsonb(%s::text)) "
                    "WHERE id = %s"
                ).format(sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table)),
                (past, old),
            )
        facts = memory.recall("release freeze", caller=alice)["facts"]
        assert [f["document_id"] for f in facts] == [fresh, old]
        assert [f["stale"] for f in facts] == [False, True]

    def test_ttl_validation(self, memory: Memory, alice: Caller) -> None:
        for bad in (0, 3651, True):
            with pytest.raises(InvalidInputError, match="ttl_days"):
                memory.store("x", ttl_days=bad, caller=alice)


class TestKillSwitch:
    OFF = "Memory is off for this assignment"

    def _every_tool_refuses(self, memory: Memory, caller: Caller, doc: str) -> None:
        calls = [
            lambda: memory.store("new fact", caller=caller),
            lambda: memory.recall("fact", caller=caller),
            lambda: memory.read(doc, caller=caller),
            lambda: memory.feedback(doc, "confirm", caller=caller),
            lambda: memory.propose("fact", "t", "a proposal", caller=caller),
            lambda: memory.forget(doc, "why", caller=caller),
            lambda: memory.list_facts(caller=caller),
        ]
        for call in calls:
            with pytest.raises(MemoryOffError) as info:
                call()
            assert str(info.value) == self.OFF

    @pytest.mark.parametrize("level", ["assignment", "org"])
    def test_switch_off_refuses_everything_and_writes_nothing(
        self,
        memory: Memory,
        alice: Caller,
        bob: Caller,
        repo: LifecycleRepository,
        pg_conn_str: str,
        config: MemoryConfig,
        level: str,
    ) -> None:
        doc = memory.store("Kept while off", caller=alice)["document_id"]
        target = ("acme", "asg-alpha") if level == "assignment" else ("acme", "*")
        repo.set_switch(*target, enabled=False, actor="cli:test", reason="incident")
        before = row_counts(pg_conn_str, config)
        self._every_tool_refuses(memory, alice, doc)
        assert row_counts(pg_conn_str, config) == before
        if level == "assignment":
            assert memory.recall("anything at all", caller=bob)["facts"] == []  # bob still served
        repo.set_switch(*target, enabled=True, actor="cli:test", reason=None)
        assert [f["document_id"] for f in memory.recall("kept while off", caller=alice)["facts"]] == [doc]

    def test_server_switch(self, config: MemoryConfig, alice: Caller, pg_conn_str: str) -> None:
        memory = Memory(config.model_copy(update={"enabled": False}), use_default_embedders=False)
        before = row_counts(pg_conn_str, config)
        self._every_tool_refuses(memory, alice, "0" * 64)
        assert row_counts(pg_conn_str, config) == before


class TestAudit:
    def test_every_write_is_audited_with_who_what_when_which(
        self, memory: Memory, alice: Caller, repo: LifecycleRepository
    ) -> None:
        me = run(alice, "tok-9")
        doc = memory.store("Audited fact", caller=me)["document_id"]
        prop = memory.propose("reference", "Doc", "See the runbook", caller=me)["document_id"]
        memory.feedback(doc, "confirm", caller=me)
        repo.review(prop, accept=True, actor="cli:reviewer", note=None)
        memory.forget(doc, "done", caller=me)
        repo.set_switch("acme", "asg-alpha", enabled=False, actor="cli:ops", reason="test")
        rows = repo.audit(org_id="acme", assignment_id="asg-alpha")
        assert [(r["action"], r["actor"], r["document_id"]) for r in rows] == [
            ("store", "tok-9", doc),
            ("propose", "tok-9", prop),
            ("feedback", "tok-9", doc),
            ("review", "cli:reviewer", prop),
            ("forget", "tok-9", doc),
            ("switch", "cli:ops", None),
        ]
        assert all(r["at"] is not None for r in rows)
        assert rows[-1]["details"] == {"enabled": False, "reason": "test"}
