"""`osa-memory init` (alias `upgrade`), `repair`, `import` and `export`: the schema and the facts in bulk."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.cli.common import (
    RLS_VISIBLE_WARNING,
    DataDir,
    JsonFlag,
    connect,
    emit,
    err,
    fail,
    load_config,
    open_memory,
    operator_actor,
    or_fail,
    out,
)
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import OsaMemoryError


def print_steps(report: Any) -> None:
    """The statements as a reviewable SQL script: a comment per migration, then per statement the table
    it touches (the team's own tables marked) and the lock it takes there."""
    heading = None
    for step in report.steps:
        if (step.version, step.purpose) != heading:
            heading = (step.version, step.purpose)
            label = f"migration {step.version}: {step.purpose}" if step.version else step.purpose
            out.print(f"\n-- {label}", highlight=False)
        where = f"{'TEAM TABLE ' if step.team_table else ''}{step.table}" if step.table else "no table"
        when = " (only if needed)" if step.conditional else ""
        out.print(f"-- {where}: lock {step.lock}{when}", highlight=False)
        out.print(step.statement.strip() + ";", highlight=False)


def init(
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print every statement it would run, with the lock each takes; run none.")
    ] = False,
    row_level_security: Annotated[
        bool | None,
        typer.Option(
            "--row-level-security/--no-row-level-security",
            help="Turn PostgreSQL row-level security for facts on (or off); default: leave it as it is.",
        ),
    ] = None,
    runtime_role: Annotated[
        str | None,
        typer.Option("--runtime-role", help="Grant this existing role the row rights `serve` needs (no DDL)."),
    ] = None,
    lock_timeout: Annotated[
        int, typer.Option("--lock-timeout", help="Milliseconds to wait for a table lock before giving up.", min=1)
    ] = 5000,
    console_role: Annotated[
        str | None,
        typer.Option("--console-role", help="Grant this existing role what `osa-memory console` needs (no DDL)."),
    ] = None,
) -> None:
    """Create or upgrade the schema: the only command that changes tables (alias: upgrade).

    Applies the pending migrations in order, each in its own transaction; `--dry-run` prints them first
    (statements on the team's chunk and governing tables are marked, with their locks).
    """
    from haystack_osa_memory.store.database import resolve_connection_string
    from haystack_osa_memory.store.schema import ensure_schema

    config = load_config(data_dir)
    if runtime_role is not None and not runtime_role.replace("_", "a").isalnum():
        fail(f"runtime role {runtime_role!r} is not allowed: use letters, digits and '_'")
    if console_role is not None and not console_role.replace("_", "a").isalnum():
        fail(f"console role {console_role!r} is not allowed: use letters, digits and '_'")
    with or_fail():
        report = ensure_schema(
            resolve_connection_string(config),
            config,
            dry_run=dry_run,
            row_level_security=row_level_security,
            runtime_role=runtime_role,
            lock_timeout_ms=lock_timeout,
            console_role=console_role,
        )
        # Data an earlier version let into states the lifecycle forbids is repaired at every init.
        repaired = None if dry_run else run_repair(resolve_connection_string(config), config, dry_run=False)
    if as_json:
        emit({**report.as_dict(), **({"repair": repaired.as_dict()} if repaired else {})}, True)
        return
    if dry_run:
        print_steps(report)
        out.print(
            f"-- dry run: {len(report.steps)} statement(s) would run; schema version "
            f"{report.version_before} -> {report.version_after}",
            highlight=False,
        )
        return
    for name in report.created:
        out.print(f"created  {name}")
    for name in report.existing:
        out.print(f"kept     {name}")
    out.print(f"schema version {report.version_before} -> {report.version_after}")
    if repaired is not None and repaired.changed:
        print_repair(repaired)
    if runtime_role:
        out.print(f"granted  row rights to {runtime_role} (docs/operations.md)", highlight=False)
    if console_role:
        out.print(f"granted  console rights to {console_role} (docs/console.md)", highlight=False)
    if report.row_level_security:
        out.print("row-level security on: facts are visible only inside their scope", highlight=False)
    elif config.pg_conn_str:  # a team's database; the embedded default is ours alone
        err.print(f"note: {RLS_VISIBLE_WARNING}", highlight=False)


def run_repair(conn_str: str, config: MemoryConfig, *, dry_run: bool) -> Any:
    """The lifecycle repair (`store.repair`), then the other repairs of data an earlier version damaged."""
    from haystack_osa_memory.reflect import repair_observations
    from haystack_osa_memory.store.lifecycle import LifecycleRepository
    from haystack_osa_memory.store.repair import repair as repair_lifecycle

    report = repair_lifecycle(conn_str, config, actor=operator_actor(), dry_run=dry_run)
    lifecycle = LifecycleRepository(conn_str, config)
    report.observations_repaired = repair_observations(lifecycle, dry_run=dry_run, actor=operator_actor())
    return report


def print_repair(report: Any) -> None:
    verb = "would repair" if report.dry_run else "repaired"
    lines = {
        "proposals and flagged facts superseded by an agent, back in the review queue": report.back_to_review,
        "facts approved without a person's review, held again": report.approved_without_review,
        "forgotten facts reduced to their tombstone": report.tombstones,
        "supersession links to forgotten facts or loops removed": report.links_pruned,
        "recall rows recomputed without forgotten words": report.recall_rows_recomputed,
        "facts whose expires_at / valid_from / valid_to was not a timestamp, field removed": report.bad_time_fields,
    }
    for what, ids in lines.items():
        if ids:
            out.print(f"{verb} {len(ids):>5}  {what}", highlight=False)
    if report.observations_repaired:
        what = "observations made of facts that say different things, split back"
        out.print(f"{verb} {report.observations_repaired:>5}  {what}", highlight=False)
    if not report.changed:
        out.print("nothing to repair", highlight=False)


def repair(
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report what it would repair; change nothing.")] = False,
) -> None:
    """Repair facts an earlier version let around the governed lifecycle (also run by `init`; idempotent).

    Proposals and flagged facts superseded by an agent go back to the review queue; facts approved
    without a person's review are held again; forgotten facts keep only their tombstone; successors lose
    the words of forgotten predecessors; time fields an earlier import stored as given (not timestamps) are
    removed; observations reflect made of facts that say different things are split back. Every change is in
    the audit (action `repair`).
    """
    config = load_config(data_dir)
    conn_str = connect(config)
    with or_fail():
        report = run_repair(conn_str, config, dry_run=dry_run)
    if as_json:
        emit(report.as_dict(), True)
        return
    print_repair(report)


def import_(
    path: Annotated[Path, typer.Argument(help="A .jsonl or .csv file, or a folder of .md notes.")],
    org: Annotated[str, typer.Option("--org")],
    assignment: Annotated[str, typer.Option("--assignment")],
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, max=1000)] = 64,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Import facts (redacted, in batches, with a progress bar); re-running imports nothing new.

    An operator's action, not an agent's: statuses are restored as the file gives them (a backup made by
    `export` brings its proposed, flagged and rejected facts back as they were, without review). Each line is
    checked with the tools' limits, every field typed; bad lines are reported by number and the others
    imported (exit code 1 when any was bad). Facts that recall would never return (valid_to in the past
    without valid_from) are imported and listed as a warning.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from haystack_osa_memory.transfer import ImportItem, read_items

    if not path.exists():
        fail(f"{path} does not exist: give a .jsonl or .csv file, or a folder of .md notes")
    config = load_config(data_dir)
    with or_fail():
        caller = Caller(org_id=org, assignment_id=assignment, token_id=operator_actor())
        parsed = list(read_items(path))
    items = [i for i in parsed if isinstance(i, ImportItem)]
    invalid = [f"{origin}: {reason}" for origin, reason in (i for i in parsed if not isinstance(i, ImportItem))]
    memory = open_memory(config)
    columns = (TextColumn("importing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, disable=as_json or not err.is_terminal) as progress:
        task = progress.add_task("import", total=len(items))
        try:
            report = memory.import_items(
                items, caller=caller, batch_size=batch_size, on_batch=lambda n: progress.advance(task, n)
            )
        except OsaMemoryError as e:
            fail(f"{e} (already imported facts are kept; re-run to resume)")
    report.invalid[:0] = invalid  # lines refused while read, then facts refused while written
    report.read += len(invalid)
    data = report.as_dict()
    if as_json:
        emit(data, True)
    else:
        out.print(
            f"read {data['read']}, stored {data['stored']}, already there {data['skipped_existing']}, "
            f"invalid {data['invalid']}, never recalled {data['never_recalled']}",
            highlight=False,
        )
        for line in report.invalid[:10]:
            err.print(f"invalid: {line}", highlight=False, soft_wrap=True)
        for line in report.never_recalled[:10]:
            err.print(f"warning: {line}", highlight=False, soft_wrap=True)
    if report.invalid:
        raise typer.Exit(1)


def export(
    org: Annotated[str, typer.Option("--org")],
    assignment: Annotated[str, typer.Option("--assignment")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")] = None,
    data_dir: DataDir = None,
) -> None:
    """Export an assignment's facts as JSONL (what `import` reads back): a backup."""
    from haystack_osa_memory.transfer import export_line

    config = load_config(data_dir)
    with or_fail():
        caller = Caller(org_id=org, assignment_id=assignment, token_id=operator_actor())
        lines = [export_line(fact) for fact in open_memory(config).export(caller=caller)]
    text = "".join(line + "\n" for line in lines)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
        err.print(f"exported {len(lines)} facts to {output}", highlight=False)
