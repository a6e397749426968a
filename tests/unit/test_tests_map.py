"""tests/README.md maps every module of the package to the test files that exercise it.

``python -m tests.unit.test_tests_map`` prints the map as derived from the tests' imports (and the dotted
module names their strings mention, such as ``-m haystack_osa_memory.cli``), most relevant files first, to
refresh the README's table by hand.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "haystack_osa_memory"
TESTS = REPO / "tests"
README = TESTS / "README.md"

HEADER = ("module", "tests")
CODE = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"haystack_osa_memory(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
SHOWN = 6  # test files per module in the derived table


def package_modules() -> list[str]:
    """Every module file of the package, as its path under the package (``store/tokens.py``)."""
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def readme_map(text: str) -> dict[str, list[str]]:
    """The README's table ``| module | tests |``: module path -> test files (paths under tests/)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if tuple(_cells(line)) == HEADER)
    table: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        module_cell, tests_cell = _cells(line)[:2]
        (module,) = CODE.findall(module_cell)
        assert module not in table, f"{module} has two rows"
        table[module] = CODE.findall(tests_cell)
    return table


# -- deriving the map from the tests --------------------------------------------------------------------
def _file_of(dotted: str) -> str | None:
    """``haystack_osa_memory.store.tokens`` -> ``store/tokens.py`` (a package -> its ``__init__.py``)."""
    parts = dotted.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    if path.with_suffix(".py").is_file() and parts:
        return path.with_suffix(".py").relative_to(PACKAGE).as_posix()
    if (path / "__init__.py").is_file():
        return (path / "__init__.py").relative_to(PACKAGE).as_posix()
    return None


def _reexports(init: Path) -> dict[str, str]:
    """Names a package ``__init__`` takes from its modules (``from .x import N`` or the lazy ``_EXPORTS``)."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(init.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("haystack_osa_memory"):
            found.update({alias.asname or alias.name: node.module for alias in node.names})
        elif isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Dict):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "_EXPORTS":
                found.update(ast.literal_eval(node.value))
    return found


def _defining(module: str, name: str) -> str:
    """Where ``from module import name`` really comes from: a submodule, or the module a package re-exports."""
    if _file_of(f"{module}.{name}") is not None:
        return f"{module}.{name}"
    file = _file_of(module)
    if file is not None and file.endswith("__init__.py"):
        origin = _reexports(PACKAGE / file).get(name)
        if origin is not None and origin != module:
            return _defining(origin, name)
    return module


def _used(test: Path) -> Counter[str]:
    """Module files the test file uses, with how often it names what it took from each."""
    text = test.read_text(encoding="utf-8")
    tree = ast.parse(text)
    uses: Counter[str] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("haystack_osa_memory") and (file := _file_of(alias.name)):
                    uses[file] += 1 + text.count((alias.asname or alias.name) + ".")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("haystack_osa_memory"):
            for alias in node.names:
                if file := _file_of(_defining(node.module, alias.name)):
                    uses[file] += text.count(alias.asname or alias.name)
            if (package := _file_of(node.module)) and package.endswith("__init__.py"):
                uses[package] += 1  # the package's own API (its re-exports) is used too
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for dotted in DOTTED.findall(node.value):
                while dotted.count(".") and _file_of(dotted) is None:
                    dotted = dotted.rsplit(".", 1)[0]
                if file := _file_of(dotted):
                    uses[file] += 1
                    if file.endswith("__init__.py") and (PACKAGE / file).with_name("__main__.py").exists():
                        uses[Path(file).with_name("__main__.py").as_posix()] += 1  # ``-m package``
    return uses


def _importers() -> dict[str, set[str]]:
    """Module path -> the package's modules that import it."""
    found: dict[str, set[str]] = {}
    for module in package_modules():
        tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("haystack_osa_memory"):
                names = [_defining(node.module, alias.name) for alias in node.names]
            for name in names:
                if name.startswith("haystack_osa_memory") and (file := _file_of(name)) and file != module:
                    found.setdefault(file, set()).add(module)
    return found


def derived_map() -> dict[str, list[str]]:
    """Module path -> test files, the file named after the module first, then by how much each uses it. A module
    no test imports takes the test files of the nearest modules that import it."""
    users: dict[str, Counter[str]] = {m: Counter() for m in package_modules()}
    for test in sorted(TESTS.rglob("*.py")):
        if test == Path(__file__).resolve():
            continue  # this file names modules in its own examples
        for file, count in _used(test).items():
            users.setdefault(file, Counter())[test.relative_to(TESTS).as_posix()] += count
    ranked = {}
    for module, counter in users.items():
        stem = Path(module).stem

        def key(item: tuple[str, int], stem: str = stem) -> tuple[bool, int, str]:
            return (stem not in Path(item[0]).stem, -item[1], item[0])

        ranked[module] = [t for t, _ in sorted(counter.items(), key=key)]
    importers = _importers()
    for module, tests in ranked.items():
        seen, level = {module}, {module}
        while not tests and level:  # the nearest modules that import it, then theirs, ...
            level = {i for m in level for i in importers.get(m, ())} - seen
            seen |= level
            via = Counter(t for importer in sorted(level) for t in users.get(importer, {}))
            tests.extend(t for t, _ in via.most_common())
    return ranked


def markdown(table: dict[str, list[str]]) -> str:
    rows = ["| module | tests |", "|---|---|"]
    for module, tests in sorted(table.items()):
        shown = ", ".join(f"`{t}`" for t in tests[:SHOWN])
        more = f" and {len(tests) - SHOWN} more" if len(tests) > SHOWN else ""
        rows.append(f"| `{module}` | {shown or '(none yet)'}{more} |")
    return "\n".join(rows)


# -- the tests --------------------------------------------------------------------------------------------
def test_every_module_of_the_package_has_a_row() -> None:
    table = readme_map(README.read_text(encoding="utf-8"))
    assert sorted(set(package_modules()) - table.keys()) == [], "add a row to the table in tests/README.md"


def test_every_row_names_an_existing_module_and_existing_test_files() -> None:
    table = readme_map(README.read_text(encoding="utf-8"))
    assert sorted(table.keys() - set(package_modules())) == [], "modules that no longer exist"
    assert {m: tests for m, tests in table.items() if not tests} == {}, "every module names at least one test file"
    missing = sorted({t for tests in table.values() for t in tests if not (TESTS / t).is_file()})
    assert missing == []


def test_the_table_reader_and_the_derivation_agree_on_a_known_module() -> None:
    # The reader takes rows in the README's format; the derivation finds a test named after its module.
    table = readme_map("intro\n\n| module | tests |\n|---|---|\n| `store/tokens.py` | `a.py`, `b/c.py` |\n\nafter\n")
    assert table == {"store/tokens.py": ["a.py", "b/c.py"]}
    assert "integration/test_tokens.py" in derived_map()["store/tokens.py"]


if __name__ == "__main__":
    print(markdown(derived_map()))
