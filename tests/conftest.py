"""Shared fixtures. Integration tests run on a real PostgreSQL + pgvector: PG_CONN_STR when set,
otherwise an embedded server started for the session. They are never skipped: if no database can be
started, they fail."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.database import close_pools, scratch_database
from haystack_osa_memory.store.schema import ensure_schema

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def pg_conn_str() -> Iterator[str]:
    """A real PostgreSQL with pgvector for the whole session (PG_CONN_STR, else a throwaway embedded
    one); exported as PG_CONN_STR."""
    with scratch_database(prefix="osa-tests-") as uri:
        yield uri


def new_schema_config(pg_conn_str: str, **overrides: Any) -> MemoryConfig:
    name = "t_" + uuid.uuid4().hex[:12]
    values: dict[str, Any] = {
        "pg_conn_str": pg_conn_str,
        "kb_schema": name,
        "memory_schema": name,
        "embedder": "none",
    }
    values.update(overrides)
    return MemoryConfig(**values)


@pytest.fixture
def config(pg_conn_str: str) -> Iterator[MemoryConfig]:
    """A fresh knowledge base (its own schema) for one test."""
    cfg = new_schema_config(pg_conn_str)
    ensure_schema(pg_conn_str, cfg)
    yield cfg
    drop_schema(pg_conn_str, cfg.kb_schema)


def drop_schema(pg_conn_str: str, schema: str) -> None:
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def memory(config: MemoryConfig) -> Memory:
    """Lexical memory (no embedder) on the test's knowledge base."""
    return Memory(config, use_default_embedders=False)


@pytest.fixture
def hybrid_memory(pg_conn_str: str) -> Iterator[Memory]:
    """Hybrid memory (the default embedders, the offline MiniLM) on a fresh knowledge base of its own."""
    from haystack_osa_memory.embedders import build_embedders

    cfg = new_schema_config(pg_conn_str, embedder="minilm")
    ensure_schema(pg_conn_str, cfg)
    document, text = build_embedders(cfg)
    yield Memory(cfg, document_embedder=document, text_embedder=text)
    drop_schema(pg_conn_str, cfg.kb_schema)


@pytest.fixture
def served_env(config: MemoryConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The environment a serving process reads (`create_app`, `shared_memory`) set to ``config``'s schema,
    lexical, with a private offline buffer; the process's shared memory reset."""
    from haystack_osa_memory import memory as memory_module

    monkeypatch.setenv("PG_CONN_STR", config.pg_conn_str or "")
    monkeypatch.setenv("OSA_MEMORY_KB_SCHEMA", config.kb_schema)
    monkeypatch.setenv("OSA_MEMORY_SCHEMA", config.memory_schema)
    monkeypatch.setenv("OSA_MEMORY_EMBEDDER", "none")
    monkeypatch.setenv("OSA_MEMORY_BUFFER", str(tmp_path / "buffer.jsonl"))
    monkeypatch.setattr(memory_module, "_shared", None)


@pytest.fixture
def alice() -> Caller:
    return Caller(org_id="acme", assignment_id="asg-alpha", specialist_id="spec-1")


@pytest.fixture
def bob() -> Caller:
    return Caller(org_id="acme", assignment_id="asg-beta", specialist_id="spec-2")


def team_document_store(pg_conn_str: str, config: MemoryConfig) -> Any:
    """A team's own pgvector-haystack `PgvectorDocumentStore` on the knowledge base's chunk table, as the
    team writes its customer documents."""
    from haystack.utils import Secret
    from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore

    return PgvectorDocumentStore(
        connection_string=Secret.from_token(pg_conn_str),
        schema_name=config.kb_schema,
        table_name=config.chunk_table,
        embedding_dimension=config.embedding_dimension,
        keyword_index_name=f"{config.chunk_table}_keyword_index",
        hnsw_index_name=f"{config.chunk_table}_hnsw_index",
    )


def row_counts(pg_conn_str: str, config: MemoryConfig) -> dict[str, int]:
    """Rows in every table of the test's schema."""
    counts = {}
    with psycopg.connect(pg_conn_str) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
            (config.kb_schema,),
        ).fetchall()
        for (table,) in tables:
            query = sql.SQL("SELECT count(*) FROM {}.{}").format(
                sql.Identifier(config.kb_schema), sql.Identifier(table)
            )
            row = conn.execute(query).fetchone()
            assert row is not None
            counts[table] = int(row[0])
    return counts


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI nothing may be skipped: a skipped integration test is a failure, not a pass."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if os.environ.get("CI") and skipped:
        print(f"\nCI: {skipped} test(s) were skipped; every test must run in CI")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


class Roles:
    """Three login roles of a team's database: the tables' owner (runs `init`), our runtime role (runs
    `serve`) and a team pipeline's role (reads and writes customer documents)."""

    def __init__(self, pg_conn_str: str) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.admin = pg_conn_str
        self.names = {"owner": f"own_{suffix}", "runtime": f"rt_{suffix}", "team": f"team_{suffix}"}

    def uri(self, who: str) -> str:
        return make_conninfo(self.admin, user=self.names[who])

    def create(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            for name in self.names.values():
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))

    def drop(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            for name in self.names.values():
                conn.execute(sql.SQL("DROP OWNED BY {0} CASCADE; DROP ROLE {0}").format(sql.Identifier(name)))


@pytest.fixture
def team_db(pg_conn_str: str) -> Iterator[tuple[Roles, MemoryConfig]]:
    """A schema owned by a non-superuser owner, initialised by that owner, with the runtime role granted
    and a team role allowed to read and write the chunk and governing tables."""
    roles = Roles(pg_conn_str)
    roles.create()
    cfg = new_schema_config(pg_conn_str)
    with psycopg.connect(pg_conn_str, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                sql.Identifier(cfg.kb_schema), sql.Identifier(roles.names["owner"])
            )
        )
    try:
        ensure_schema(roles.uri("owner"), cfg, runtime_role=roles.names["runtime"])
        names = {**cfg.sql_names(), "team": sql.Identifier(roles.names["team"])}
        with psycopg.connect(roles.uri("owner"), autocommit=True) as conn:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {schema} TO {team}").format(**names))
            conn.execute(
                sql.SQL("GRANT SELECT, INSERT, UPDATE ON {schema}.{chunk}, {schema}.{gov} TO {team}").format(**names)
            )
        yield roles, cfg
    finally:
        close_pools()
        drop_schema(pg_conn_str, cfg.kb_schema)
        roles.drop()


def load_benchmark(script: Path, name: str) -> ModuleType:
    """A benchmark script imported as module ``name`` (the smoke tests call its ``main`` in this process)."""
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is executed
    spec.loader.exec_module(module)
    return module


def run_with_json(name: str, argv: list[str], tmp_path: Path) -> Any:
    """The benchmark ``benchmarks/<name>.py`` run in this process (`load_benchmark`) with ``argv`` and ``--json``:
    its ``main``'s result, checked to be what it wrote there."""
    script = load_benchmark(REPO / "benchmarks" / f"{name}.py", f"{name}_under_test")
    out = tmp_path / f"{name}.json"
    result = script.main([*argv, "--json", str(out)])
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(json.dumps(result))
    return result


def run_benchmark(
    script: Path, args: list[str], pg_conn_str: str | None = None, *, succeeds: bool = True
) -> subprocess.CompletedProcess[str]:
    """A benchmark script run as its users run it (its own process, from the repository's root), on
    ``pg_conn_str`` when given. With ``succeeds`` it must exit 0; else whatever it exits with is returned."""
    env = {**os.environ, "PG_CONN_STR": pg_conn_str} if pg_conn_str else None
    done = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=600, cwd=REPO
    )
    if succeeds:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


#: Ports `free_port` handed out in this process: a port just closed is often the next one the kernel offers,
#: and a server given the same port twice (MCP and metrics) refuses to start.
_handed_out: set[int] = set()


def free_port() -> int:
    """A free local port, never one this process was handed before."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
