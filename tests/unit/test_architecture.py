"""The layers of docs/architecture.md, read from its table: each module imports only from its own layer and
those below, every module of the package is in the table, and every name in the table exists."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "haystack_osa_memory"
DOC = REPO / "docs" / "architecture.md"

HEADER = ("layer", "modules", "job")
#: ``name`` or ``name (beside other)``: a layer at the height of ``other`` that neither imports nor is imported by it.
LAYER_CELL = re.compile(r"(?P<name>[a-z][a-z0-9_-]*)(?:\s*\(beside\s+(?P<beside>[a-z][a-z0-9_-]*)\))?")
#: A backticked name in the modules column: ``errors``, a folder ``store/``, or a parenthesis.
TOKEN = re.compile(r"`(?P<name>[A-Za-z_][A-Za-z0-9_]*/?)`|(?P<paren>[()])")


@dataclass
class Layer:
    name: str
    rank: int
    entries: dict[str, list[str] | None] = field(default_factory=dict)  # top-level name -> listed members


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def _entries(cell: str) -> dict[str, list[str] | None]:
    """The modules column: top-level names, each folder with the members listed in the parentheses after it
    (None when it lists none: the folder then covers all its files)."""
    entries: dict[str, list[str] | None] = {}
    depth = 0
    last: str | None = None
    for match in TOKEN.finditer(cell):
        if match["paren"] == "(":
            depth += 1
        elif match["paren"] == ")":
            depth -= 1
        elif depth == 0:
            last = match["name"]
            assert last not in entries, f"{last} twice in one row"
            entries[last] = None
        else:
            assert last is not None, f"members {match['name']} follow no folder in {cell!r}"
            assert last.endswith("/"), f"members {match['name']} follow {last}, not a folder, in {cell!r}"
            members = entries[last]
            entries[last] = [*(members or []), match["name"]]
    return entries


def parse_layers(text: str) -> list[Layer]:
    """The layer table of architecture.md (header ``| layer | modules | job |``), lowest layer first. Rows of
    the same layer name add to that layer; ``x (beside y)`` shares y's rank."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if tuple(_cells(line)[:3]) == HEADER)
    layers: dict[str, Layer] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        assert len(cells) >= 3, f"a row of the layer table needs layer | modules | job: {line!r}"
        head = LAYER_CELL.fullmatch(cells[0])
        assert head is not None, f"layer cell {cells[0]!r}: 'name' or 'name (beside other)'"
        name = head["name"]
        if name not in layers:
            beside = head["beside"]
            if beside is not None:
                assert beside in layers, f"{name} is beside {beside}, which must come first"
                rank = layers[beside].rank
            else:
                rank = max((layer.rank for layer in layers.values()), default=-1) + 1
            layers[name] = Layer(name, rank)
        for entry, members in _entries(cells[1]).items():
            assert entry not in layers[name].entries, f"{entry} twice in layer {name}"
            layers[name].entries[entry] = members
    return list(layers.values())


LAYERS = parse_layers(DOC.read_text(encoding="utf-8"))
#: Top-level name under the package (``errors``, ``store``) -> its layer.
LAYER_OF = {entry.rstrip("/"): layer for layer in LAYERS for entry in layer.entries}


def _layer(module: str) -> Layer | None:
    parts = module.split(".")
    if parts[0] != "haystack_osa_memory" or len(parts) < 2:
        return None  # the package itself: its __init__ is the lazy public API, above every layer
    return LAYER_OF.get(parts[1])


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


def _may_import(own: Layer, target: Layer | None) -> bool:
    """Its own layer, or one lower; a layer beside it (same rank, another name) is out of bounds."""
    return target is not None and (target is own or target.rank < own.rank)


def test_every_module_has_a_layer() -> None:
    assert [m for m, _ in _modules() if m != "haystack_osa_memory" and _layer(m) is None] == []


def test_every_module_of_a_folder_that_lists_its_modules_is_listed() -> None:
    missing = []
    for module, _ in _modules():
        parts = module.split(".")
        if len(parts) < 3 or parts[-1] == "__main__":
            continue
        layer = _layer(module)
        members = layer.entries.get(parts[1] + "/") if layer else None
        if members is not None and parts[2] not in {m.rstrip("/") for m in members}:
            missing.append(module)
    assert missing == [], f"add them to the folder's list in docs/architecture.md: {missing}"


def test_every_name_in_the_table_exists() -> None:
    stale = []
    for layer in LAYERS:
        for entry, members in layer.entries.items():
            folder = entry.endswith("/")
            target = PACKAGE / entry.rstrip("/")
            if not (target.is_dir() if folder else target.with_suffix(".py").is_file()):
                stale.append(entry)
            for member in members or []:
                path = target / member.rstrip("/")
                if not (path.is_dir() or path.with_suffix(".py").is_file()):
                    stale.append(f"{entry}{member}")
    assert stale == []


def test_each_name_has_one_layer() -> None:
    names = [entry.rstrip("/") for layer in LAYERS for entry in layer.entries]
    assert sorted({n for n in names if names.count(n) > 1}) == []


@pytest.mark.parametrize(("module", "path"), _modules(), ids=[m for m, _ in _modules()])
def test_imports_only_its_layer_and_below(module: str, path: Path) -> None:
    own = _layer(module)
    if own is None:
        return
    upward = sorted(name for name in _imports(path) if not _may_import(own, _layer(name)))
    assert upward == [], f"{module} ({own.name}) imports from a higher layer or one beside it: {upward}"


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from haystack_osa_memory.memory import Memory\n", encoding="utf-8")
    assert _imports(bad) == {"haystack_osa_memory.memory"}
    store = _layer("haystack_osa_memory.store.facts")
    assert store is not None
    assert not _may_import(store, _layer("haystack_osa_memory.memory"))
    assert not _may_import(LAYER_OF["mcp"], LAYER_OF["console"])  # beside: neither way
    assert not _may_import(LAYER_OF["console"], LAYER_OF["mcp"])


def test_the_table_reader_takes_rows_added_in_the_same_format() -> None:
    table = "\n".join(
        [
            "| layer | modules | job |",
            "|---|---|---|",
            "| base | `errors`, `privacy/` (`redaction`, `gate`) | rules |",
            "| settings | `settings` | a new row |",
            "| store | `store/` (`database`, `schema`) | SQL |",
            "| base | `time_phrases` | a second row of base |",
            "| ui (beside store) | `console/` | pages |",
            "",
            "| other | table |",
        ]
    )
    layers = {layer.name: layer for layer in parse_layers(table)}
    assert [(n, layer.rank) for n, layer in layers.items()] == [("base", 0), ("settings", 1), ("store", 2), ("ui", 2)]
    assert layers["base"].entries == {"errors": None, "privacy/": ["redaction", "gate"], "time_phrases": None}
    assert layers["store"].entries == {"store/": ["database", "schema"]}
    assert layers["ui"].entries == {"console/": None}
