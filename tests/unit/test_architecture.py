"""The layers of docs/architecture.md: each module imports only from its own layer and those below."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "haystack_osa_memory"

#: Layer of each module (by its dotted name under the package, a package's name covering its modules),
#: lowest first. Keep in step with docs/architecture.md.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "errors",
            "markers",
            "config",
            "caller",
            "validation",
            "tools",
            "instruments",
            "privacy",
            "supersession",
            "time_phrases",
        ),
    ),
    ("store", ("store",)),
    ("components", ("components",)),
    ("assembly", ("builders", "embedders", "yaml_pipelines")),
    ("application", ("memory", "offline", "durable_queue", "reflect", "transfer", "agent_tools")),
    ("mcp", ("mcp", "console")),
    ("cli", ("cli",)),
]
RANK = {name: rank for rank, (_, names) in enumerate(LAYERS) for name in names}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "haystack_osa_memory" or len(parts) < 2:
        return None  # the package itself: its __init__ is the lazy public API, above every layer
    return RANK.get(parts[1])


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["haystack_osa_memory", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "haystack_osa_memory":
            for alias in node.names:  # a submodule, the version string, or the public API (the top)
                if (PACKAGE / f"{alias.name}.py").exists() or (PACKAGE / alias.name).is_dir():
                    names.add(f"haystack_osa_memory.{alias.name}")
                elif alias.name != "__version__":
                    names.add("haystack_osa_memory")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n.startswith("haystack_osa_memory")}


def test_every_module_has_a_layer() -> None:
    assert [m for m, _ in _modules() if m != "haystack_osa_memory" and _layer(m) is None] == []


@pytest.mark.parametrize(("module", "path"), _modules(), ids=[m for m, _ in _modules()])
def test_imports_only_its_layer_and_below(module: str, path: Path) -> None:
    own = _layer(module)
    if own is None:
        return
    upward = sorted(name for name in _imports(path) if (layer := _layer(name)) is None or layer > own)
    assert upward == [], f"{module} ({LAYERS[own][0]}) imports from a higher layer: {upward}"


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from haystack_osa_memory.memory import Memory\n", encoding="utf-8")
    assert _imports(bad) == {"haystack_osa_memory.memory"}
    assert _layer("haystack_osa_memory.memory") > _layer("haystack_osa_memory.store.facts")  # type: ignore[operator]
