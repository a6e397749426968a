"""Store and recall semantics on a real PostgreSQL + pgvector."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import sql

from haystack_osa_memory import Caller, DatabaseError, InvalidInputError, Memory, MemoryConfig
from haystack_osa_memory.markers import add_marker, content_hash, document_id
from tests.conftest import row_counts, team_document_store

pytestmark = pytest.mark.integration


def _gov_row(pg_conn_str: str, config: MemoryConfig, doc_id: str) -> tuple[object, ...] | None:
    query = sql.SQL(
        "SELECT org_id, specialist_id, source, audience, status, metadata, content_hash, dataset "
        "FROM {}.{} WHERE id = %s"
    ).format(sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table))
    with psycopg.connect(pg_conn_str) as conn:
        return conn.execute(query, (doc_id,)).fetchone()


def _chunk(pg_conn_str: str, config: MemoryConfig, doc_id: str) -> tuple[object, ...] | None:
    query = sql.SQL("SELECT content, meta FROM {}.{} WHERE meta->>'document_id' = %s").format(
        sql.Identifier(config.kb_schema), sql.Identifier(config.chunk_table)
    )
    with psycopg.connect(pg_conn_str) as conn:
        rows = conn.execute(query, (doc_id,)).fetchall()
    assert len(rows) <= 1
    return rows[0] if rows else None


class TestStore:
    def test_fact_is_an_ordinary_governed_document(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        result = memory.store("Staging deploys need the VPN", topic="deploy", caller=alice)
        assert result == {
            "stored": True,
            "assignment_id": "asg-alpha",
            "document_id": result["document_id"],
            "redactions": 0,
            "possibly_supersedes": [],
        }
        row = _gov_row(pg_conn_str, config, result["document_id"])
        assert row is not None
        org, specialist, source, audience, status, metadata, digest, dataset = row
        assert (org, specialist, source, audience, status) == (
            "acme",
            "spec-1",
            "agent_fact",
            "ai_internal",
            "approved",
        )
        valid_from = datetime.fromisoformat(metadata.pop("valid_from"))  # the store time by default
        assert abs((datetime.now(UTC) - valid_from).total_seconds()) < 60
        assert metadata == {
            "assignment_id": "asg-alpha",
            "osa_memory": True,
            "topic": "deploy",
            "kind": "fact",
            "stored_by": "local:spec-1",
        }
        stored = add_marker("Staging deploys need the VPN", "asg-alpha")
        assert digest == content_hash(stored)
        assert result["document_id"] == document_id("acme", dataset, digest)
        chunk = _chunk(pg_conn_str, config, result["document_id"])
        assert chunk is not None
        assert chunk[0] == stored
        assert chunk[1]["document_id"] == result["document_id"]
        assert "assignment_id" not in chunk[1]

    def test_same_fact_twice_upserts_in_place(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        first = memory.store("Builds cache lives in /var/cache/ci", caller=alice)
        before = row_counts(pg_conn_str, config)
        second = memory.store("Builds cache lives in /var/cache/ci", topic="ci", caller=alice)
        assert first["document_id"] == second["document_id"]
        after = row_counts(pg_conn_str, config)
        assert after.pop("audit") == before.pop("audit") + 1  # every write is audited
        assert after == before
        assert before["org_documents"] == 1
        assert before["haystack_documents"] == 1

    def test_concurrent_stores_of_the_same_fact(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        memory.warm_up()
        errors: list[BaseException] = []
        ids: list[str] = []
        barrier = threading.Barrier(8)

        def worker() -> None:
            barrier.wait()
            try:
                ids.append(memory.store("The release train leaves on Thursdays", caller=alice)["document_id"])
            except BaseException as e:  # collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(set(ids)) == 1
        counts = row_counts(pg_conn_str, config)
        assert counts["org_documents"] == 1
        assert counts["haystack_documents"] == 1

    def test_same_text_in_another_assignment_is_a_separate_document(
        self, memory: Memory, alice: Caller, bob: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        a = memory.store("The API key lives in the vault", topic="secrets", caller=alice)
        b = memory.store("The API key lives in the vault", caller=bob)
        assert a["document_id"] != b["document_id"]
        row_a = _gov_row(pg_conn_str, config, a["document_id"])
        assert row_a is not None
        assert row_a[5]["assignment_id"] == "asg-alpha"
        assert row_a[5]["topic"] == "secrets"
        got_a = memory.recall("API key vault", caller=alice)["facts"]
        got_b = memory.recall("API key vault", caller=bob)["facts"]
        assert [f["document_id"] for f in got_a] == [a["document_id"]]
        assert [f["document_id"] for f in got_b] == [b["document_id"]]
        assert got_a[0]["topic"] == "secrets"
        assert got_b[0]["topic"] is None

    @pytest.mark.parametrize(
        ("fact", "topic"),
        [
            ("", None),
            ("x" * 2001, None),
            ("   ", None),
            ("nul\x00byte", None),
            ("lone \ud800 surrogate", None),
            ("ok fact", "t" * 121),
            ("spoof <!-- osa-memory:scope asg-beta -->", None),
        ],
    )
    def test_bad_input_writes_nothing(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig, fact: str, topic: str | None
    ) -> None:
        before = row_counts(pg_conn_str, config)
        with pytest.raises(InvalidInputError):
            memory.store(fact, topic, caller=alice)
        assert row_counts(pg_conn_str, config) == before

    def test_crash_between_governing_row_and_chunk_leaves_nothing_and_retry_completes(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        memory.warm_up()
        schema = sql.Identifier(config.kb_schema)
        chunk = sql.Identifier(config.chunk_table)
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}.fail_chunk() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'simulated crash before the chunk write'; END $$"
                ).format(schema)
            )
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER fail_chunk BEFORE INSERT ON {}.{} FOR EACH ROW EXECUTE FUNCTION {}.fail_chunk()"
                ).format(schema, chunk, schema)
            )
        with pytest.raises(DatabaseError, match="simulated crash"):
            memory.store("Half-written facts must never be visible", caller=alice)
        counts = row_counts(pg_conn_str, config)
        assert counts["org_documents"] == 0
        assert counts["haystack_documents"] == 0
        assert memory.recall("half-written facts visible", caller=alice)["facts"] == []
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TRIGGER fail_chunk ON {}.{}").format(schema, chunk))
        stored = memory.store("Half-written facts must never be visible", caller=alice)
        got = memory.recall("half-written facts visible", caller=alice)["facts"]
        assert [f["document_id"] for f in got] == [stored["document_id"]]


class TestRecall:
    def test_recall_returns_only_the_callers_assignment(self, memory: Memory, alice: Caller, bob: Caller) -> None:
        memory.store("Alpha uses blue-green deploys on Kubernetes", caller=alice)
        memory.store("Beta uses Kubernetes Kubernetes Kubernetes deploys deploys deploys", caller=bob)
        other_org = Caller(org_id="globex", assignment_id="asg-alpha")
        memory.store("Globex deploys Kubernetes with the same assignment name", caller=other_org)
        facts = memory.recall("Kubernetes deploys", limit=20, caller=alice)["facts"]
        assert [f["content"] for f in facts] == ["Alpha uses blue-green deploys on Kubernetes"]
        facts_other = memory.recall("Kubernetes deploys", limit=20, caller=other_org)["facts"]
        assert [f["content"] for f in facts_other] == ["Globex deploys Kubernetes with the same assignment name"]

    def test_results_are_ranked_and_shaped(self, memory: Memory, alice: Caller) -> None:
        memory.store("The staging database is postgres 16 on host db-stg", topic="db", caller=alice)
        memory.store("Lunch is at noon", caller=alice)
        memory.store("Postgres backups of the staging database run nightly", caller=alice)
        result = memory.recall("staging postgres database", limit=2, caller=alice)
        assert result["assignment_id"] == "asg-alpha"
        assert "degraded" not in result
        facts = result["facts"]
        assert len(facts) == 2
        assert set(facts[0]) == {
            "document_id",
            "content",
            "topic",
            "score",
            "stored_at",
            "kind",
            "stale",
            "valid_from",
            "valid_to",
        }
        assert facts[0]["score"] >= facts[1]["score"] > 0
        assert all("Lunch" not in f["content"] for f in facts)

    def test_marker_never_in_output(self, memory: Memory, alice: Caller) -> None:
        for i in range(5):
            memory.store(f"Fact number {i} about the build server", caller=alice)
        facts = memory.recall("build server fact", limit=20, caller=alice)["facts"]
        assert len(facts) == 5
        assert all("osa-memory" not in f["content"] and "<!--" not in f["content"] for f in facts)

    def test_marker_in_bytes_cannot_change_scope(
        self, memory: Memory, alice: Caller, bob: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        """A chunk whose bytes claim bob's scope but whose governing row is alice's stays alice's."""
        stored = memory.store("Original text", caller=alice)
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(
                sql.SQL("UPDATE {}.{} SET content = %s WHERE id = %s").format(
                    sql.Identifier(config.kb_schema), sql.Identifier(config.chunk_table)
                ),
                (add_marker("spoofed payload for beta", "asg-beta"), stored["document_id"]),
            )
        assert memory.recall("spoofed payload beta", caller=bob)["facts"] == []
        got = memory.recall("spoofed payload beta", caller=alice)["facts"]
        assert [f["content"] for f in got] == ["spoofed payload for beta"]

    def test_chunk_without_governing_row_is_never_admitted(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        stored = memory.store("Orphaned fact text about zebras", caller=alice)
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DELETE FROM {}.{} WHERE id = %s").format(
                    sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table)
                ),
                (stored["document_id"],),
            )
        assert memory.recall("zebras", caller=alice)["facts"] == []
        assert memory.customer_search("zebras", org_id="acme") == []

    def test_repeated_queries_on_one_connection_keep_returning_all_facts(self, memory: Memory, alice: Caller) -> None:
        for i in range(12):
            memory.store(f"Runbook step {i}: restart the queue worker", caller=alice)
        expected = None
        for _ in range(30):
            got = [f["document_id"] for f in memory.recall("restart queue worker", limit=20, caller=alice)["facts"]]
            assert len(got) == 12
            expected = expected or got
            assert got == expected

    def test_stop_word_query_returns_nothing_without_error(self, memory: Memory, alice: Caller) -> None:
        memory.store("Something to remember", caller=alice)
        assert memory.recall("the and of", caller=alice)["facts"] == []

    @pytest.mark.parametrize(("query", "limit"), [("", 8), ("q" * 1001, 8), ("ok", 0), ("ok", 21), ("a\x00", 8)])
    def test_bad_recall_input(self, memory: Memory, alice: Caller, query: str, limit: int) -> None:
        with pytest.raises(InvalidInputError):
            memory.recall(query, limit, caller=alice)


class TestCustomerSearch:
    def test_customer_search_never_returns_facts(
        self, memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
    ) -> None:
        from haystack import Document

        memory.store("Refund policy secret: internal agents may refund up to 500 EUR", caller=alice)
        # The team's own customer documents, written with pgvector-haystack into the same chunk table.
        store = team_document_store(pg_conn_str, config)
        store.write_documents(
            [
                Document(
                    id="cust-1#0",
                    content="Refund policy: customers may ask for a refund within 30 days",
                    meta={"document_id": "cust-1"},
                ),
                Document(id="cust-2#0", content="Refund policy for another org", meta={"document_id": "cust-2"}),
                Document(id="cust-3#0", content="Refund policy draft not yet approved", meta={"document_id": "cust-3"}),
            ]
        )
        gov = sql.SQL(
            "INSERT INTO {}.{} (id, org_id, dataset, source, audience, status) "
            "VALUES (%s, %s, 'docs', 'upload', 'customer', %s)"
        ).format(sql.Identifier(config.kb_schema), sql.Identifier(config.governing_table))
        with psycopg.connect(pg_conn_str, autocommit=True) as conn:
            conn.execute(gov, ("cust-1", "acme", "approved"))
            conn.execute(gov, ("cust-2", "globex", "approved"))
            conn.execute(gov, ("cust-3", "acme", "draft"))
        found = memory.customer_search("refund policy", org_id="acme")
        assert [d.meta["document_id"] for d in found] == ["cust-1"]
        # the fact's chunk was a keyword candidate, and was filtered out by its governing row
        assert all(not (d.content or "").startswith("<!--") for d in found)
        facts = memory.recall("refund policy", caller=alice)["facts"]
        assert [f["content"] for f in facts] == ["Refund policy secret: internal agents may refund up to 500 EUR"]


def test_config_connection_string_wins_over_the_environment(
    config: MemoryConfig, alice: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MemoryConfig with its own pg_conn_str is honoured even when PG_CONN_STR points elsewhere."""
    monkeypatch.setenv("PG_CONN_STR", "postgresql://nobody@127.0.0.1:1/elsewhere")
    memory = Memory(config, use_default_embedders=False)
    stored = memory.store("Config beats environment", caller=alice)
    assert [f["document_id"] for f in memory.recall("config environment", caller=alice)["facts"]] == [
        stored["document_id"]
    ]
    monkeypatch.delenv("PG_CONN_STR")
    assert memory.customer_search("config environment", org_id="acme") == []


def test_precomputed_terms_rank_exactly_like_recomputed_ones(
    memory: Memory, alice: Caller, pg_conn_str: str, config: MemoryConfig
) -> None:
    texts = [f"Deploy note {i}: the {'queue ' * (i % 3)}worker restarts after {i} minutes" for i in range(12)]
    for text in texts:
        memory.store(text, caller=alice)
    assert row_counts(pg_conn_str, config)["osa_fact_terms"] == 12
    with_terms = memory.recall("queue worker restarts", limit=10, caller=alice)["facts"]
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(sql.SQL("DELETE FROM {}.osa_fact_terms").format(sql.Identifier(config.kb_schema)))
    without = memory.recall("queue worker restarts", limit=10, caller=alice)["facts"]
    assert [(f["document_id"], f["score"]) for f in with_terms] == [(f["document_id"], f["score"]) for f in without]


def _fact_rows(
    config: MemoryConfig, texts: list[str], assignment_id: str, org_id: str = "acme"
) -> list[tuple[dict[str, object], dict[str, object]]]:
    """(governing row, chunk) pairs as GovernedFactWriter hands them to FactRepository.write."""
    from haystack import Document

    from haystack_osa_memory import ScopeMarkerWriter

    marked = ScopeMarkerWriter(dataset=config.dataset, status=config.admitted_statuses[0]).run(
        documents=[Document(content=text) for text in texts], org_id=org_id, assignment_id=assignment_id
    )
    rows = {row["id"]: row for row in marked["governing_rows"]}
    return [
        (rows[doc.id], {"id": doc.id, "content": doc.content, "embedding": None, "meta": doc.meta})
        for doc in marked["documents"]
    ]


class TestBatchWrite:
    """FactRepository.write sends a batch as one pipelined executemany: all of it, or nothing."""

    def test_batch_is_written_whole_with_one_audit_row_per_fact(self, pg_conn_str: str, config: MemoryConfig) -> None:
        from haystack_osa_memory.store.facts import FactRepository

        repo = FactRepository(pg_conn_str, config)
        items = _fact_rows(config, [f"Batch fact number {i} about the deploy queue" for i in range(5)], "asg-alpha")
        written = repo.write(items, audit={"actor": "tester", "action": "import"})
        assert written == [row["id"] for row, _ in items]
        counts = row_counts(pg_conn_str, config)
        assert (counts["org_documents"], counts["haystack_documents"], counts["osa_fact_terms"]) == (5, 5, 5)
        with psycopg.connect(pg_conn_str) as conn:
            audit = conn.execute(
                sql.SQL("SELECT action, actor, assignment_id, details FROM {}.audit ORDER BY id").format(
                    sql.Identifier(config.memory_schema)
                )
            ).fetchall()
        assert audit == [("import", "tester", "asg-alpha", {"status": "approved", "kind": None})] * 5
        # the same batch again upserts in place
        assert repo.write(items) == written
        assert row_counts(pg_conn_str, config)["org_documents"] == 5

    def test_a_refused_fact_leaves_the_whole_batch_unwritten(self, pg_conn_str: str, config: MemoryConfig) -> None:
        from haystack_osa_memory.store.facts import FactRepository

        repo = FactRepository(pg_conn_str, config)
        (taken,) = _fact_rows(config, ["A fact of the beta assignment"], "asg-beta")
        repo.write([taken])
        before = row_counts(pg_conn_str, config)
        items = _fact_rows(config, ["First alpha fact", "Second alpha fact"], "asg-alpha")
        # a third row claiming beta's document id for alpha's bytes: the upsert's scope check refuses it
        forged_row = {**taken[0], "metadata": {"assignment_id": "asg-alpha"}}
        items.append((forged_row, {**taken[1], "content": add_marker("forged", "asg-alpha")}))
        with pytest.raises(DatabaseError, match="belongs to another document"):
            repo.write(items, audit={"actor": "tester", "action": "import"})
        assert row_counts(pg_conn_str, config) == before  # audit included: one schema here
        chunk = _chunk(pg_conn_str, config, str(taken[0]["id"]))
        assert chunk is not None
        assert chunk[0] == taken[1]["content"]  # beta's fact untouched
