"""Side channels of the privacy guard on a real PostgreSQL: every free-text field that reaches the
database (forget reasons, feedback and review notes, kill-switch reasons, proposal titles, paths and
personas) is redacted like a fact; facts that redaction lengthens past the limit are still stored;
facts made only of invisible characters are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.cli.main import app
from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.transfer import ImportItem, export_line, read_items
from haystack_osa_memory.validation import FACT_MAX, TOPIC_MAX
from tests.conftest import row_counts

pytestmark = pytest.mark.integration

GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5" * 4  # 40 characters after the prefix: a GitHub token's shape
PRIVATE_TEXT = f"seen from 10.1.2.3 in /home/carol/keys with {GITHUB_TOKEN}"
REDACTED_TEXT = "seen from [REDACTED-PRIVATE-IP] in [REDACTED-USER-PATH]/keys with [REDACTED-SECRET]"
NO_SECRET_TEXT = "flaky from 192.168.7.7 and /Users/erin/ci/run.sh"
NO_SECRET_REDACTED = "flaky from [REDACTED-PRIVATE-IP] and [REDACTED-USER-PATH]/ci/run.sh"


@pytest.fixture
def repo(pg_conn_str: str, config: MemoryConfig) -> LifecycleRepository:
    return LifecycleRepository(pg_conn_str, config)


def _query(pg_conn_str: str, config: MemoryConfig, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of ``statement``, where ``{gov}`` and ``{mem}`` name the test's governing table and memory schema."""
    query = sql.SQL(statement).format(
        gov=sql.Identifier(config.kb_schema, config.governing_table),
        mem=sql.Identifier(config.memory_schema),
    )
    with psycopg.connect(pg_conn_str) as conn:
        return conn.execute(query, params).fetchall()


def _audit_details(pg_conn_str: str, config: MemoryConfig, action: str) -> list[dict[str, Any]]:
    rows = _query(pg_conn_str, config, "SELECT details FROM {mem}.audit WHERE action = %s ORDER BY id", action)
    return [row[0] for row in rows]


def _everything(pg_conn_str: str, config: MemoryConfig) -> str:
    """Every row of every table of the test's schema, as text."""
    with psycopg.connect(pg_conn_str) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (config.kb_schema,)
        ).fetchall()
        dumps = [
            repr(
                conn.execute(sql.SQL("SELECT t::text FROM {} t").format(sql.Identifier(config.kb_schema, t))).fetchall()
            )
            for (t,) in tables
        ]
    return "\n".join(dumps)


class TestForgetReason:
    def test_reason_is_redacted_in_the_audit_and_the_governing_row(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        doc = memory.store("The old gateway is retired", caller=alice)["document_id"]
        assert memory.forget(doc, PRIVATE_TEXT, caller=alice) == {"forgotten": True, "document_id": doc}
        (row,) = _query(pg_conn_str, config, "SELECT metadata->'retired'->>'reason' FROM {gov} WHERE id = %s", doc)
        assert row == (REDACTED_TEXT,)
        assert _audit_details(pg_conn_str, config, "forget") == [
            {"reason": REDACTED_TEXT, "previous_status": "approved"}
        ]
        everything = _everything(pg_conn_str, config)
        for leaked in ("10.1.2.3", "/home/carol", GITHUB_TOKEN):
            assert leaked not in everything

    def test_reason_honours_redaction_off(self, config: MemoryConfig, alice: Caller, pg_conn_str: str) -> None:
        memory = Memory(config.model_copy(update={"redaction_off": ("private_ip",)}), use_default_embedders=False)
        doc = memory.store("A fact to retract", caller=alice)["document_id"]
        memory.forget(doc, PRIVATE_TEXT, caller=alice)
        expected = "seen from 10.1.2.3 in [REDACTED-USER-PATH]/keys with [REDACTED-SECRET]"
        assert _audit_details(pg_conn_str, config, "forget")[0]["reason"] == expected

    @pytest.mark.parametrize("reason", ["\u200b", "\u2060\ufeff", "\u0301", " \u200b\u00ad "])
    def test_invisible_reason_is_refused(
        self, memory: Memory, alice: Caller, reason: str, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        doc = memory.store("Still here", caller=alice)["document_id"]
        before = row_counts(pg_conn_str, config)
        with pytest.raises(InvalidInputError, match="reason must contain at least one visible character"):
            memory.forget(doc, reason, caller=alice)
        assert row_counts(pg_conn_str, config) == before


class TestNotesAndSwitches:
    def test_feedback_note_is_redacted_and_secrets_still_refused(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        doc = memory.store("CI runs on Tuesdays", caller=alice)["document_id"]
        before = row_counts(pg_conn_str, config)
        with pytest.raises(InvalidInputError, match=r"note must not contain secrets \(found secret\)"):
            memory.feedback(doc, "flag", note=PRIVATE_TEXT, caller=alice)
        assert row_counts(pg_conn_str, config) == before
        memory.feedback(doc, "flag", note=NO_SECRET_TEXT, caller=alice)
        rows = _query(pg_conn_str, config, "SELECT note FROM {mem}.feedback WHERE document_id = %s", doc)
        assert rows == [(NO_SECRET_REDACTED,)]
        assert _audit_details(pg_conn_str, config, "feedback")[0]["note"] == NO_SECRET_REDACTED

    def test_review_note_is_redacted(
        self, memory: Memory, alice: Caller, repo: LifecycleRepository, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        accepted = memory.propose("fact", "Queues", "Queues drain at night", caller=alice)["document_id"]
        rejected = memory.propose("fact", "Caches", "Caches warm at dawn", caller=alice)["document_id"]
        repo.review(accepted, accept=True, actor="cli:test", note=PRIVATE_TEXT)
        repo.review(rejected, accept=False, actor="cli:test", note=NO_SECRET_TEXT)
        notes = [d["note"] for d in _audit_details(pg_conn_str, config, "review")]
        assert notes == [REDACTED_TEXT, NO_SECRET_REDACTED]

    def test_switch_reason_is_redacted_in_the_switch_and_the_audit(
        self, repo: LifecycleRepository, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        repo.set_switch("acme", "asg-alpha", enabled=False, actor="cli:ops", reason=PRIVATE_TEXT)
        assert [s["reason"] for s in repo.switches()] == [REDACTED_TEXT]
        rows = _query(pg_conn_str, config, "SELECT reason FROM {mem}.switches")
        assert rows == [(REDACTED_TEXT,)]
        repo.set_switch("acme", "asg-alpha", enabled=True, actor="cli:ops", reason=NO_SECRET_TEXT)
        details = _audit_details(pg_conn_str, config, "switch")
        assert details == [
            {"enabled": False, "reason": REDACTED_TEXT},
            {"enabled": True, "reason": NO_SECRET_REDACTED},
        ]


def test_cli_review_note_and_kill_switch_reason_are_redacted(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "PG_CONN_STR": pg_conn_str,
        "OSA_MEMORY_KB_SCHEMA": config.kb_schema,
        "OSA_MEMORY_SCHEMA": config.memory_schema,
        "OSA_MEMORY_EMBEDDER": "none",
    }.items():
        monkeypatch.setenv(name, value)
    doc = memory.propose("fact", "Queues", "Queues drain at night", caller=alice)["document_id"]
    runner = CliRunner()
    accepted = runner.invoke(app, ["review", "accept", doc, "--note", PRIVATE_TEXT])
    assert accepted.exit_code == 0, accepted.output
    disabled = runner.invoke(app, ["assignment", "disable", "asg-alpha", "--org", "acme", "--reason", PRIVATE_TEXT])
    assert disabled.exit_code == 0, disabled.output
    assert _audit_details(pg_conn_str, config, "review")[0]["note"] == REDACTED_TEXT
    assert _audit_details(pg_conn_str, config, "switch") == [{"enabled": False, "reason": REDACTED_TEXT}]
    assert _query(pg_conn_str, config, "SELECT reason FROM {mem}.switches") == [(REDACTED_TEXT,)]


class TestProposalFields:
    def test_title_paths_and_personas_are_redacted(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        result = memory.propose(
            "procedure",
            "Jump via 10.0.0.9",
            "Use the jump host for the database",
            paths=["/home/dave/project/run.sh", "ops/run.md"],
            personas=["ops at 192.168.0.4", "sre"],
            caller=alice,
        )
        doc = result["document_id"]
        assert result == {"document_id": doc, "status": "proposed", "redactions": 3}
        (row,) = _query(
            pg_conn_str,
            config,
            "SELECT title, metadata->'paths', metadata->'personas' FROM {gov} WHERE id = %s",
            doc,
        )
        assert row == (
            "Jump via [REDACTED-PRIVATE-IP]",
            ["[REDACTED-USER-PATH]/project/run.sh", "ops/run.md"],
            ["ops at [REDACTED-PRIVATE-IP]", "sre"],
        )
        got = memory.read(doc, caller=alice)
        assert got["content"] == "Jump via [REDACTED-PRIVATE-IP]\n\nUse the jump host for the database"
        everything = _everything(pg_conn_str, config)
        for leaked in ("10.0.0.9", "/home/dave", "192.168.0.4"):
            assert leaked not in everything

    def test_proposal_fields_honour_redaction_off(self, config: MemoryConfig, alice: Caller) -> None:
        memory = Memory(config.model_copy(update={"redaction_off": ("user_path",)}), use_default_embedders=False)
        result = memory.propose(
            "fact", "Host 10.0.0.9", "A body", paths=["/home/dave/x"], personas=["p 10.0.0.8"], caller=alice
        )
        got = memory.read(result["document_id"], caller=alice)
        assert (got["title"], got["paths"], got["personas"]) == (
            "Host [REDACTED-PRIVATE-IP]",
            ["/home/dave/x"],
            ["p [REDACTED-PRIVATE-IP]"],
        )

    @pytest.mark.parametrize(
        "fields",
        [{"paths": [f"ops/{GITHUB_TOKEN}"]}, {"personas": [f"bot {GITHUB_TOKEN}"]}, {"title": f"x-{GITHUB_TOKEN}"}],
    )
    def test_secrets_in_any_field_are_refused(
        self, memory: Memory, alice: Caller, fields: dict[str, Any], pg_conn_str: str, config: MemoryConfig
    ) -> None:
        before = row_counts(pg_conn_str, config)
        args: dict[str, Any] = {"title": "A title", "body": "A body", **fields}
        assert "contains a secret (secret)" in memory.propose("fact", caller=alice, **args)["rejected"]
        assert row_counts(pg_conn_str, config) == before


def test_imported_topics_are_redacted_like_stored_ones(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    item = ImportItem(fact="Imported fact", origin="x.jsonl:1", topic="db at 10.9.8.7")
    report = memory.import_items([item], caller=alice)
    assert (report.stored, report.redactions) == (1, 1)
    rows = _query(pg_conn_str, config, "SELECT title, metadata->>'topic' FROM {gov}")
    assert rows == [("db at [REDACTED-PRIVATE-IP]", "db at [REDACTED-PRIVATE-IP]")]
    assert "10.9.8.7" not in _everything(pg_conn_str, config)


def _long_fact() -> str:
    """Exactly FACT_MAX characters with four private addresses: redaction makes it longer."""
    head = "Hosts 10.0.0.1 10.0.0.2 10.0.0.3 10.0.0.4 then "
    return head + "x" * (FACT_MAX - len(head))


class TestLengthAfterRedaction:
    def test_fact_at_the_limit_is_stored_when_redaction_lengthens_it(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        fact = _long_fact()
        assert len(fact) == FACT_MAX
        result = memory.store(fact, caller=alice)
        assert (result["stored"], result["redactions"]) == (True, 4)
        stored = memory.read(result["document_id"], caller=alice)["content"]
        assert stored == "Hosts " + "[REDACTED-PRIVATE-IP] " * 4 + "then " + fact.split(" then ", 1)[1]
        assert len(stored) == FACT_MAX + 4 * (len("[REDACTED-PRIVATE-IP]") - len("10.0.0.1"))

    def test_proposal_and_import_at_the_limit(self, memory: Memory, alice: Caller, bob: Caller, tmp_path: Path) -> None:
        proposed = memory.propose("fact", "T", _long_fact(), caller=alice)
        assert proposed["status"] == "proposed"
        path = tmp_path / "export.jsonl"
        path.write_text("".join(export_line(f) + "\n" for f in memory.export(caller=alice)), encoding="utf-8")
        items = list(read_items(path))
        assert all(isinstance(i, ImportItem) for i in items), items
        report = memory.import_items([i for i in items if isinstance(i, ImportItem)], caller=bob)
        assert (report.stored, report.invalid) == (1, [])
        exported = [json.loads(export_line(f))["fact"] for f in memory.export(caller=bob)]
        assert exported == [json.loads(path.read_text(encoding="utf-8"))["fact"]]

    def test_topic_at_the_limit_is_stored_when_redaction_lengthens_it(
        self, memory: Memory, alice: Caller, bob: Caller, tmp_path: Path
    ) -> None:
        topic = "db 10.0.0.1 " + "t" * (TOPIC_MAX - len("db 10.0.0.1 "))
        assert len(topic) == TOPIC_MAX
        doc = memory.store("Database notes", topic=topic, caller=alice)["document_id"]
        stored = memory.read(doc, caller=alice)["topic"]
        assert stored == topic.replace("10.0.0.1", "[REDACTED-PRIVATE-IP]")
        assert len(stored) > TOPIC_MAX
        path = tmp_path / "export.jsonl"
        path.write_text("".join(export_line(f) + "\n" for f in memory.export(caller=alice)), encoding="utf-8")
        report = memory.import_items([i for i in read_items(path) if isinstance(i, ImportItem)], caller=bob)
        assert (report.stored, report.invalid) == (1, [])
        assert [f["topic"] for f in memory.export(caller=bob)] == [stored]

    def test_longer_than_the_limit_is_still_refused(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        before = row_counts(pg_conn_str, config)
        with pytest.raises(InvalidInputError, match="fact must be 1 to 2000 characters long, got 2001"):
            memory.store(_long_fact() + "x", caller=alice)
        assert row_counts(pg_conn_str, config) == before


INVISIBLE = ["\u200b", "\u200b\u2060\ufeff", "\u0301", "\u200b \u0301\n\u180e", "\u3164\u115f", "\U000e0041\ufe0f"]


class TestInvisibleText:
    @pytest.mark.parametrize("fact", INVISIBLE)
    def test_invisible_fact_is_refused_and_nothing_written(
        self, memory: Memory, alice: Caller, fact: str, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        before = row_counts(pg_conn_str, config)
        with pytest.raises(InvalidInputError, match="fact must contain at least one visible character"):
            memory.store(fact, caller=alice)
        with pytest.raises(InvalidInputError, match="fact must contain at least one visible character"):
            memory.propose("fact", "A title", fact, caller=alice)
        assert row_counts(pg_conn_str, config) == before

    def test_other_fields_refuse_invisible_text(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        doc = memory.store("Visible fact", caller=alice)["document_id"]
        before = row_counts(pg_conn_str, config)
        calls = {
            "topic": lambda: memory.store("Another fact", topic="\u200b", caller=alice),
            "query": lambda: memory.recall("\u2060", caller=alice),
            "title": lambda: memory.propose("fact", "\ufeff", "A body", caller=alice),
            "paths item": lambda: memory.propose("fact", "T", "A body", paths=["\u200b"], caller=alice),
            "note": lambda: memory.feedback(doc, "confirm", note="\u0301", caller=alice),
        }
        for what, call in calls.items():
            with pytest.raises(InvalidInputError, match=f"{what} must contain at least one visible character"):
                call()
        assert row_counts(pg_conn_str, config) == before

    def test_visible_text_with_invisible_characters_is_kept(self, memory: Memory, alice: Caller) -> None:
        doc = memory.store("cafe\u0301 \u200bmenu", caller=alice)["document_id"]
        assert memory.read(doc, caller=alice)["content"] == "cafe\u0301 \u200bmenu"
