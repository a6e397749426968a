"""Memory that stays true, on a real PostgreSQL: supersession, validity time, recall as of a date,
possible successions, conflicts, chains through read / history / forget / export and import."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from haystack import component
from haystack.dataclasses import ChatMessage
from psycopg import sql
from typer.testing import CliRunner

from haystack_osa_memory import Caller, Memory, MemoryConfig, ScopedMemoryRetriever
from haystack_osa_memory.cli.main import app
from haystack_osa_memory.errors import InvalidInputError, NotFoundError, SupersessionError
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.transfer import ImportItem, export_line, read_items
from tests.conftest import row_counts

pytestmark = pytest.mark.integration

OLD = "Staging uses the VPN profile stg-eu"
NEW = "Staging now uses the VPN profile stg-eu2"
QUESTION = "Which VPN profile does staging use?"
JAN = datetime(2026, 1, 1, tzinfo=UTC)


def at(days: int) -> str:
    return (JAN + timedelta(days=days)).isoformat()


def contents(result: dict[str, Any]) -> list[str]:
    return [f["content"] for f in result["facts"]]


def governing(pg_conn_str: str, config: MemoryConfig, document_id: str) -> tuple[str, dict[str, Any]]:
    query = sql.SQL("SELECT status, metadata FROM {}.{} WHERE id = %s").format(
        sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table)
    )
    with psycopg.connect(pg_conn_str) as conn:
        row = conn.execute(query, (document_id,)).fetchone()
    assert row is not None
    return str(row[0]), dict(row[1])


class TestSupersedes:
    def test_supersession_keeps_history_links_and_audits(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        old = memory.store(OLD, caller=alice, valid_from=at(0))["document_id"]
        new = memory.store(NEW, caller=alice, valid_from=at(30), supersedes=[old])
        assert new["superseded"] == [old]
        status, meta = governing(pg_conn_str, config, old)
        assert status == "superseded"
        assert meta["superseded_by"] == new["document_id"]
        assert datetime.fromisoformat(meta["valid_to"]) == JAN + timedelta(days=30)
        _, new_meta = governing(pg_conn_str, config, new["document_id"])
        assert new_meta["supersedes"] == [old]
        actions = [(r["action"], r["document_id"]) for r in LifecycleRepository(pg_conn_str, config).audit()]
        assert ("supersede", old) in actions
        # Recall answers with the current fact only; the old one is kept, readable, and in the history.
        assert contents(memory.recall(QUESTION, caller=alice)) == [NEW]
        assert memory.read(old, caller=alice)["status"] == "superseded"

    @pytest.mark.parametrize("case", ["unknown", "other-scope", "mixed"])
    def test_unknown_or_foreign_ids_write_nothing(
        self, memory: Memory, alice: Caller, bob: Caller, pg_conn_str: str, config: MemoryConfig, case: str
    ) -> None:
        mine = memory.store(OLD, caller=alice, valid_from=at(0))["document_id"]
        theirs = memory.store("Bob's fact about staging", caller=bob)["document_id"]
        ids = {"unknown": ["f" * 64], "other-scope": [theirs], "mixed": [mine, theirs]}[case]
        before = row_counts(pg_conn_str, config)
        with pytest.raises(SupersessionError) as info:
            memory.store(NEW, caller=alice, supersedes=ids)
        assert "Nothing was stored" in str(info.value)
        assert f"no fact {ids[-1]} in this assignment" in str(info.value)
        assert row_counts(pg_conn_str, config) == before
        assert governing(pg_conn_str, config, mine)[0] == "approved"
        assert contents(memory.recall(QUESTION, caller=alice)) == [OLD]

    def test_other_scope_reads_like_unknown(self, memory: Memory, alice: Caller, bob: Caller) -> None:
        theirs = memory.store("Bob's fact", caller=bob)["document_id"]
        messages = []
        for target in (theirs, "e" * 64):
            with pytest.raises(SupersessionError) as info:
                memory.store(NEW, caller=alice, supersedes=[target])
            messages.append(str(info.value).replace(target, "<id>"))
        assert messages[0] == messages[1]

    def test_already_superseded_itself_and_later_validity_are_refused(self, memory: Memory, alice: Caller) -> None:
        old = memory.store(OLD, caller=alice, valid_from=at(0))["document_id"]
        new = memory.store(NEW, caller=alice, valid_from=at(10), supersedes=[old])["document_id"]
        with pytest.raises(SupersessionError, match=f"already superseded by {new}"):
            memory.store("Staging uses VPN profile stg-eu3", caller=alice, supersedes=[old])
        with pytest.raises(SupersessionError, match="cannot supersede itself"):
            memory.store(NEW, caller=alice, supersedes=[new])
        with pytest.raises(SupersessionError, match="not before the new fact"):
            memory.store("Staging used profile stg-eu0", caller=alice, valid_from=at(5), supersedes=[new])

    def test_a_successor_is_found_by_its_predecessors_words(self, memory: Memory, alice: Caller) -> None:
        """The new wording leaves out "region" and "cluster"; the fact it superseded said them."""
        old = memory.store("The swift cluster lives in region eu-west-1.", caller=alice, valid_from=at(0))
        memory.store("The region of the robin cluster is eu-west-1 after the move.", caller=alice, valid_from=at(1))
        memory.store("Deploys to the robin cluster need a ticket.", caller=alice, valid_from=at(2))
        new = memory.store(
            "Swift now runs in sa-east-1.", caller=alice, valid_from=at(3), supersedes=[old["document_id"]]
        )
        facts = memory.recall("Which region is the swift cluster in?", caller=alice)["facts"]
        assert facts[0]["document_id"] == new["document_id"]
        assert facts[0]["content"] == "Swift now runs in sa-east-1."  # recall returns its own text

    def test_two_supersessions_of_one_fact_at_once(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        """Both stores run while a third session holds the fact's row lock; released, one wins and the
        other re-reads the row, finds it superseded and is refused whole."""
        old = memory.store(OLD, caller=alice, valid_from=at(0))["document_id"]
        memory.warm_up()
        results: dict[str, Any] = {}
        gov = sql.SQL("SELECT 1 FROM {}.{} WHERE id = %s FOR UPDATE").format(
            sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table)
        )

        def store(text: str) -> None:
            try:
                results[text] = memory.store(text, caller=alice, supersedes=[old])
            except SupersessionError as e:
                results[text] = e

        texts = ["Staging now uses VPN profile stg-eu2", "Staging now uses VPN profile stg-eu3"]
        waiting_sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        with psycopg.connect(pg_conn_str) as locker, psycopg.connect(pg_conn_str, autocommit=True) as watcher:
            locker.execute(gov, (old,))
            threads = [threading.Thread(target=store, args=(t,)) for t in texts]
            for t in threads:
                t.start()
            # Both wait on the lock (their UPDATE of the predecessor) before it is released.
            waiting = 0
            for _ in range(200):
                row = watcher.execute(waiting_sql).fetchone()
                waiting = int(row[0]) if row else 0
                if waiting >= 2:
                    break
                threading.Event().wait(0.05)
            assert waiting >= 2
        for t in threads:
            t.join(timeout=30)
        winners = [t for t in texts if isinstance(results[t], dict)]
        losers = [t for t in texts if isinstance(results[t], SupersessionError)]
        assert len(winners) == 1
        assert len(losers) == 1
        assert "already superseded by" in str(results[losers[0]])
        status, meta = governing(pg_conn_str, config, old)
        assert (status, meta["superseded_by"]) == ("superseded", results[winners[0]]["document_id"])
        # Nothing of the loser was written: not its governing row, not its chunk.
        assert contents(memory.recall("staging VPN profile", caller=alice)) == [winners[0]]
        assert contents(memory.recall(losers[0], caller=alice, include_superseded=True)).count(losers[0]) == 0


class TestValidity:
    def test_recall_default_as_of_and_history(self, memory: Memory, alice: Caller) -> None:
        old = memory.store(OLD, caller=alice, valid_from=at(0))["document_id"]
        new = memory.store(NEW, caller=alice, valid_from=at(30), supersedes=[old])["document_id"]
        assert contents(memory.recall(QUESTION, caller=alice)) == [NEW]
        assert contents(memory.recall(QUESTION, caller=alice, as_of=at(10))) == [OLD]
        assert contents(memory.recall(QUESTION, caller=alice, as_of=at(31))) == [NEW]
        assert contents(memory.recall(QUESTION, caller=alice, as_of="2025-12-01")) == []
        history = {f["document_id"]: f for f in memory.recall(QUESTION, caller=alice, include_superseded=True)["facts"]}
        assert set(history) == {old, new}
        assert history[old]["superseded_by"] == new
        assert datetime.fromisoformat(history[old]["valid_to"]) == JAN + timedelta(days=30)
        assert history[new]["valid_to"] is None
        assert "superseded_by" not in history[new]
        assert datetime.fromisoformat(history[new]["valid_from"]) == JAN + timedelta(days=30)

    def test_history_lists_a_successor_before_what_it_replaced(self, memory: Memory, alice: Caller) -> None:
        old = memory.store("Staging VPN: the staging VPN profile is stg-eu", caller=alice, valid_from=at(0))
        new = memory.store("Staging moved to stg-eu2", caller=alice, valid_from=at(9), supersedes=[old["document_id"]])
        query = "staging VPN profile"
        listed = memory.recall(query, caller=alice, include_superseded=True)["facts"]
        assert [f["document_id"] for f in listed] == [new["document_id"], old["document_id"]]
        # (by wording alone the old one ranks first); as of before the change, it alone held
        assert [f["document_id"] for f in memory.recall(query, caller=alice, as_of=at(5))["facts"]] == [
            old["document_id"]
        ]

    def test_explicit_validity_window(self, memory: Memory, alice: Caller) -> None:
        memory.store("The freeze holds deploys back", caller=alice, valid_from=at(0), valid_to=at(7))
        future = (datetime.now(UTC) + timedelta(days=30)).isoformat()
        memory.store("The new freeze holds deploys back", caller=alice, valid_from=future)
        assert contents(memory.recall("freeze deploys", caller=alice)) == []
        assert contents(memory.recall("freeze deploys", caller=alice, as_of=at(3))) == ["The freeze holds deploys back"]
        assert len(memory.recall("freeze deploys", caller=alice, include_superseded=True)["facts"]) == 2

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"valid_from": "yesterday"}, "valid_from must be an ISO 8601"),
            ({"valid_from": at(5), "valid_to": at(5)}, "must be after valid_from"),
            ({"valid_to": "2020-01-01"}, "is in the past"),
            ({"supersedes": ["not-an-id"]}, "document_id must be"),
            ({"supersedes": ["a" * 64] * 21}, "at most 20"),
            ({"valid_from": "0026-01-01"}, "between the years"),
        ],
    )
    def test_bad_arguments_write_nothing(
        self,
        memory: Memory,
        alice: Caller,
        pg_conn_str: str,
        config: MemoryConfig,
        kwargs: dict[str, Any],
        message: str,
    ) -> None:
        memory.warm_up()
        before = row_counts(pg_conn_str, config)
        with pytest.raises(InvalidInputError, match=message):
            memory.store(NEW, caller=alice, **kwargs)
        assert row_counts(pg_conn_str, config) == before

    def test_a_period_named_by_the_question_comes_first(self, memory: Memory, alice: Caller) -> None:
        now = datetime.now(UTC)
        monday = (now - timedelta(days=now.weekday())).replace(hour=9, minute=0, second=0, microsecond=0)
        older = memory.store(
            "Decision: freeze deploys during the holidays.", caller=alice, valid_from=monday - timedelta(days=30)
        )
        recent = memory.store(
            "Decision: adopt the new linter for every repository we own.",
            caller=alice,
            valid_from=monday - timedelta(days=5),
        )
        plain = memory.recall("which decision did we take", caller=alice)["facts"]
        assert [f["document_id"] for f in plain] == [older["document_id"], recent["document_id"]]  # wording alone
        asked = memory.recall("which decision did we take last week", caller=alice)["facts"]
        assert [f["document_id"] for f in asked] == [recent["document_id"], older["document_id"]]

    def test_bad_as_of_is_refused(self, memory: Memory, alice: Caller) -> None:
        with pytest.raises(InvalidInputError, match="as_of must be an ISO 8601"):
            memory.recall(QUESTION, caller=alice, as_of="last week")

    def test_storing_again_keeps_valid_from_unless_given(self, memory: Memory, alice: Caller) -> None:
        doc = memory.store(OLD, caller=alice, valid_from=at(0))["document_id"]
        memory.store(OLD, caller=alice)
        assert datetime.fromisoformat(memory.read(doc, caller=alice)["valid_from"]) == JAN
        memory.store(OLD, caller=alice, valid_from=at(2))
        assert datetime.fromisoformat(memory.read(doc, caller=alice)["valid_from"]) == JAN + timedelta(days=2)

    def test_storing_a_superseded_fact_again_makes_it_hold_again(self, memory: Memory, alice: Caller) -> None:
        old = memory.store(OLD, caller=alice, valid_from=at(0))["document_id"]
        new = memory.store(NEW, caller=alice, valid_from=at(10), supersedes=[old])["document_id"]
        back = memory.store(OLD, caller=alice, supersedes=[new])
        assert back["document_id"] == old
        assert contents(memory.recall(QUESTION, caller=alice)) == [OLD]
        read = memory.read(old, caller=alice)
        assert read["status"] == "approved"
        assert "valid_to" not in read
        assert "superseded_by" not in read
        assert memory.read(new, caller=alice)["superseded_by"] == old


class TestPossibleSuccession:
    def test_store_suggests_without_changing(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        old = memory.store(OLD, caller=alice)["document_id"]
        memory.store("Production uses the VPN profile prd-eu", caller=alice)
        memory.store("Staging deploys need a change ticket", caller=alice)
        result = memory.store(NEW, caller=alice)
        # A suggestion, not a decision: production's profile may be offered too (one template, two subjects).
        assert {"document_id": old, "content": OLD} in result["possibly_supersedes"]
        assert "Staging deploys need a change ticket" not in [p["content"] for p in result["possibly_supersedes"]]
        assert governing(pg_conn_str, config, old)[0] == "approved"
        # The agent confirms with a second call: the same fact, now with `supersedes`.
        again = memory.store(NEW, caller=alice, supersedes=[old])
        assert again["document_id"] == result["document_id"]
        assert governing(pg_conn_str, config, old)[0] == "superseded"
        assert memory.store("Staging deploys need two approvals", caller=alice)["possibly_supersedes"] == []

    def test_other_subjects_of_one_template_are_not_suggested(self, memory: Memory, alice: Caller) -> None:
        billing = memory.store("The billing service listens on port 8080", caller=alice)["document_id"]
        others = {
            memory.store(f"The {name} service listens on port {port}", caller=alice)["document_id"]
            for name, port in (("search", 9200), ("payments", 7000), ("ledger", 6100))
        }
        suggested = {
            s["document_id"]
            for s in memory.store("The billing service now listens on port 8443", caller=alice)["possibly_supersedes"]
        }
        # They share only the template's words; billing's own fact shares the subject's name.
        assert billing in suggested
        assert not suggested & others

    def test_suggestions_can_be_turned_off(self, config: MemoryConfig, alice: Caller) -> None:
        memory = Memory(config.model_copy(update={"suggest_supersedes": False}), use_default_embedders=False)
        memory.store(OLD, caller=alice)
        assert "possibly_supersedes" not in memory.store(NEW, caller=alice)

    def test_a_chat_generator_judge_decides(self, config: MemoryConfig, alice: Caller, pg_conn_str: str) -> None:
        @component
        class RuleJudge:
            """A Haystack chat generator that answers by rule (a stand-in for an LLM)."""

            def __init__(self) -> None:
                self.prompts: list[str] = []

            @component.output_types(replies=list[ChatMessage])
            def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
                prompt = messages[-1].text or ""
                self.prompts.append(prompt)
                return {"replies": [ChatMessage.from_assistant("Yes." if f"NEW: {NEW}" in prompt else "no")]}

        judge = RuleJudge()
        memory = Memory(config, use_default_embedders=False, judge=judge)
        old = memory.store(OLD, caller=alice)["document_id"]
        result = memory.store(NEW, caller=alice)
        assert result["superseded"] == [old]
        assert result["possibly_supersedes"] == []
        assert governing(pg_conn_str, config, old)[0] == "superseded"
        assert judge.prompts
        assert OLD in judge.prompts[0]
        secret = "Staging now uses the VPN profile stg-eu8 on 10.20.30.40"
        memory.store(secret, caller=alice)
        assert any("stg-eu8" in prompt for prompt in judge.prompts)  # the judge was asked about it ...
        assert not any("10.20.30.40" in prompt for prompt in judge.prompts)  # ... and saw the redacted fact
        refused = memory.store("Staging now uses the VPN profile stg-eu7", caller=alice)
        assert "superseded" not in refused
        assert refused["possibly_supersedes"] == []

    def test_a_failing_judge_leaves_the_store_done_and_suggests(self, config: MemoryConfig, alice: Caller) -> None:
        @component
        class BrokenJudge:
            @component.output_types(replies=list[ChatMessage])
            def run(self, messages: list[ChatMessage]) -> dict[str, Any]:
                raise TimeoutError("the model did not answer")

        memory = Memory(config, use_default_embedders=False, judge=BrokenJudge())
        old = memory.store(OLD, caller=alice)["document_id"]
        result = memory.store(NEW, caller=alice)
        assert result["stored"] is True
        assert "superseded" not in result
        assert {"document_id": old, "content": OLD} in result["possibly_supersedes"]
        assert memory.read(old, caller=alice)["status"] == "approved"


class TestConflicts:
    def test_newer_validity_first_and_the_pair_flagged(self, memory: Memory, alice: Caller) -> None:
        # The older fact matches the question better by wording; both hold, neither supersedes.
        older = memory.store("Staging VPN: staging uses the VPN profile stg-eu", caller=alice, valid_from=at(0))
        newer = memory.store("The staging VPN profile is stg-eu2 from now on", caller=alice, valid_from=at(20))
        memory.store("The staging database runs PostgreSQL 16", caller=alice, valid_from=at(25))
        query = "staging VPN profile"
        memory.warm_up()
        assert memory.kb is not None
        plain = ScopedMemoryRetriever(store=memory.kb, resolve_conflicts=False, context_window=0)
        unresolved = plain.run(query=query, org_id=alice.org_id, assignment_id=alice.assignment_id)["documents"]
        assert unresolved[0].id == older["document_id"]
        resolving = ScopedMemoryRetriever(store=memory.kb, context_window=0)
        resolved = resolving.run(query=query, org_id=alice.org_id, assignment_id=alice.assignment_id)["documents"]
        assert [d.id for d in resolved[:2]] == [newer["document_id"], older["document_id"]]
        facts = memory.recall(query, caller=alice)["facts"]
        assert [f["document_id"] for f in facts[:2]] == [newer["document_id"], older["document_id"]]
        assert facts[0]["conflicts_with"] == [older["document_id"]]
        assert facts[1]["conflicts_with"] == [newer["document_id"]]
        assert "conflicts_with" not in facts[2]

    def test_other_subjects_of_one_template_are_not_reordered(self, memory: Memory, alice: Caller) -> None:
        billing = memory.store("The billing service listens on port 8080", caller=alice, valid_from=at(0))
        memory.store("The search service listens on port 9200", caller=alice, valid_from=at(5))
        facts = memory.recall("Which port does the billing service listen on?", caller=alice)["facts"]
        assert facts[0]["document_id"] == billing["document_id"]
        assert "conflicts_with" not in facts[0]


class TestChains:
    def chain(self, memory: Memory, caller: Caller) -> list[str]:
        ids = [memory.store(OLD, caller=caller, valid_from=at(0))["document_id"]]
        for n, text in enumerate(["Staging uses VPN profile stg-eu2", "Staging uses VPN profile stg-eu3"], start=1):
            ids.append(memory.store(text, caller=caller, valid_from=at(10 * n), supersedes=[ids[-1]])["document_id"])
        return ids

    def test_read_and_history_show_the_chain(self, memory: Memory, alice: Caller, config: MemoryConfig) -> None:
        a, b, c = self.chain(memory, alice)
        read = memory.read(b, caller=alice)
        assert (read["supersedes"], read["superseded_by"]) == ([a], c)
        assert [v["document_id"] for v in read["chain"]] == [a, b, c]
        assert [v["status"] for v in read["chain"]] == ["superseded", "superseded", "approved"]
        assert [v["document_id"] for v in memory.history(c, caller=alice)] == [a, b, c]
        with pytest.raises(NotFoundError):
            memory.history(a, caller=Caller(org_id="acme", assignment_id="asg-beta"))
        env = {"PG_CONN_STR": config.pg_conn_str or "", "OSA_MEMORY_KB_SCHEMA": config.kb_schema}
        env |= {"OSA_MEMORY_SCHEMA": config.memory_schema, "OSA_MEMORY_EMBEDDER": "none"}
        out = CliRunner().invoke(app, ["history", a, "--json"], env=env)
        assert out.exit_code == 0, out.output
        printed = json.loads(out.output)
        assert [v["document_id"] for v in printed["versions"]] == [a, b, c]
        assert printed["assignment_id"] == alice.assignment_id
        table = CliRunner().invoke(app, ["history", b], env=env)
        assert table.exit_code == 0
        assert "3 version(s)" in table.output
        missing = CliRunner().invoke(app, ["history", "0" * 64], env=env)
        assert missing.exit_code == 1
        assert "no fact" in missing.output

    def test_forgetting_the_middle_relinks(self, memory: Memory, alice: Caller) -> None:
        a, b, c = self.chain(memory, alice)
        memory.forget(b, "wrong value", caller=alice)
        read = memory.read(a, caller=alice)
        assert read["superseded_by"] == c
        assert datetime.fromisoformat(read["valid_to"]) == JAN + timedelta(days=20)
        assert memory.read(c, caller=alice)["supersedes"] == [a]
        assert [v["document_id"] for v in memory.history(c, caller=alice)] == [a, c]
        assert contents(memory.recall(QUESTION, caller=alice, as_of=at(15))) == [OLD]

    def test_forgetting_the_current_fact_restores_its_predecessor(self, memory: Memory, alice: Caller) -> None:
        a, b, c = self.chain(memory, alice)
        memory.forget(c, "never true", caller=alice)
        read = memory.read(b, caller=alice)
        assert read["status"] == "approved"
        assert "superseded_by" not in read
        assert "valid_to" not in read
        assert contents(memory.recall(QUESTION, caller=alice)) == ["Staging uses VPN profile stg-eu2"]
        assert [v["document_id"] for v in memory.history(a, caller=alice)] == [a, b]

    def test_export_and_import_keep_the_chain(self, memory: Memory, alice: Caller, bob: Caller, tmp_path: Any) -> None:
        self.chain(memory, alice)
        path = tmp_path / "facts.jsonl"
        path.write_text("".join(export_line(f) + "\n" for f in memory.export(caller=alice)), encoding="utf-8")
        items = [i for i in read_items(path) if isinstance(i, ImportItem)]
        assert [i.status for i in items] == ["superseded", "superseded", "approved"]
        report = memory.import_items(items, caller=bob)
        assert report.stored == 3
        current = memory.recall(QUESTION, caller=bob)["facts"]
        assert [f["content"] for f in current] == ["Staging uses VPN profile stg-eu3"]
        history = memory.history(current[0]["document_id"], caller=bob)
        versions = [OLD, "Staging uses VPN profile stg-eu2", "Staging uses VPN profile stg-eu3"]
        assert [v["content"] for v in history] == versions
        assert [v["valid_from"][:10] for v in history] == ["2026-01-01", "2026-01-11", "2026-01-21"]
        assert contents(memory.recall(QUESTION, caller=bob, as_of=at(12))) == ["Staging uses VPN profile stg-eu2"]
        assert memory.import_items(items, caller=bob).stored == 0
