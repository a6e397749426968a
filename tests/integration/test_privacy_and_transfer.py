"""The privacy guard in the store and propose pipelines; import and export."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.transfer import ImportItem, export_line, read_items

pytestmark = pytest.mark.integration

SECRET_FACT = "Staging DB is 10.20.30.40, login with password=Sup3rS3cret! from /home/alice/.pgpass"


def _all_text(pg_conn_str: str, config: MemoryConfig) -> str:
    with psycopg.connect(pg_conn_str) as conn:
        chunks = conn.execute(
            sql.SQL("SELECT content, meta::text FROM {}.{}").format(
                sql.Identifier(config.kb_schema), sql.Identifier(config.chunk_table)
            )
        ).fetchall()
        rows = conn.execute(
            sql.SQL("SELECT title, metadata::text FROM {}.{}").format(
                sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table)
            )
        ).fetchall()
    return repr(chunks) + repr(rows)


def test_store_redacts_before_anything_is_stored(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    result = memory.store(SECRET_FACT, topic="db at 10.9.8.7", caller=alice)
    assert result["redactions"] == 4
    stored = _all_text(pg_conn_str, config)
    for leaked in ("10.20.30.40", "Sup3rS3cret!", "/home/alice", "10.9.8.7"):
        assert leaked not in stored
    (fact,) = memory.recall("staging DB login", caller=alice)["facts"]
    assert fact["content"] == (
        "Staging DB is [REDACTED-PRIVATE-IP], login with password=[REDACTED-PASSWORD] from [REDACTED-USER-PATH]/.pgpass"
    )
    assert fact["topic"] == "db at [REDACTED-PRIVATE-IP]"


def test_public_addresses_and_versions_stay(memory: Memory, alice: Caller) -> None:
    result = memory.store("Upgrade to 10.2.3 and call 8.8.8.8 from /usr/local/bin", caller=alice)
    assert result["redactions"] == 0
    (fact,) = memory.recall("upgrade call", caller=alice)["facts"]
    assert fact["content"] == "Upgrade to 10.2.3 and call 8.8.8.8 from /usr/local/bin"


def test_redaction_classes_can_be_switched_off(config: MemoryConfig, alice: Caller) -> None:
    memory = Memory(config.model_copy(update={"redaction_off": ("private_ip",)}), use_default_embedders=False)
    assert memory.store("Gateway 192.168.1.1 and key=ghp_" + "x" * 36, caller=alice)["redactions"] == 1
    (fact,) = memory.recall("gateway", caller=alice)["facts"]
    assert "192.168.1.1" in fact["content"]
    assert "ghp_" not in fact["content"]


def test_proposals_are_redacted_and_secrets_refused(memory: Memory, alice: Caller) -> None:
    ok = memory.propose("reference", "Jump host", "Use the jump host at 172.16.4.2", caller=alice)
    assert ok["redactions"] == 1
    assert "172.16.4.2" not in memory.read(ok["document_id"], caller=alice)["content"]
    refused = memory.propose("fact", "Token", "the deploy token=glpat-abcdefghij1234567890", caller=alice)
    assert "secret" in refused["rejected"]


def test_import_export_round_trip_is_lossless_and_idempotent(
    memory: Memory, alice: Caller, bob: Caller, tmp_path: Path
) -> None:
    memory.store("First fact about queues", topic="queues", kind="procedure", caller=alice)
    memory.store("Second fact, with a ttl", ttl_days=30, caller=alice)
    memory.propose("pitfall", "Careful", "Never restart both brokers at once", caller=alice)
    exported = [json.loads(export_line(f)) for f in memory.export(caller=alice)]
    assert [f["status"] for f in exported] == ["approved", "approved", "proposed"]
    path = tmp_path / "backup.jsonl"
    path.write_text("".join(export_line(f) + "\n" for f in memory.export(caller=alice)), encoding="utf-8")

    items = [i for i in read_items(path) if isinstance(i, ImportItem)]
    report = memory.import_items(items, caller=bob, batch_size=2)
    assert (report.read, report.stored, report.skipped_existing) == (3, 3, 0)
    again = memory.import_items(items, caller=bob)
    assert (again.stored, again.skipped_existing) == (0, 3)
    restored = [json.loads(export_line(f)) for f in memory.export(caller=bob)]
    keys = ("fact", "topic", "kind", "status", "expires_at")
    assert [{k: f[k] for k in keys} for f in restored] == [{k: f[k] for k in keys} for f in exported]


def test_import_formats_and_invalid_rows(tmp_path: Path) -> None:
    (tmp_path / "facts.csv").write_text("fact,topic\nCSV fact one,t1\n,empty\n", encoding="utf-8")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "runbook.md").write_text("# Runbook\n\nStep one.\n\n" + ("word " * 500) + "\n", encoding="utf-8")
    csv_items = list(read_items(tmp_path / "facts.csv"))
    assert isinstance(csv_items[0], ImportItem)
    assert csv_items[0].topic == "t1"
    assert isinstance(csv_items[1], tuple)
    assert csv_items[1][0] == "facts.csv:3"
    assert "fact" in csv_items[1][1]
    md_items = [i for i in read_items(notes) if isinstance(i, ImportItem)]
    assert len(md_items) == 3  # the heading paragraph, then the long paragraph cut at a word boundary
    assert md_items[0].fact == "# Runbook\n\nStep one."
    assert all(len(i.fact) <= 2000 for i in md_items)
    assert sum(i.fact.split().count("word") for i in md_items) == 500
    assert md_items[0].topic == "runbook"
