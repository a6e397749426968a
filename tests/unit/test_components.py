"""Components without a database: construction, validation, serialisation, YAML round-trip."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import pytest
import yaml
from haystack import Document, Pipeline, component
from haystack.components.embedders import MockTextEmbedder
from haystack.utils import Secret

from haystack_osa_memory import (
    ALLOWED_MODULES,
    GovernedFactWriter,
    GoverningRowAclFilter,
    GuardedTextEmbedder,
    InvalidInputError,
    MemoryConfig,
    MemoryStore,
    ScopedMemoryRetriever,
    ScopeMarkerStripper,
    ScopeMarkerWriter,
    build_recall_pipeline,
    build_store_pipeline,
)
from haystack_osa_memory.markers import content_hash, document_id

ENV_SECRET = {"type": "env_var", "env_vars": ["PG_CONN_STR"], "strict": True}


class TestScopeMarkerWriter:
    def test_init_default(self) -> None:
        w = ScopeMarkerWriter()
        assert (w.dataset, w.source, w.audience, w.status) == ("osa-memory", "agent_fact", "ai_internal", "approved")

    def test_customer_audience_refused(self) -> None:
        with pytest.raises(ValueError, match="ai_internal"):
            ScopeMarkerWriter(audience="customer")

    def test_to_dict_from_dict(self) -> None:
        data = ScopeMarkerWriter(dataset="mem").to_dict()
        assert data == {
            "type": "haystack_osa_memory.components.scope_marker_writer.ScopeMarkerWriter",
            "init_parameters": {
                "dataset": "mem",
                "source": "agent_fact",
                "audience": "ai_internal",
                "status": "approved",
            },
        }
        assert ScopeMarkerWriter.from_dict(data).dataset == "mem"

    def test_run_marks_hashes_and_prepares_rows(self) -> None:
        out = ScopeMarkerWriter().run(
            documents=[Document(content="fact one", meta={"topic": "t"}, embedding=[0.1, 0.2])],
            org_id="acme",
            assignment_id="a-1",
            specialist_id="s",
        )
        (doc,) = out["documents"]
        (row,) = out["governing_rows"]
        assert doc.content == "<!-- osa-memory:scope a-1 -->\nfact one"
        assert doc.embedding == [0.1, 0.2]
        assert row["content_hash"] == content_hash(doc.content)
        assert doc.id == row["id"] == document_id("acme", "osa-memory", row["content_hash"])
        assert row["metadata"] == {"assignment_id": "a-1", "osa_memory": True, "topic": "t"}
        assert doc.meta["document_id"] == doc.id

    def test_run_deduplicates_within_a_batch(self) -> None:
        out = ScopeMarkerWriter().run(
            documents=[Document(content="same"), Document(content="same")], org_id="o", assignment_id="a"
        )
        assert len(out["documents"]) == len(out["governing_rows"]) == 1

    def test_run_refuses_bad_scope_and_marker_lookalikes(self) -> None:
        with pytest.raises(InvalidInputError, match="assignment"):
            ScopeMarkerWriter().run(documents=[Document(content="x")], org_id="o", assignment_id="bad id -->")
        with pytest.raises(InvalidInputError, match="reserved"):
            ScopeMarkerWriter().run(
                documents=[Document(content="<!-- osa-memory:scope x -->")], org_id="o", assignment_id="a"
            )


class TestScopeMarkerStripper:
    def test_run(self) -> None:
        docs = [
            Document(id="1", content="<!-- osa-memory:scope a -->\nkeep <!-- osa-memory:scope b --> text"),
            Document(id="2", content="customer text"),
            Document(id="3", content=None),
        ]
        out = ScopeMarkerStripper().run(documents=docs)["documents"]
        assert [d.content for d in out] == ["keep <!-- osa-memory:scope b --> text", "customer text", None]
        assert [d.id for d in out] == ["1", "2", "3"]

    def test_to_dict_from_dict(self) -> None:
        data = ScopeMarkerStripper().to_dict()
        assert isinstance(ScopeMarkerStripper.from_dict(data), ScopeMarkerStripper)


class TestGoverningRowAclFilter:
    def test_init_default(self) -> None:
        f = GoverningRowAclFilter(store=MemoryStore())
        assert f.audiences == ["customer"]
        assert f.admitted_statuses == ["approved"]

    def test_empty_lists_refused(self) -> None:
        with pytest.raises(ValueError, match="at least one"):
            GoverningRowAclFilter(audiences=[])

    def test_bad_table_name_refused(self) -> None:
        with pytest.raises(ValueError, match="PostgreSQL name"):
            GoverningRowAclFilter(store=MemoryStore(governing_table="x; DROP TABLE y"))

    def test_to_dict_from_dict(self) -> None:
        store = MemoryStore(governing_table="gov", statement_timeout_ms=2500)
        data = GoverningRowAclFilter(audiences=["ai_internal"], store=store).to_dict()
        assert data["init_parameters"]["store"]["init_parameters"]["connection_string"] == ENV_SECRET
        assert data["init_parameters"]["audiences"] == ["ai_internal"]
        restored = GoverningRowAclFilter.from_dict(data)
        assert restored.store == store
        assert restored.store.statement_timeout_ms == 2500
        assert restored.store.connection_string == Secret.from_env_var("PG_CONN_STR")

    def test_from_dict_ignores_unrelated_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("OSA_MEMORY_EMBEDDER", "not-an-embedder")
        monkeypatch.setenv("OSA_MEMORY_STATEMENT_TIMEOUT_MS", "1")
        data = GoverningRowAclFilter(store=MemoryStore(statement_timeout_ms=2500)).to_dict()
        assert GoverningRowAclFilter.from_dict(data).store.config.statement_timeout_ms == 2500

    def test_lookup_failure_fails_closed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from haystack_osa_memory import AclLookupError

        monkeypatch.setenv("PG_CONN_STR", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
        f = GoverningRowAclFilter(store=MemoryStore())
        with pytest.raises(AclLookupError, match="no document admitted"):
            f.run(documents=[Document(content="x", meta={"document_id": "d"})], org_id="acme")


class TestScopedMemoryRetriever:
    def test_validation(self) -> None:
        with pytest.raises(ValueError, match="top_k"):
            ScopedMemoryRetriever(top_k=0)
        with pytest.raises(ValueError, match="candidate_k"):
            ScopedMemoryRetriever(top_k=10, candidate_k=5)
        with pytest.raises(ValueError, match="Supported fusions"):
            ScopedMemoryRetriever(fusion="magic")  # type: ignore[arg-type]

    def test_to_dict_from_dict(self) -> None:
        r = ScopedMemoryRetriever(top_k=5, rrf_k=30, store=MemoryStore(chunk_table="kb"))
        restored = ScopedMemoryRetriever.from_dict(r.to_dict())
        assert (restored.top_k, restored.rrf_k, restored.store.chunk_table) == (5, 30, "kb")


class TestGovernedFactWriter:
    def test_to_dict_from_dict(self) -> None:
        w = GovernedFactWriter(store=MemoryStore(kb_schema="kb", embedding_dimension=8), audit=False)
        restored = GovernedFactWriter.from_dict(w.to_dict())
        assert (restored.store.kb_schema, restored.store.embedding_dimension, restored.audit) == ("kb", 8, False)

    def test_unpaired_rows_refused_before_any_write(self) -> None:
        with pytest.raises(InvalidInputError, match="exactly one governing row"):
            GovernedFactWriter(store=MemoryStore()).run(documents=[Document(id="a", content="x")], governing_rows=[])

    def test_wrong_embedding_dimension_refused(self) -> None:
        with pytest.raises(InvalidInputError, match="dimensions"):
            GovernedFactWriter(store=MemoryStore(embedding_dimension=4)).run(
                documents=[Document(id="a", content="x", embedding=[1.0])], governing_rows=[{"id": "a"}]
            )


@component
class _FailingEmbedder:
    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, Any]:
        raise RuntimeError("model server down")


@component
class _SlowEmbedder:
    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, Any]:
        time.sleep(1.0)
        return {"embedding": [1.0]}


class TestGuardedTextEmbedder:
    def test_passes_embedding_through(self) -> None:
        out = GuardedTextEmbedder(embedder=MockTextEmbedder(dimension=8)).run(text="hello")
        assert out["degraded"] is None
        assert len(out["embedding"]) == 8

    @pytest.mark.parametrize("bad", [[], [float("nan"), 1.0], [[1.0, 2.0]], "abc"])
    def test_unusable_embedding_degrades(self, bad: Any) -> None:
        @component
        class _Odd:
            @component.output_types(embedding=list[float])
            def run(self, text: str) -> dict[str, Any]:
                return {"embedding": bad}

        out = GuardedTextEmbedder(embedder=_Odd()).run(text="hello")
        assert out["embedding"] is None
        assert "no usable embedding" in out["degraded"]

    @pytest.mark.parametrize("sender", ["guard", "plain"])
    def test_retriever_accepts_guarded_and_plain_embeddings(self, sender: str) -> None:
        pipe = Pipeline()
        embedder = MockTextEmbedder(dimension=8)
        pipe.add_component("embed", GuardedTextEmbedder(embedder=embedder) if sender == "guard" else embedder)
        pipe.add_component("retrieve", ScopedMemoryRetriever(store=MemoryStore()))
        pipe.connect("embed.embedding", "retrieve.query_embedding")  # raises when the types do not match
        assert pipe.graph.has_edge("embed", "retrieve")

    def test_failure_degrades(self) -> None:
        out = GuardedTextEmbedder(embedder=_FailingEmbedder()).run(text="hello")
        assert out["embedding"] is None
        assert "model server down" in out["degraded"]

    def test_timeout_degrades(self) -> None:
        start = time.perf_counter()
        out = GuardedTextEmbedder(embedder=_SlowEmbedder(), timeout=0.1).run(text="hello")
        assert time.perf_counter() - start < 0.9
        assert out["embedding"] is None
        assert "0.10 s budget" in out["degraded"]

    def test_stuck_embedder_does_not_starve_a_healthy_one(self) -> None:
        """Two calls of a stuck embedder time out and keep its workers busy; another embedder in the
        same process still answers in time (the workers are per instance)."""
        stuck = GuardedTextEmbedder(embedder=_SlowEmbedder(), timeout=0.05)
        for _ in range(3):
            assert stuck.run(text="hello")["embedding"] is None
        healthy = GuardedTextEmbedder(embedder=MockTextEmbedder(dimension=8), timeout=0.5)
        out = healthy.run(text="hello")
        assert out["degraded"] is None
        assert len(out["embedding"]) == 8

    @pytest.mark.parametrize(("raised", "reason"), [(None, None), ("timeout", "0.20 s budget"), ("fail", "broke")])
    def test_a_bounded_embedder_runs_in_the_calling_thread(self, raised: str | None, reason: str | None) -> None:
        """An embedder that stops at its own budget (`bounded`) is called here with the guard's timeout, never
        through the guard's threads; its `EmbeddingTimeoutError` and its failures degrade as the thread's would."""
        from haystack_osa_memory.errors import EmbeddingTimeoutError

        calls: list[tuple[str, float | None, int]] = []

        class _Bounded:
            bounded = True

            def run(self, text: str) -> dict[str, Any]:
                raise AssertionError("run_bounded, not run")

            def run_bounded(self, text: str, timeout: float | None) -> dict[str, Any]:
                calls.append((text, timeout, threading.get_ident()))
                if raised == "timeout":
                    raise EmbeddingTimeoutError("past its budget")
                if raised == "fail":
                    raise RuntimeError("broke")
                return {"embedding": [0.5, 0.25]}

        guard = GuardedTextEmbedder(embedder=_Bounded(), timeout=0.2)
        out = guard.run(text="hello")
        assert calls == [("hello", 0.2, threading.get_ident())]
        assert not guard._executor._threads  # no hand-off: the guard's pool never started a thread
        if reason is None:
            assert out["degraded"] is None
            assert out["embedding"].tolist() == [0.5, 0.25]
        else:
            assert out["embedding"] is None
            assert reason in out["degraded"]

    def test_an_embedder_not_bounded_runs_in_the_guards_thread(self) -> None:
        seen: list[int] = []

        class _NotBounded:
            bounded = "yes"  # only True itself counts

            def run(self, text: str) -> dict[str, Any]:
                seen.append(threading.get_ident())
                return {"embedding": [1.0]}

        guard = GuardedTextEmbedder(embedder=_NotBounded())
        assert guard.run(text="hello")["degraded"] is None
        assert len(seen) == 1
        assert seen[0] != threading.get_ident()

    def test_to_dict_from_dict_keeps_inner_embedder(self) -> None:
        g = GuardedTextEmbedder(embedder=MockTextEmbedder(dimension=8), timeout=1.5)
        restored = GuardedTextEmbedder.from_dict(g.to_dict())
        assert restored.timeout == 1.5
        assert isinstance(restored.embedder, MockTextEmbedder)

    def test_not_a_component_refused(self) -> None:
        with pytest.raises(ValueError, match="text embedder"):
            GuardedTextEmbedder(embedder=object())


def _normalised(pipe: Pipeline) -> dict[str, Any]:
    data = pipe.to_dict()
    data["connections"] = sorted(data["connections"], key=lambda c: (c["sender"], c["receiver"]))
    return data


class TestDeadlines:
    def test_a_pass_past_its_deadline_is_stopped_and_one_done_in_time_is_not(self) -> None:
        from haystack_osa_memory.components.onnx_runtime import Deadlines

        class _Options:
            terminate = False

        deadlines = Deadlines()
        late, early = _Options(), _Options()
        late_token = deadlines.watch(late, 0.02)
        early_token = deadlines.watch(early, 0.02)
        deadlines.done(early_token)
        stop = time.monotonic() + 2.0
        while not late.terminate and time.monotonic() < stop:
            time.sleep(0.005)
        assert late.terminate is True
        assert early.terminate is False
        deadlines.done(late_token)  # already gone: nothing happens
        assert not deadlines._runs


class TestPipelinesYaml:
    @pytest.mark.parametrize("hybrid", [False, True])
    def test_recall_pipeline_round_trips(self, hybrid: bool) -> None:
        cfg = MemoryConfig(chunk_table="kb_chunks", embedding_dimension=8)
        pipe = build_recall_pipeline(cfg, MockTextEmbedder(dimension=8) if hybrid else None)
        text = pipe.dumps()
        assert "haystack_osa_memory.components" in text
        assert "PG_CONN_STR" in text
        loaded = Pipeline.loads(text, allowed_modules=ALLOWED_MODULES)
        assert _normalised(loaded) == _normalised(pipe)

    def test_store_pipeline_round_trips(self) -> None:
        pipe = build_store_pipeline(MemoryConfig())
        loaded = Pipeline.loads(pipe.dumps(), allowed_modules=ALLOWED_MODULES)
        assert _normalised(loaded) == _normalised(pipe)

    def test_loading_without_allow_list_is_refused(self) -> None:
        from haystack.core.errors import DeserializationError

        text = build_store_pipeline(MemoryConfig()).dumps()
        with pytest.raises(DeserializationError):
            Pipeline.loads(text)


DATABASE_COMPONENTS = [GovernedFactWriter, GoverningRowAclFilter, ScopedMemoryRetriever]


class TestStoreRequired:
    """The database components take ``store=``; without it they still load, on the environment's store, warning."""

    @pytest.mark.parametrize("cls", DATABASE_COMPONENTS, ids=lambda c: c.__name__)
    def test_without_store_warns_and_falls_back_to_the_environment(
        self, cls: type[Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("PG_CONN_STR", "postgresql://someone@db.example/kb")
        with pytest.warns(DeprecationWarning, match=rf"{cls.__name__} without store= is deprecated.*store=MemoryStore"):
            built = cls()
        assert built.store == MemoryStore()
        assert built.store.conn_str == "postgresql://someone@db.example/kb"
        # It serialises with the store it fell back to: the saved form loads without a warning.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            restored = cls.from_dict(built.to_dict())
        assert restored.store == built.store

    @pytest.mark.parametrize("cls", DATABASE_COMPONENTS, ids=lambda c: c.__name__)
    def test_with_store_does_not_warn(self, cls: type[Any]) -> None:
        store = MemoryStore(chunk_table="kb_chunks")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            built = cls(store=store)
            cls.from_dict(built.to_dict())
        assert built.store is store

    @pytest.mark.parametrize("cls", DATABASE_COMPONENTS, ids=lambda c: c.__name__)
    def test_a_dict_without_store_loads_with_the_warning(self, cls: type[Any]) -> None:
        data = cls(store=MemoryStore(kb_schema="kb")).to_dict()
        del data["init_parameters"]["store"]
        with pytest.warns(DeprecationWarning, match=rf"{cls.__name__} without store= is deprecated"):
            loaded = cls.from_dict(data)
        assert loaded.store == MemoryStore()

    def test_a_yaml_pipeline_without_store_loads_with_the_warning(self) -> None:
        text = build_recall_pipeline(MemoryConfig()).dumps()
        data = yaml.safe_load(text)
        for name in ("retrieve", "acl"):
            del data["components"][name]["init_parameters"]["store"]
        with pytest.warns(DeprecationWarning, match="without store= is deprecated") as caught:
            loaded = Pipeline.loads(yaml.safe_dump(data), allowed_modules=ALLOWED_MODULES)
        named = sorted(str(w.message).split(" ", 1)[0] for w in caught if w.category is DeprecationWarning)
        assert named == ["GoverningRowAclFilter", "ScopedMemoryRetriever"]
        assert loaded.get_component("retrieve").store == MemoryStore()  # type: ignore[attr-defined]

    def test_acl_filter_without_store_still_reads_the_environments_database(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from haystack_osa_memory import AclLookupError

        monkeypatch.setenv("PG_CONN_STR", "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
        with pytest.deprecated_call():
            f = GoverningRowAclFilter()
        with pytest.raises(AclLookupError, match="no document admitted"):
            f.run(documents=[Document(content="x", meta={"document_id": "d"})], org_id="acme")


class TestStoreOwnsItsPool:
    """`MemoryStore` holds its pool from its first use and lets go of it in ``close()`` / at the end of ``with``."""

    # Its own connection string: stores of other tests that were never closed still hold theirs.
    CONN = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1&application_name=pool-owner-test"

    def test_the_last_store_to_close_closes_the_shared_pool(self) -> None:
        from haystack_osa_memory.store.database import get_pool

        first = MemoryStore(connection_string=Secret.from_token(self.CONN), kb_schema="s_pool_a")
        second = MemoryStore(connection_string=Secret.from_token(self.CONN), kb_schema="s_pool_b")
        assert first.facts is first.facts  # both in use: both hold the pool
        assert second.tokens is not None
        pool = get_pool(self.CONN, first.config)
        assert get_pool(self.CONN, second.config) is pool  # same database and timeouts: one pool
        first.close()
        assert not pool.closed  # the second store still holds it
        assert "facts" not in first.__dict__  # repositories built on the pool are let go of too
        first.close()  # idempotent: releases nothing twice
        assert not pool.closed
        second.close()
        assert pool.closed
        reopened = get_pool(self.CONN, first.config)
        assert reopened is not pool
        assert not reopened.closed
        reopened.close()

    def test_context_manager_closes_on_exit(self) -> None:
        from haystack_osa_memory.store.database import get_pool

        with MemoryStore(connection_string=Secret.from_token(self.CONN), statement_timeout_ms=1234) as store:
            assert store.lifecycle is not None
            pool = get_pool(self.CONN, store.config)
            assert not pool.closed
        assert pool.closed

    def test_reading_hands_out_the_stores_pool(self) -> None:
        from haystack_osa_memory import DatabaseError

        with (
            MemoryStore(connection_string=Secret.from_token(self.CONN), pool_timeout=0.5) as store,
            pytest.raises(DatabaseError, match="did not answer"),
            store.reading(),
        ):
            pass  # nothing answers on port 1: the pool's checkout times out
