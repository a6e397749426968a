"""`osa-memory assignment` and `osa-memory org`: the kill switches."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from haystack_osa_memory.cli.common import DataDir, load_config, open_lifecycle, operator_actor, or_fail, out

assignment_app = typer.Typer(help="Kill switch for one assignment.", no_args_is_help=True)
org_app = typer.Typer(help="Kill switch for a whole org.", no_args_is_help=True)


def _switch(org: str, assignment: str, enabled: bool, reason: str | None, data_dir: Path | None) -> None:
    from haystack_osa_memory.markers import check_identifier
    from haystack_osa_memory.store.lifecycle import WILDCARD

    config = load_config(data_dir)
    with or_fail():
        for value, what in ((org, "org"), (assignment, "assignment")):
            if value != WILDCARD:
                check_identifier(value, what)
        with open_lifecycle(config) as lifecycle:
            lifecycle.set_switch(org, assignment, enabled=enabled, actor=operator_actor(), reason=reason)
    scope = f"org {org}" if assignment == WILDCARD else f"assignment {assignment} (org {org})"
    out.print(f"memory {'on' if enabled else 'off'} for {scope}")


@assignment_app.command("disable")
def assignment_disable(
    assignment: Annotated[str, typer.Argument(help="Assignment id.")],
    org: Annotated[str, typer.Option("--org", help="Org of the assignment (default: every org).")] = "*",
    reason: Annotated[str | None, typer.Option("--reason")] = None,
    data_dir: DataDir = None,
) -> None:
    """Turn memory off for an assignment: every tool refuses and nothing is written."""
    _switch(org, assignment, False, reason, data_dir)


@assignment_app.command("enable")
def assignment_enable(
    assignment: Annotated[str, typer.Argument(help="Assignment id.")],
    org: Annotated[str, typer.Option("--org", help="Org of the assignment (default: every org).")] = "*",
    data_dir: DataDir = None,
) -> None:
    """Turn memory back on for an assignment (nothing was lost)."""
    _switch(org, assignment, True, None, data_dir)


@org_app.command("disable")
def org_disable(
    org: Annotated[str, typer.Argument(help="Org id.")],
    reason: Annotated[str | None, typer.Option("--reason")] = None,
    data_dir: DataDir = None,
) -> None:
    """Turn memory off for every assignment of an org."""
    _switch(org, "*", False, reason, data_dir)


@org_app.command("enable")
def org_enable(org: Annotated[str, typer.Argument(help="Org id.")], data_dir: DataDir = None) -> None:
    """Turn memory back on for an org."""
    _switch(org, "*", True, None, data_dir)
