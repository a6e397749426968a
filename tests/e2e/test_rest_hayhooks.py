"""REST users: the same pipeline wrappers under plain `hayhooks run`, authenticated by the bearer token."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.store.tokens import TokenStore
from tests.conftest import REPO, drop_schema, free_port, new_schema_config, row_counts
from tests.e2e.conftest import env_for, wait_for_status

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


@pytest.fixture(scope="module")
def rest(pg_conn_str: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    config = new_schema_config(pg_conn_str)
    ensure_schema(pg_conn_str, config)
    port = free_port()
    log = tmp_path_factory.mktemp("rest") / "hayhooks.log"
    hayhooks = Path(sys.executable).with_name("hayhooks")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                str(hayhooks),
                "run",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--pipelines-dir",
                str(REPO / "pipelines"),
                "--without-monitoring",
                "--without-tracing",
            ],
            env=env_for(config, pg_conn_str),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    wait_for_status(proc, port, log, 90, "hayhooks")
    try:
        yield {"base": base, "config": config, "tokens": TokenStore(pg_conn_str, config), "pg": pg_conn_str}
    finally:
        proc.terminate()
        proc.wait(15)
        drop_schema(pg_conn_str, config.kb_schema)


def test_rest_store_and_recall_with_a_token(rest: dict[str, Any]) -> None:
    token = rest["tokens"].create(org_id="acme", assignment_id="asg-rest").token
    auth = {"Authorization": f"Bearer {token}"}
    stored = httpx.post(
        f"{rest['base']}/kb_memory_store/run", json={"fact": "REST users get memory too"}, headers=auth, timeout=30
    )
    assert stored.status_code == 200, stored.text
    assert stored.json()["result"]["stored"] is True
    recalled = httpx.post(
        f"{rest['base']}/kb_memory_recall/run", json={"query": "REST memory"}, headers=auth, timeout=30
    )
    assert recalled.status_code == 200, recalled.text
    assert [f["content"] for f in recalled.json()["result"]["facts"]] == ["REST users get memory too"]


def test_rest_without_a_valid_token_runs_nothing(rest: dict[str, Any]) -> None:
    before = row_counts(rest["pg"], rest["config"])
    for headers in ({}, {"Authorization": "Bearer osam_0123456789abcdef_" + "A" * 43}):
        response = httpx.post(
            f"{rest['base']}/kb_memory_store/run", json={"fact": "should not be stored"}, headers=headers, timeout=30
        )
        assert response.status_code >= 400
    assert row_counts(rest["pg"], rest["config"]) == before
