"""The settings reference of docs/configuration.md, written from `MemoryConfig` (its fields' variables,
defaults and descriptions): the page's text between `BEGIN` and `END` is generated, the rest is prose.

``python -m haystack_osa_memory.config_docs`` prints the section; ``--write`` puts it into the page.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic.fields import FieldInfo

from haystack_osa_memory.config import SHOWN_DEFAULT_KEY, MemoryConfig, variable_of

BEGIN = "<!-- generated:settings (python -m haystack_osa_memory.config_docs --write) -->"
END = "<!-- /generated:settings -->"
#: The page in a source checkout.
PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def shown_default(field: FieldInfo) -> str:
    """A field's default as the reference shows it."""
    extra = field.json_schema_extra
    shown = extra.get(SHOWN_DEFAULT_KEY) if isinstance(extra, dict) else None
    if isinstance(shown, str):
        return shown
    value = field.get_default(call_default_factory=False)
    if value is None:
        return "unset"
    if value == ():
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, tuple):
        return f"`{value!r}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def configuration_markdown() -> str:
    """The generated section: one row per environment variable, then the settings only Python sets."""
    rows = ["| variable | setting | default | meaning |", "|---|---|---|---|"]
    python_only = []
    for name, field in MemoryConfig.model_fields.items():
        description = _cell(field.description or "")
        variable = variable_of(field)
        if variable is None:
            python_only.append(f"`{name}` ({description[:1].lower()}{description[1:]}, default {shown_default(field)})")
        else:
            rows.append(f"| `{variable}` | `{name}` | {_cell(shown_default(field))} | {description} |")
    lines = [BEGIN, *rows]
    if python_only:
        lines += ["", f"Settings only available in Python: {'; '.join(python_only)}."]
    return "\n".join([*lines, END])


def with_generated_section(page: str) -> str:
    """``page`` with its generated section replaced by `configuration_markdown`.

    :raises ValueError: the page lacks the markers.
    """
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        msg = f"the page has no generated section ({BEGIN} ... {END})"
        raise ValueError(msg)
    return page[:start] + configuration_markdown() + page[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    """Print the section, or with ``--write`` put it into docs/configuration.md (or ``--page``)."""
    parser = argparse.ArgumentParser(prog="python -m haystack_osa_memory.config_docs", description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the page's generated section")
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page (default: {PAGE})")
    args = parser.parse_args(argv)
    if not args.write:
        sys.stdout.write(configuration_markdown() + "\n")
        return 0
    page: Path = args.page
    page.write_text(with_generated_section(page.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
