"""Small helpers shared by the notebooks (not part of the package).

`table(rows)` shows a list of dicts (or tuples plus column names) as an HTML table in Jupyter and
as aligned plain text everywhere else (CI logs, a terminal).

Run as a script, it strips the outputs of notebooks before a commit (tests/test_notebooks.py checks):

    .venv/bin/python notebooks/_helpers.py notebooks/*.ipynb
"""

from __future__ import annotations

import html
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def short(value: Any, width: int = 48) -> str:
    """One line of text, cut to ``width`` characters with an ellipsis; line breaks shown as ``⏎``."""
    text = "" if value is None else str(value)
    text = text.replace("\r\n", "\n").replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


class Table:
    """Rows displayed as a table; build it with :func:`table`."""

    def __init__(self, columns: list[str], rows: list[list[str]]) -> None:
        self.columns = columns
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'><code>{html.escape(v)}</code></td>" for v in row) + "</tr>"
            for row in self.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def __repr__(self) -> str:
        widths = [max([len(c)] + [len(r[i]) for r in self.rows]) for i, c in enumerate(self.columns)]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True)),
            "  ".join("-" * w for w in widths),
        ]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in self.rows]
        return "\n".join(lines) if self.rows else "\n".join(lines) + "\n(no rows)"


def table(
    rows: Iterable[Mapping[str, Any] | Sequence[Any]],
    columns: Sequence[str] | None = None,
    *,
    width: int = 48,
) -> Table:
    """A displayable table.

    :param rows: dicts (``columns`` picks and orders the keys; default: the keys of the first row)
        or tuples (then ``columns`` names them, e.g. ``[d.name for d in cursor.description]``).
    :param columns: Column names.
    :param width: Longer values are cut to this many characters.
    """
    rows = list(rows)
    if columns is None:
        first = rows[0] if rows else {}
        if not isinstance(first, Mapping):
            msg = "rows that are not dicts need column names"
            raise ValueError(msg)
        columns = list(first)
    cells = []
    for row in rows:
        values = [row.get(c) for c in columns] if isinstance(row, Mapping) else list(row)
        cells.append([short(v, width) for v in values])
    return Table(list(columns), cells)


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def strip_outputs(paths: Iterable[str]) -> None:
    """Remove outputs, execution counts and execution timings from notebooks, in place."""
    import nbformat

    for path in paths:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = []
                cell.execution_count = None
            cell.metadata.pop("execution", None)
        nbformat.write(nb, path)
        print(f"stripped {path}")


if __name__ == "__main__":
    import sys

    strip_outputs(sys.argv[1:])
