"""No library module writes the process environment: only our own processes (the command line, the
server) may. The behaviour itself is tested in tests/integration/test_no_env_mutation.py."""

from __future__ import annotations

import ast

from tests.conftest import REPO

PACKAGE = REPO / "haystack_osa_memory"

#: Modules that may write the process environment, and why: the command line and the server are our own
#: processes; `scratch_database` is the throwaway database of tests and benchmarks, documented to export it.
MAY_WRITE = {
    "cli/main.py": "the `osa-memory` process",
    "cli/serve.py": "the `serve` process, for the tools it loads and its worker processes",
    "mcp/metrics.py": "the `serve` process's metrics folder",
    "store/database.py": "scratch_database and resolve_connection_string(export=True), for the command line",
}


def _writes_environment(tree: ast.AST) -> list[int]:
    """Lines that assign to, delete from or mutate ``os.environ``, or call ``os.putenv``/``os.unsetenv``."""
    lines = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            target = next((t.value for t in targets if isinstance(t, ast.Subscript)), None)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("setdefault", "update", "pop", "popitem", "clear", "__setitem__"):
                target = node.func.value
            elif node.func.attr in ("putenv", "unsetenv") and ast.unparse(node.func.value) in ("os", "_os"):
                lines.append(node.lineno)
        if target is not None and ast.unparse(target) in ("os.environ", "_os.environ"):
            lines.append(node.lineno)
    return lines


def test_only_our_own_processes_write_the_environment() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        lines = _writes_environment(ast.parse(path.read_text(encoding="utf-8")))
        if lines and relative not in MAY_WRITE:
            found[relative] = lines
    assert found == {}
