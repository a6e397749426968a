"""The governed lifecycle over MCP with the official client, and the humans' CLI around it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import row_counts
from tests.e2e.conftest import OSA_MEMORY, Server, call

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def test_read_feedback_forget_over_mcp(server: Server) -> None:
    token = server.token("asg-life")["token"]
    _, stored = call(
        server.url,
        token,
        "kb_memory_store",
        {"fact": "Grafana lives at grafana.internal", "topic": "obs", "kind": "reference"},
    )
    doc = stored["document_id"]
    is_error, got = call(server.url, token, "kb_memory_read", {"document_id": doc})
    assert not is_error
    assert (got["content"], got["kind"], got["status"], got["trust"]) == (
        "Grafana lives at grafana.internal",
        "reference",
        "approved",
        0.5,
    )
    for _ in range(10):
        _, voted = call(server.url, token, "kb_memory_feedback", {"document_id": doc, "verdict": "confirm"})
    assert (voted["confirms"], voted["trust"]) == (1, round(2 / 3, 6))
    _, listed = call(server.url, token, "kb_memory_list", {})
    assert [f["document_id"] for f in listed["facts"]] == [doc]
    _, forgotten = call(server.url, token, "kb_memory_forget", {"document_id": doc, "reason": "moved"})
    assert forgotten == {"forgotten": True, "document_id": doc}
    _, recalled = call(server.url, token, "kb_memory_recall", {"query": "grafana"})
    assert recalled["facts"] == []
    is_error, text = call(server.url, token, "kb_memory_read", {"document_id": doc})
    assert is_error
    assert "no fact" in text


def test_scope_probes_answer_as_not_found(server: Server) -> None:
    owner = server.token("asg-owner")["token"]
    prober = server.token("asg-prober")["token"]
    _, stored = call(server.url, owner, "kb_memory_store", {"fact": "Owner-only fact"})
    doc = stored["document_id"]
    before = row_counts(server.pg_conn_str, server.config)
    answers = []
    for tool, args in (
        ("kb_memory_read", {"document_id": doc}),
        ("kb_memory_feedback", {"document_id": doc, "verdict": "flag"}),
        ("kb_memory_forget", {"document_id": doc, "reason": "probe"}),
    ):
        is_error, text = call(server.url, prober, tool, args)
        assert is_error
        answers.append(text.replace(doc, "<id>"))
        is_error, missing = call(server.url, prober, tool, {**args, "document_id": "e" * 64})
        assert is_error
        assert missing.replace("e" * 64, "<id>") == answers[-1]
    assert row_counts(server.pg_conn_str, server.config) == before
    _, got = call(server.url, owner, "kb_memory_read", {"document_id": doc})
    assert (got["flags"], got["status"]) == (0, "approved")


def test_propose_review_and_audit(server: Server) -> None:
    token = server.token("asg-review")["token"]
    is_error, text = call(server.url, token, "kb_memory_propose", {"kind": "decision", "title": "t", "body": "b"})
    assert is_error
    assert "kind" in text
    _, proposed = call(
        server.url,
        token,
        "kb_memory_propose",
        {
            "kind": "procedure",
            "title": "Restart",
            "body": "Restart the ingest worker after upgrades",
            "paths": ["ops/ingest.md"],
        },
    )
    doc = proposed["document_id"]
    assert proposed["status"] == "proposed"
    _, dup = call(
        server.url,
        token,
        "kb_memory_propose",
        {"kind": "fact", "title": "Again", "body": "Restart the ingest worker after upgrades"},
    )
    assert "duplicate" in dup["rejected"]
    _, recalled = call(server.url, token, "kb_memory_recall", {"query": "restart ingest worker"})
    assert recalled["facts"] == []
    listed = server.cli("review", "list", "--assignment", "asg-review", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["document_id"] for r in json.loads(listed.stdout)] == [doc]
    accepted = server.cli("review", "accept", doc, "--note", "looks right")
    assert accepted.returncode == 0, accepted.stderr
    _, recalled = call(server.url, token, "kb_memory_recall", {"query": "restart ingest worker"})
    assert [f["document_id"] for f in recalled["facts"]] == [doc]
    audit = server.cli("audit", "--assignment", "asg-review", "--json")
    assert audit.returncode == 0, audit.stderr
    assert [r["action"] for r in json.loads(audit.stdout)] == ["propose", "review"]
    bad = server.cli("review", "accept", doc)
    assert bad.returncode == 1
    assert "no proposed or flagged fact" in bad.stderr


def test_kill_switch_refuses_with_the_exact_text_and_writes_nothing(server: Server) -> None:
    token = server.token("asg-switch")["token"]
    _, stored = call(server.url, token, "kb_memory_store", {"fact": "Survives the switch"})
    doc = stored["document_id"]
    off = server.cli("assignment", "disable", "asg-switch", "--org", "acme", "--reason", "incident 42")
    assert off.returncode == 0, off.stderr
    before = row_counts(server.pg_conn_str, server.config)
    for tool, args in (
        ("kb_memory_store", {"fact": "new"}),
        ("kb_memory_recall", {"query": "switch"}),
        ("kb_memory_read", {"document_id": doc}),
        ("kb_memory_feedback", {"document_id": doc, "verdict": "confirm"}),
        ("kb_memory_propose", {"kind": "fact", "title": "t", "body": "b"}),
        ("kb_memory_forget", {"document_id": doc, "reason": "r"}),
        ("kb_memory_list", {}),
    ):
        is_error, text = call(server.url, token, tool, args)
        assert is_error, tool
        assert text == "Memory is off for this assignment", tool
    assert row_counts(server.pg_conn_str, server.config) == before
    on = server.cli("assignment", "enable", "asg-switch", "--org", "acme")
    assert on.returncode == 0, on.stderr
    _, recalled = call(server.url, token, "kb_memory_recall", {"query": "survives switch"})
    assert [f["document_id"] for f in recalled["facts"]] == [doc]


def test_reflect_over_mcp_and_cli(server: Server) -> None:
    token = server.token("asg-reflect")["token"]
    for text in ("Merge window opens on Monday", "merge window opens on monday!", "The pager rota is weekly"):
        call(server.url, token, "kb_memory_store", {"fact": text})
    is_error, report = call(server.url, token, "kb_memory_reflect", {})
    assert not is_error
    assert (report["groups"], report["facts_consolidated"]) == (1, 2)
    again = server.cli("reflect", "--assignment", "asg-reflect", "--org", "acme", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)[0]["changed"] is False
    everything = server.cli("reflect", "--all", "--json")
    assert everything.returncode == 0, everything.stderr
    assert all(not r["changed"] for r in json.loads(everything.stdout) if r["assignment_id"] == "asg-reflect")
    usage = server.cli("reflect")
    assert usage.returncode == 1
    assert "exactly one of" in usage.stderr


def test_cli_import_export_store_recall_status(server: Server, tmp_path: Path) -> None:
    source = tmp_path / "facts.jsonl"
    source.write_text(
        '{"fact": "Imported fact about ferries", "topic": "travel"}\n'
        '{"fact": "Imported fact with a secret: password=Xy9!secretvalue"}\n'
        '{"nope": 1}\n',
        encoding="utf-8",
    )
    first = server.cli("import", str(source), "--org", "acme", "--assignment", "asg-import", "--json")
    assert first.returncode == 1  # one invalid row: reported, the others imported
    report = json.loads(first.stdout)
    assert (report["stored"], report["invalid"], report["redactions"]) == (2, 1, 1)
    again = server.cli("import", str(source), "--org", "acme", "--assignment", "asg-import", "--json")
    assert json.loads(again.stdout)["skipped_existing"] == 2
    exported = server.cli("export", "--org", "acme", "--assignment", "asg-import")
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert sorted(line["fact"] for line in lines) == [
        "Imported fact about ferries",
        "Imported fact with a secret: password=[REDACTED-PASSWORD]",
    ]
    stored = server.cli("store", "A fact from the CLI", "--org", "acme", "--assignment", "asg-import", "--json")
    assert json.loads(stored.stdout)["stored"] is True
    recalled = server.cli("recall", "ferries", "--org", "acme", "--assignment", "asg-import", "--json")
    assert json.loads(recalled.stdout)["facts"][0]["content"] == "Imported fact about ferries"
    status = server.cli("status", "--json")
    assert json.loads(status.stdout)["facts"] >= 3
    bad = server.cli("import", str(tmp_path / "missing.jsonl"), "--org", "acme", "--assignment", "a")
    assert bad.returncode == 1
    assert "does not exist" in bad.stderr


def test_remaining_cli_commands(server: Server) -> None:
    """Every CLI command the docs show is exercised somewhere; these are the ones not covered above."""
    token = server.token("asg-cli")["token"]
    listed = server.cli("token", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert any(t["assignments"] == ["asg-cli"] for t in json.loads(listed.stdout))
    init = server.cli("init", "--json")
    assert init.returncode == 0, init.stderr
    assert json.loads(init.stdout)["version_after"] >= 5
    _, proposed = call(server.url, token, "kb_memory_propose", {"kind": "pitfall", "title": "t", "body": "Do not X"})
    rejected = server.cli("review", "reject", proposed["document_id"], "--note", "wrong")
    assert rejected.returncode == 0, rejected.stderr
    assert "proposed -> rejected" in rejected.stdout
    off = server.cli("org", "disable", "acme-other", "--reason", "test")
    assert off.returncode == 0, off.stderr
    assert "memory off for org acme-other" in off.stdout
    assert server.cli("org", "enable", "acme-other").returncode == 0
    config = server.cli("mcp-config", "--client", "cursor", "--url", server.url)
    assert config.returncode == 0, config.stderr
    assert json.loads(config.stdout)["mcpServers"]["osa-memory"]["url"] == server.url
    env = {k: v for k, v in server.env().items() if k != "OSA_MEMORY_TOKEN"}
    bridge = subprocess.run(
        [*OSA_MEMORY, "mcp-stdio", "--url", server.url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert bridge.returncode == 2
    assert "OSA_MEMORY_TOKEN" in bridge.stderr


def test_supersession_and_validity_over_mcp(server: Server) -> None:
    """A changed fact over MCP: the suggestion, the confirmation with `supersedes`, recall now, as of a
    date and with history, the chain in `kb_memory_read`, and a foreign id refused with nothing written."""
    token = server.token("asg-changes")["token"]
    other = server.token("asg-elsewhere")["token"]
    old_fact, new_fact = "Staging uses the VPN profile stg-eu", "Staging now uses the VPN profile stg-eu2"
    _, old = call(server.url, token, "kb_memory_store", {"fact": old_fact, "valid_from": "2026-01-05"})
    _, new = call(server.url, token, "kb_memory_store", {"fact": new_fact, "valid_from": "2026-03-01"})
    assert new["possibly_supersedes"] == [{"document_id": old["document_id"], "content": old_fact}]
    _, foreign = call(server.url, other, "kb_memory_store", {"fact": "Another assignment's VPN profile"})
    before = row_counts(server.pg_conn_str, server.config)
    is_error, text = call(
        server.url, token, "kb_memory_store", {"fact": new_fact, "supersedes": [foreign["document_id"]]}
    )
    assert is_error
    assert f"no fact {foreign['document_id']} in this assignment" in text
    assert row_counts(server.pg_conn_str, server.config) == before
    _, confirmed = call(server.url, token, "kb_memory_store", {"fact": new_fact, "supersedes": [old["document_id"]]})
    assert confirmed["superseded"] == [old["document_id"]]
    question = {"query": "Which VPN profile does staging use?", "limit": 3}
    _, now = call(server.url, token, "kb_memory_recall", question)
    assert [f["content"] for f in now["facts"]] == [new_fact]
    _, then = call(server.url, token, "kb_memory_recall", {**question, "as_of": "2026-02-01"})
    assert [f["content"] for f in then["facts"]] == [old_fact]
    assert then["facts"][0]["valid_to"].startswith("2026-03-01")
    _, history = call(server.url, token, "kb_memory_recall", {**question, "include_superseded": True})
    by_id = {f["document_id"]: f for f in history["facts"]}
    assert by_id[old["document_id"]]["superseded_by"] == new["document_id"]
    _, read = call(server.url, token, "kb_memory_read", {"document_id": new["document_id"]})
    assert [v["document_id"] for v in read["chain"]] == [old["document_id"], new["document_id"]]
    assert read["supersedes"] == [old["document_id"]]
    is_error, text = call(server.url, token, "kb_memory_recall", {**question, "as_of": "last week"})
    assert is_error
    assert "as_of must be an ISO 8601" in text
