"""benchmarks.harness: the one percentile every benchmark reports (linear interpolation, numpy's default), and
no benchmark script with a percentile, a machine description or a sibling-script import of its own."""

from __future__ import annotations

import ast
import random
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from benchmarks.harness import latency_summary, machine_info, percentile, percentiles
from tests.conftest import REPO

BENCHMARKS = REPO / "benchmarks"
#: Names a script must take from the harness instead of defining.
OWN_DEFINITION = re.compile(r"percentile|quantile|machine_info|cpu_model|cpu_name")
#: numpy / statistics functions that compute a percentile their own way.
PERCENTILE_CALLS = {"percentile", "nanpercentile", "quantile", "nanquantile", "quantiles"}


def test_percentile_known_values() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([4, 1, 3, 2], 0) == 1
    assert percentile([4, 1, 3, 2], 100) == 4
    assert percentile([7.0], 95) == 7.0
    # 1..20: rank 0.95 * 19 = 18.05, between 19 and 20. Nearest rank (the old definition of some scripts)
    # gave 19, the floor of the rank (console.py's) 19 as well.
    assert percentile(list(range(1, 21)), 95) == pytest.approx(19.05)
    assert percentile([10, 20, 30, 40, 50], 90) == pytest.approx(46.0)
    assert percentile([0.0, 1.0], 25) == pytest.approx(0.25)


def test_percentile_is_numpys_default() -> None:
    rng = random.Random(7)
    for n in (1, 2, 3, 10, 101, 1000):
        values = [rng.lognormvariate(0, 1) for _ in range(n)]
        for q in (0, 1, 25, 50, 90, 95, 99, 99.9, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], -1), ([1.0], 100.5)])
def test_percentile_refuses_what_has_none(values: list[float], q: float) -> None:
    with pytest.raises(ValueError, match="percentile"):
        percentile(values, q)


def test_summaries_in_milliseconds() -> None:
    seconds = [0.001 * n for n in range(1, 21)]  # 1..20 ms
    assert percentiles(seconds, digits=2) == {"p50": 10.5, "p95": 19.05, "p99": 19.81, "mean": 10.5}
    assert latency_summary(seconds) == {"mean_ms": 10.5, "p50_ms": 10.5, "p95_ms": 19.05, "max_ms": 20.0}
    assert percentiles([]) == {}
    assert latency_summary([]) == {}


def test_machine_info_describes_the_machine() -> None:
    info = machine_info()
    assert info["cpu_model"]
    assert info["cores"] >= 1
    assert info["ram_gib"] is None or info["ram_gib"] > 0
    assert re.fullmatch(r"3\.\d+\.\d+", info["python"])
    assert len(info["load_avg_at_start"]) == 3
    assert "postgresql" not in info  # only with a connection string


def offences(source: str, sibling_modules: set[str]) -> list[str]:
    """What a benchmark script does that belongs to the harness: its own percentile or machine description,
    a numpy/statistics percentile, or an import of a sibling script by its bare name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and OWN_DEFINITION.search(node.name):
            found.append(f"line {node.lineno}: defines {node.name}()")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PERCENTILE_CALLS:
            found.append(f"line {node.lineno}: calls {ast.unparse(node.func)}()")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in sibling_modules:
            found.append(f"line {node.lineno}: imports the sibling script {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in sibling_modules]
    return found


def test_the_scan_sees_what_it_forbids() -> None:
    source = (
        "import numpy as np\n"
        "from locomo import load_locomo\n"
        "def percentile(v, p):\n    return sorted(v)[round(p * (len(v) - 1))]\n"
        "def machine_info():\n    return {}\n"
        "def summary(v):\n    return np.percentile(v, 95)\n"
    )
    assert len(offences(source, {"locomo"})) == 4
    assert offences("from benchmarks.harness import percentile\nx = percentile([1.0], 50)\n", {"locomo"}) == []


def test_no_benchmark_script_brings_its_own() -> None:
    scripts = sorted(p for p in BENCHMARKS.glob("*.py") if p.name not in ("harness.py", "__init__.py"))
    assert len(scripts) >= 10
    siblings = {p.stem for p in BENCHMARKS.glob("*.py")}
    found = {p.name: offences(p.read_text(encoding="utf-8"), siblings) for p in scripts}
    assert {name: lines for name, lines in found.items() if lines} == {}


@pytest.mark.parametrize("cwd", ["repo", "revision"])
def test_a_compared_revision_runs_its_own_package(tmp_path: Path, cwd: str) -> None:
    """`load.py --compare`: the baseline's processes import the checkout's package, even started from the
    repository's root (where `python -m`/`-c` would put this work tree's package first)."""
    from benchmarks.load import PYTHON, REPO, revision_env

    revision = tmp_path / "checkout"
    (revision / "haystack_osa_memory").mkdir(parents=True)
    (revision / "haystack_osa_memory" / "__init__.py").write_text("")
    probe = "import haystack_osa_memory; print(haystack_osa_memory.__file__)"
    done = subprocess.run(
        [*PYTHON, "-c", probe],
        env=revision_env(revision),
        cwd=REPO if cwd == "repo" else revision,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(done.stdout.strip()).resolve() == (revision / "haystack_osa_memory" / "__init__.py").resolve()
    ours = subprocess.run([*PYTHON, "-c", probe], env=revision_env(None), cwd=revision, capture_output=True, text=True)
    assert Path(ours.stdout.strip()).resolve().is_relative_to(REPO.resolve())
