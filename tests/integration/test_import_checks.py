"""`osa-memory import` checks every line as the tools check their arguments, redacts every free-text field,
reports bad lines by number and imports the rest, orders supersessions within the file, and warns about
facts that recall would never return."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.cli.main import app
from haystack_osa_memory.transfer import STORED_FACT_MAX, ImportItem, export_line, read_items

pytestmark = pytest.mark.integration

SECRET = "password=Hunter2xyz! AKIAIOSFODNN7EXAMPLE"
LEAKS = ("Hunter2xyz", "AKIAIOSFODNN7EXAMPLE")
A_ID = "a" * 64
B_ID = "b" * 64
C_ID = "c" * 64


def _jsonl(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def _import(memory: Memory, path: Path, caller: Caller, **kwargs: Any) -> tuple[Any, list[tuple[str, str]]]:
    parsed = list(read_items(path))
    items = [i for i in parsed if isinstance(i, ImportItem)]
    bad = [i for i in parsed if not isinstance(i, ImportItem)]
    return memory.import_items(items, caller=caller, **kwargs), bad


def _all_text(pg_conn_str: str, config: MemoryConfig) -> str:
    names = config.sql_names()
    with psycopg.connect(pg_conn_str) as conn:
        chunks = conn.execute(sql.SQL("SELECT content, meta::text FROM {schema}.{chunk}").format(**names)).fetchall()
        rows = conn.execute(sql.SQL("SELECT title, metadata::text FROM {schema}.{gov}").format(**names)).fetchall()
        audit = conn.execute(sql.SQL("SELECT details::text FROM {mem}.audit").format(**names)).fetchall()
    return repr(chunks) + repr(rows) + repr(audit)


def _cli_env(config: MemoryConfig) -> dict[str, str]:
    return {
        "PG_CONN_STR": config.pg_conn_str or "",
        "OSA_MEMORY_KB_SCHEMA": config.kb_schema,
        "OSA_MEMORY_SCHEMA": config.memory_schema,
        "OSA_MEMORY_EMBEDDER": "none",
    }


def test_every_field_is_typed_and_bad_lines_are_reported_by_number(
    memory: Memory, alice: Caller, tmp_path: Path, pg_conn_str: str, config: MemoryConfig
) -> None:
    path = _jsonl(
        tmp_path / "facts.jsonl",
        [
            {"fact": "Good fact one about the billing queue"},
            {"fact": "Expiry holding a secret", "expires_at": "password=Hunter2xyz!"},  # 2: quoted in the reason
            {"fact": "Expiry far too long", "expires_at": "2026-01-01" + "9" * 200_000},  # 3
            {"fact": "Offset past the year 9999", "valid_from": "9999-12-31T23:59:59-23:59"},  # 4
            {"fact": "Kind is not text", "kind": 5},  # 5
            {"fact": "Status an import cannot give", "status": "retired"},  # 6
            {"fact": "Supersedes is not a list of ids", "supersedes": "abc"},  # 7
            {"fact": "A field the tools do not have", "title": "x"},  # 8
            {"fact": 12345},  # 9
            {"fact": "Created at is a timestamp", "created_at": "AKIAIOSFODNN7EXAMPLE"},  # 10
            "[[[[" * 50_000,  # 11: malformed JSON nested past any parser's depth
            {"fact": "Good fact two about the billing queue", "expires_at": "2030-01-01T00:00:00+00:00"},  # 12
        ],
    )
    report, bad = _import(memory, path, alice)
    assert [origin for origin, _ in bad] == [f"facts.jsonl:{n}" for n in range(2, 12)]
    reasons = dict(bad)
    assert "expires_at" in reasons["facts.jsonl:2"]
    assert "1 to 40 characters" in reasons["facts.jsonl:3"]
    assert "valid_from" in reasons["facts.jsonl:4"]
    assert "kind" in reasons["facts.jsonl:5"]
    assert "status" in reasons["facts.jsonl:6"]
    assert "supersedes" in reasons["facts.jsonl:7"]
    assert "unknown field" in reasons["facts.jsonl:8"]
    assert "fact must be a string" in reasons["facts.jsonl:9"]
    assert "created_at" in reasons["facts.jsonl:10"]
    # Reasons quote what they refuse: redacted, like everything else the import prints.
    for leaked in LEAKS:
        assert leaked not in repr(bad)
    assert (report.read, report.stored) == (2, 2)
    stored = _all_text(pg_conn_str, config)
    for leaked in LEAKS:
        assert leaked not in stored
    listed = {f["content"]: f for f in memory.list_facts(caller=alice)["facts"]}
    assert set(listed) == {"Good fact one about the billing queue", "Good fact two about the billing queue"}
    two = memory.read(listed["Good fact two about the billing queue"]["document_id"], caller=alice)
    assert two["expires_at"] == "2030-01-01T00:00:00+00:00"


def test_the_cli_reports_bad_lines_imports_the_rest_and_says_it_restores_statuses(
    config: MemoryConfig, memory: Memory, alice: Caller, tmp_path: Path
) -> None:
    path = _jsonl(
        tmp_path / "backup.jsonl",
        [
            {"fact": "Restored proposal about the cache", "status": "proposed"},
            {"fact": "Bad expiry", "expires_at": "password=Hunter2xyz!"},
            {"fact": "Approved fact about the cache"},
        ],
    )
    env = _cli_env(config)
    args = ["import", str(path), "--org", alice.org_id, "--assignment", alice.assignment_id]
    out = CliRunner().invoke(app, [*args, "--json"], env=env)
    assert out.exit_code == 1, out.output  # a bad line: non-zero, after importing the others
    printed = json.loads(out.stdout)
    assert (printed["read"], printed["stored"], printed["invalid"]) == (3, 2, 1)
    assert printed["invalid_examples"][0].startswith("backup.jsonl:2: expires_at")
    for leaked in LEAKS:
        assert leaked not in out.output
    statuses = {f["content"]: f["status"] for f in memory.list_facts(caller=alice)["facts"]}
    assert statuses == {"Restored proposal about the cache": "proposed", "Approved fact about the cache": "approved"}
    again = CliRunner().invoke(app, args, env=env)
    assert again.exit_code == 1
    assert "stored 0, already there 2, invalid 1" in again.stdout
    helped = CliRunner().invoke(app, ["import", "--help"], env={**env, "COLUMNS": "200"})
    assert "operator's action" in helped.stdout
    assert "restored" in helped.stdout


def test_placeholder_look_alikes_cannot_inflate_a_fact(
    memory: Memory, alice: Caller, bob: Caller, tmp_path: Path
) -> None:
    # A fact the redactor lengthened round-trips: each placeholder counts as the character it replaced.
    dense = ",".join(f"10.0.{n // 250}.{n % 250 + 1}" for n in range(180))[:1990]
    stored = memory.store(dense, caller=alice)
    assert stored["redactions"] > 100
    backup = tmp_path / "backup.jsonl"
    backup.write_text("".join(export_line(f) + "\n" for f in memory.export(caller=alice)), encoding="utf-8")
    exported = json.loads(backup.read_text(encoding="utf-8"))
    assert len(exported["fact"]) > 2000  # longer than a fact may be sent: only placeholders made it so
    report, bad = _import(memory, backup, bob)
    assert (report.stored, bad) == (1, [])
    assert [f["fact"] for f in memory.export(caller=bob)] == [exported["fact"]]

    inflated = _jsonl(
        tmp_path / "inflated.jsonl",
        [
            {"fact": "[REDACTED-PASSWORD]" * 5475},  # 104,025 characters counted as 5,475
            {"fact": "x" + "[REDACTED-SECRET]" * 1999},  # counted as 2,000: at the limit, but 33,984 stored
            {"fact": "Short and fine [REDACTED-SECRET]"},
            {"fact": "Topic inflated", "topic": "[REDACTED-JWT]" * 119},
        ],
    )
    report, bad = _import(memory, inflated, bob)
    reasons = dict(bad)
    assert list(reasons) == ["inflated.jsonl:1", "inflated.jsonl:2", "inflated.jsonl:4"]
    assert "fact must be 1 to 2000 characters" in reasons["inflated.jsonl:1"]
    assert f"at most {STORED_FACT_MAX} characters as stored" in reasons["inflated.jsonl:2"]
    assert "topic must be at most" in reasons["inflated.jsonl:4"]
    assert report.stored == 1


def test_a_fact_superseding_another_line_of_the_file_is_written_after_it(
    memory: Memory, alice: Caller, tmp_path: Path
) -> None:
    # The successor comes first in the file and neither line has a valid_from: both in one batch.
    path = _jsonl(
        tmp_path / "chain.jsonl",
        [
            {"fact": "The swift cluster runs in sa-east-1", "document_id": C_ID, "supersedes": [B_ID]},
            {"fact": "The swift cluster runs in eu-west-1", "document_id": A_ID},
            {"fact": "The swift cluster runs in us-east-2", "document_id": B_ID, "supersedes": [A_ID]},
        ],
    )
    report, bad = _import(memory, path, alice)
    assert (report.stored, report.invalid, bad) == (3, [], [])
    current = memory.recall("swift cluster", caller=alice)["facts"]
    assert [f["content"] for f in current] == ["The swift cluster runs in sa-east-1"]
    chain = memory.read(current[0]["document_id"], caller=alice)["chain"]
    assert [(v["content"], v["status"]) for v in chain] == [
        ("The swift cluster runs in eu-west-1", "superseded"),
        ("The swift cluster runs in us-east-2", "superseded"),
        ("The swift cluster runs in sa-east-1", "approved"),
    ]
    # Re-running stores nothing new and refuses nothing.
    again, bad = _import(memory, path, alice)
    assert (again.stored, again.skipped_existing, again.invalid, bad) == (0, 3, [], [])


def test_supersession_loops_and_refused_writes_are_reported_and_the_rest_imported(
    memory: Memory, alice: Caller, tmp_path: Path
) -> None:
    path = _jsonl(
        tmp_path / "loops.jsonl",
        [
            {"fact": "Loop member one", "document_id": A_ID, "supersedes": [B_ID]},
            {"fact": "Loop member two", "document_id": B_ID, "supersedes": [A_ID]},
            {"fact": "The deploy window is Tuesday", "document_id": C_ID},
            # A proposal cannot supersede (only a person's review approves it): refused, the rest stored.
            {"fact": "The deploy window is Thursday", "status": "proposed", "supersedes": [C_ID]},
            {"fact": "Unrelated fact about the pager rota"},
        ],
    )
    report, bad = _import(memory, path, alice, batch_size=64)
    assert bad == []
    invalid = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in report.invalid}
    assert set(invalid) == {"loops.jsonl:1", "loops.jsonl:2", "loops.jsonl:4"}
    assert "loop" in invalid["loops.jsonl:1"]
    assert "supersede" in invalid["loops.jsonl:4"]
    assert report.stored == 2
    assert {f["content"] for f in memory.list_facts(caller=alice)["facts"]} == {
        "The deploy window is Tuesday",
        "Unrelated fact about the pager rota",
    }


def test_facts_that_would_never_be_recalled_are_imported_with_a_warning(
    memory: Memory, alice: Caller, tmp_path: Path
) -> None:
    past = (datetime.now(UTC) - timedelta(days=30)).isoformat()
    path = _jsonl(
        tmp_path / "validity.jsonl",
        [
            {"fact": "The old gateway was gw-1", "valid_to": past},  # would hold from now until the past
            {"fact": "The older gateway was gw-0", "valid_from": "2025-01-01", "valid_to": past},  # history
            {"fact": "The gateway is gw-2"},
        ],
    )
    report, bad = _import(memory, path, alice)
    assert (report.stored, bad) == (3, [])
    assert len(report.never_recalled) == 1
    assert report.never_recalled[0].startswith("validity.jsonl:1: valid_to")
    assert report.as_dict()["never_recalled"] == 1


def test_free_text_is_redacted_in_every_field(
    memory: Memory, alice: Caller, tmp_path: Path, pg_conn_str: str, config: MemoryConfig
) -> None:
    path = _jsonl(
        tmp_path / "secrets.jsonl",
        [{"fact": f"Staging login {SECRET} from 10.20.30.40", "topic": f"db {SECRET}", "kind": "procedure"}],
    )
    report, bad = _import(memory, path, alice)
    assert (report.stored, bad) == (1, [])
    assert report.redactions >= 3
    stored = _all_text(pg_conn_str, config)
    for leaked in (*LEAKS, "10.20.30.40"):
        assert leaked not in stored


def test_items_made_in_python_are_checked_like_lines(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    items = [
        ImportItem(fact="Fine fact about the backup window", origin="api:1"),
        ImportItem(fact="Expiry with a secret", origin="api:2", expires_at="password=Hunter2xyz!"),
        ImportItem(fact="[REDACTED-SECRET]" * 3000, origin="api:3"),
        ImportItem(fact="Bad kind", origin="api:4", kind="decision"),
    ]
    report = memory.import_items(items, caller=alice)
    assert (report.read, report.stored) == (4, 1)
    assert [line.split(": ", 1)[0] for line in report.invalid] == ["api:2", "api:3", "api:4"]
    assert "Hunter2xyz" not in repr(report.invalid) + _all_text(pg_conn_str, config)
