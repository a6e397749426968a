"""`osa-memory review`: decide on proposed and flagged facts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from haystack_osa_memory.cli.common import (
    DataDir,
    JsonFlag,
    emit,
    load_config,
    open_lifecycle,
    operator_actor,
    or_fail,
    out,
)

app = typer.Typer(help="Review proposed and flagged facts.", no_args_is_help=True)


@app.command("list")
def review_list(
    org: Annotated[str | None, typer.Option("--org", help="Only this org.")] = None,
    assignment: Annotated[str | None, typer.Option("--assignment", help="Only this assignment.")] = None,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """List proposed and flagged facts waiting for a decision."""
    config = load_config(data_dir)
    with or_fail(), open_lifecycle(config) as lifecycle:
        rows = lifecycle.review_list(org, assignment)
    if as_json:
        emit(rows, True)
        return
    table = Table("document id", "org", "assignment", "status", "kind", "fact")
    for r in rows:
        table.add_row(r["document_id"], r["org_id"], r["assignment_id"], r["status"], r["kind"] or "fact", r["content"])
    out.print(table)


def _review(document_id: str, accept: bool, note: str | None, data_dir: Path | None, as_json: bool) -> None:
    config = load_config(data_dir)
    with or_fail(), open_lifecycle(config) as lifecycle:
        result = lifecycle.review(document_id, accept=accept, actor=operator_actor(), note=note)
    if as_json:
        emit(result, True)
    else:
        out.print(f"{document_id}: {result['previous_status']} -> {result['status']}")


@app.command("accept")
def review_accept(
    document_id: Annotated[str, typer.Argument(help="Id from `review list`.")],
    note: Annotated[str | None, typer.Option("--note", help="Why (kept in the audit).")] = None,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Accept a proposed or flagged fact: recall returns it again."""
    _review(document_id, True, note, data_dir, as_json)


@app.command("reject")
def review_reject(
    document_id: Annotated[str, typer.Argument(help="Id from `review list`.")],
    note: Annotated[str | None, typer.Option("--note", help="Why (kept in the audit).")] = None,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Reject a proposed or flagged fact: recall never returns it."""
    _review(document_id, False, note, data_dir, as_json)
