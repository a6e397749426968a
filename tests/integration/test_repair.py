"""`osa-memory repair` (also run by `init`): data an earlier lifecycle let around a person's review, and
successors still holding forgotten words, are put right; a second run changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.lifecycle import LifecycleRepository
from haystack_osa_memory.store.repair import held_status, repair

pytestmark = pytest.mark.integration


def run(caller: Caller, token: str) -> Caller:
    return Caller(org_id=caller.org_id, assignment_id=caller.assignment_id, token_id=token)


class Db:
    """Direct SQL on the test's knowledge base: how an earlier version left the rows."""

    def __init__(self, pg_conn_str: str, config: MemoryConfig) -> None:
        self.conn_str = pg_conn_str
        self.names = {
            "schema": sql.Identifier(config.kb_schema),
            "gov": sql.Identifier(config.governing_table),
            "mem": sql.Identifier(config.memory_schema),
        }

    def execute(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.conn_str) as conn:
            cur = conn.execute(sql.SQL(statement).format(**self.names), params)
            return cur.fetchall() if cur.description else []

    def status(self, doc: str) -> str:
        return str(self.execute("SELECT status FROM {schema}.{gov} WHERE id = %s", (doc,))[0][0])

    def metadata(self, doc: str) -> dict[str, Any]:
        return dict(self.execute("SELECT metadata FROM {schema}.{gov} WHERE id = %s", (doc,))[0][0])

    def terms(self, doc: str) -> bytes:
        return bytes(self.execute("SELECT terms FROM {schema}.osa_fact_terms WHERE document_id = %s", (doc,))[0][0])

    def audit(self, doc: str, action: str, details: dict[str, Any], me: Caller) -> None:
        self.execute(
            "INSERT INTO {mem}.audit (actor, action, org_id, assignment_id, document_id, details) "
            "VALUES ('old-agent', %s, %s, %s, %s, %s)",
            (action, me.org_id, me.assignment_id, doc, json.dumps(details)),
        )


def test_held_status_reads_the_audit_trail() -> None:
    assert held_status([("propose", {"status": "proposed"}), ("store", {"status": "approved"})]) == "proposed"
    assert held_status([("propose", {"status": "proposed"}), ("review", {"to": "approved"})]) is None
    assert held_status([("feedback", {"status": "flagged"}), ("feedback", {"status": "approved"})]) == "flagged"
    assert held_status([("review", {"to": "rejected"}), ("forget", {"previous_status": "rejected"})]) == "proposed"
    assert held_status([("store", {"status": "approved"}), ("forget", {"previous_status": "approved"})]) is None
    assert held_status([("store", {"status": "approved"}), ("feedback", {"status": "approved"})]) is None


def test_repair_puts_damaged_facts_right_once(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    db = Db(pg_conn_str, config)
    lifecycle = LifecycleRepository(pg_conn_str, config)
    # A proposal an agent superseded (it left the review queue into history).
    hidden = memory.propose("fact", "Gate bypass", "Deploys may skip the change board", caller=alice)["document_id"]
    x1 = memory.store("x1 placeholder fact", caller=alice)["document_id"]
    db.execute(
        "UPDATE {schema}.{gov} SET status = 'superseded', metadata = metadata || "
        "jsonb_build_object('superseded_by', %s::text, 'superseded_from', 'proposed', 'valid_to', now()::text) "
        "WHERE id = %s",
        (x1, hidden),
    )
    db.execute(
        "UPDATE {schema}.{gov} SET metadata = metadata || jsonb_build_object('supersedes', jsonb_build_array(%s::text))"
        " WHERE id = %s",
        (hidden, x1),
    )
    db.audit(hidden, "supersede", {"superseded_by": x1, "previous_status": "proposed"}, alice)
    # A proposal approved by storing its text again after superseding it.
    bypassed = memory.propose("fact", "Friday deploys", "Friday deploys need no review", caller=alice)["document_id"]
    db.execute("UPDATE {schema}.{gov} SET status = 'approved' WHERE id = %s", (bypassed,))
    db.audit(bypassed, "supersede", {"superseded_by": x1, "previous_status": "proposed"}, alice)
    db.audit(bypassed, "store", {"status": "approved", "kind": "fact"}, alice)
    # A flag lifted by confirmations alone.
    unflagged = memory.store("Caches never need warming", caller=alice)["document_id"]
    for token in ("f1", "f2"):
        memory.feedback(unflagged, "flag", caller=run(alice, token))
    db.execute("UPDATE {schema}.{gov} SET status = 'approved' WHERE id = %s", (unflagged,))
    db.audit(unflagged, "feedback", {"verdict": "confirm", "status": "approved"}, alice)
    # A proposal a person accepted: it stays approved.
    accepted = memory.propose("fact", "Rotate keys", "Rotate signing keys quarterly", caller=alice)["document_id"]
    lifecycle.review(accepted, accept=True, actor="cli:reviewer", note=None)
    # A successor whose recall row still holds a forgotten predecessor's words, and a retired row that
    # kept its title and topic.
    secret = memory.store("Project quokkasecret is live", topic="quokkasecret", caller=alice)["document_id"]
    successor = memory.store("The project launch is paused", supersedes=[secret], caller=alice)["document_id"]
    inherited = db.terms(successor)
    memory.forget(secret, "leaked", caller=alice)
    own = db.terms(successor)
    assert own != inherited
    db.execute("UPDATE {schema}.osa_fact_terms SET terms = %s WHERE document_id = %s", (inherited, successor))
    db.execute(
        "UPDATE {schema}.{gov} SET title = 'quokkasecret', metadata = metadata || '{{\"topic\": \"quokkasecret\"}}'"
        " WHERE id = %s",
        (secret,),
    )
    assert memory.recall("quokkasecret", caller=alice)["facts"][0]["document_id"] == successor

    before = db.execute("SELECT id, status, metadata FROM {schema}.{gov} ORDER BY id")
    dry = repair(pg_conn_str, config, actor="cli:test", dry_run=True)
    assert db.execute("SELECT id, status, metadata FROM {schema}.{gov} ORDER BY id") == before
    assert db.terms(successor) == inherited

    report = repair(pg_conn_str, config, actor="cli:test")
    assert report.as_dict() == {**dry.as_dict(), "dry_run": False}
    assert report.back_to_review == [hidden]
    assert report.approved_without_review == {bypassed: "proposed", unflagged: "flagged"}
    assert report.tombstones == [secret]
    assert report.links_pruned == [x1]
    assert report.recall_rows_recomputed == [successor]

    assert (db.status(hidden), db.status(bypassed), db.status(unflagged)) == ("proposed", "proposed", "flagged")
    assert db.status(accepted) == "approved"
    assert set(db.metadata(hidden)) & {"superseded_by", "valid_to", "superseded_from"} == set()
    assert "supersedes" not in db.metadata(x1)
    queue = {r["document_id"] for r in lifecycle.review_list(assignment_id=alice.assignment_id)}
    assert queue == {hidden, bypassed, unflagged}
    assert memory.recall("change board", caller=alice)["facts"] == []
    assert memory.recall("change board", caller=alice, include_superseded=True)["facts"] == []
    assert memory.recall("quokkasecret", caller=alice)["facts"] == []
    assert db.terms(successor) == own
    assert set(db.metadata(secret)) == {"assignment_id", "retired"}
    assert db.metadata(secret)["retired"]["previous_status"] == "superseded"
    repairs = [a for a in lifecycle.audit(assignment_id=alice.assignment_id) if a["action"] == "repair"]
    assert sorted(a["document_id"] for a in repairs) == sorted([hidden, bypassed, unflagged])

    again = repair(pg_conn_str, config, actor="cli:test")
    assert not again.changed


def test_the_repair_command_and_init_run_it(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    db = Db(pg_conn_str, config)
    doc = memory.propose("fact", "Gate bypass", "Deploys may skip the change board", caller=alice)["document_id"]
    db.execute("UPDATE {schema}.{gov} SET status = 'approved' WHERE id = %s", (doc,))
    db.audit(doc, "store", {"status": "approved", "kind": "fact"}, alice)
    env = {
        **os.environ,
        "PG_CONN_STR": pg_conn_str,
        "OSA_MEMORY_KB_SCHEMA": config.kb_schema,
        "OSA_MEMORY_SCHEMA": config.memory_schema,
        "OSA_MEMORY_EMBEDDER": "none",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "haystack_osa_memory.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    dry = cli("repair", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would repair     1  facts approved without a person's review, held again" in dry.stdout
    assert db.status(doc) == "approved"
    init = cli("init", "--json")
    assert init.returncode == 0, init.stderr
    assert json.loads(init.stdout)["repair"]["approved_without_review"] == {doc: "proposed"}
    assert json.loads(init.stdout)["repair"]["observations_repaired"] == 0  # reflect's repair ran too
    assert db.status(doc) == "proposed"
    done = cli("repair", "--json")
    assert json.loads(done.stdout)["changed"] is False


def test_time_fields_an_earlier_import_stored_as_given_are_removed(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    db = Db(pg_conn_str, config)
    raw = "password=Hunter2xyz! AKIAIOSFODNN7EXAMPLE"
    damaged = memory.store("Backups run nightly at two", caller=alice)["document_id"]
    kept = memory.store("Deploys freeze in December", valid_from="2020-01-01", caller=alice)
    db.execute(
        "UPDATE {schema}.{gov} SET metadata = metadata || jsonb_build_object('expires_at', %s::text, "
        "'valid_to', %s::text) WHERE id = %s",
        (raw, "x" * 200_000, damaged),
    )
    served = memory.read(damaged, caller=alice)
    assert served["expires_at"] == raw  # what an earlier import left: a secret served back as a time

    report = repair(pg_conn_str, config, actor="cli:test")
    assert report.bad_time_fields == {damaged: ["expires_at", "valid_to"]}
    assert {"expires_at", "valid_to"} & set(db.metadata(damaged)) == set()
    assert db.metadata(kept["document_id"])["valid_from"].startswith("2020-01-01")
    assert memory.read(damaged, caller=alice).get("expires_at") is None
    assert memory.recall("backups nightly", caller=alice)["facts"][0]["document_id"] == damaged
    audit = [a for a in memory.lifecycle.audit(assignment_id=alice.assignment_id) if a["action"] == "repair"]
    assert [a["details"]["dropped"] for a in audit] == [["expires_at", "valid_to"]]
    assert raw not in json.dumps([a["details"] for a in audit])
    assert not repair(pg_conn_str, config, actor="cli:test").changed
