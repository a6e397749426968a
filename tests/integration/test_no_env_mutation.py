"""A library never changes its host process's environment: importing the package, starting the embedded
database, loading the bundled embedder and storing and recalling leave ``os.environ`` as it was (a team's
application that also downloads models from a hub, or runs Haystack with telemetry, keeps its choices).
Only our own processes (`osa-memory`, `serve`) set variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPT = """
import json, os, sys
if sys.argv[2] == "minilm":
    # torch records its own cache folder (TORCHINDUCTOR_CACHE_DIR) when torch._dynamo is first imported:
    # torch's doing, whoever loads a model; a host with torch loaded already has it.
    import torch._dynamo
before = dict(os.environ)
changes = {}

def changed(step):
    now = dict(os.environ)
    diff = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if diff:
        changes[step] = diff

import haystack_osa_memory
from haystack_osa_memory import Caller, Memory, MemoryConfig
changed("import")
import haystack
changed("import haystack")
from haystack_osa_memory.store.database import resolve_connection_string
config = MemoryConfig(data_dir=sys.argv[1], embedder=sys.argv[2])
resolve_connection_string(config)
changed("resolve_connection_string")
memory = Memory(config)
me = Caller(org_id="acme", assignment_id="asg-env")
memory.store("The staging cluster runs in eu-west-1", caller=me)
changed("store")
facts = memory.recall("where does the staging cluster run?", caller=me)["facts"]
changed("recall")
memory.recall_pipeline.dumps()
changed("dumps")
print(json.dumps({"changes": changes, "recalled": [f["content"] for f in facts], "hybrid": memory.hybrid}))
"""

#: Variables a host may have set (or not) that the package must leave alone.
WATCHED = ("PG_CONN_STR", "HAYSTACK_TELEMETRY_ENABLED", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def run_host(tmp_path: Path, embedder: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in WATCHED}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    # A short data folder: the server's socket path must fit the Unix limit (docs/traps.md).
    with tempfile.TemporaryDirectory(prefix="osa-env-") as data:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, data, embedder],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.integration
@pytest.mark.slow
def test_embedded_memory_leaves_the_host_environment_alone(tmp_path: Path) -> None:
    result = run_host(tmp_path, "none")
    assert result["changes"] == {}
    assert result["recalled"] == ["The staging cluster runs in eu-west-1"]


@pytest.mark.integration
@pytest.mark.embeddings
@pytest.mark.slow
def test_the_bundled_embedder_leaves_the_hub_settings_alone(tmp_path: Path) -> None:
    result = run_host(tmp_path, "minilm")
    assert result["hybrid"] is True
    assert result["changes"] == {}
    assert result["recalled"] == ["The staging cluster runs in eu-west-1"]
