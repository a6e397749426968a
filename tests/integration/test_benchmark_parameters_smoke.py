"""Smoke test of benchmarks/parameters.py: a few short blocks each way in this process against the session's
PostgreSQL (``PG_CONN_STR``). It checks that both ways ran and were measured and that the store modules are
left on the binary parameters; the figures themselves come from the full run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from haystack_osa_memory.store import fact_writing, facts, scope_query
from haystack_osa_memory.store.parameters import text_array, vector_parameter
from haystack_osa_memory.store.recall_rows import vector_literal
from tests.conftest import REPO, load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_parameters_benchmark_switches_and_measures(pg_conn_str: str, tmp_path: Path) -> None:
    script = load_benchmark(REPO / "benchmarks" / "parameters.py", "parameters_under_test")
    script.use_binary(False)
    assert (facts.vector_parameter, fact_writing.vector_parameter) == (vector_literal, vector_literal)
    assert (facts.text_array, scope_query.text_array) == (list, list)
    out = tmp_path / "parameters.json"
    argv = ["--phase", "store", "--assignments", "2", "--facts", "5", "--block", "3", "--rounds", "2"]
    assert script.main([*argv, "--warmup", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["machine"]["cores"] >= 1
    result = data["result"]
    assert (result["phase"], result["block"], result["rounds"]) == ("store", 3, 2)
    assert result["server"]["text_ms"] > 0
    assert result["server"]["binary_ms"] > 0
    assert result["total"]["ratio"] > 0
    # Left on the binary parameters, as the package ships.
    assert (facts.vector_parameter, fact_writing.vector_parameter) == (vector_parameter, vector_parameter)
    assert (facts.text_array, scope_query.text_array) == (text_array, text_array)
