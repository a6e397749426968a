"""`osa-memory store`, `recall`, `history`, `audit` and `reflect`: an operator's work on an assignment's facts."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.cli.common import (
    DataDir,
    JsonFlag,
    connect,
    emit,
    err,
    fail,
    load_config,
    open_lifecycle,
    open_memory,
    operator_actor,
    or_fail,
    out,
)


def store(
    fact: Annotated[str, typer.Argument(help="The fact, 1 to 2000 characters.")],
    org: Annotated[str, typer.Option("--org")],
    assignment: Annotated[str, typer.Option("--assignment")],
    topic: Annotated[str | None, typer.Option("--topic")] = None,
    specialist: Annotated[str | None, typer.Option("--specialist")] = None,
    supersedes: Annotated[
        list[str] | None, typer.Option("--supersedes", help="Id of a fact this one replaces (repeatable).")
    ] = None,
    valid_from: Annotated[str | None, typer.Option("--valid-from", help="ISO 8601; default now.")] = None,
    valid_to: Annotated[str | None, typer.Option("--valid-to", help="ISO 8601; default until replaced.")] = None,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Store a fact in an assignment's memory (operator access: no token needed)."""
    config = load_config(data_dir)
    with or_fail():
        caller = Caller(org_id=org, assignment_id=assignment, specialist_id=specialist)
        result = open_memory(config).store(
            fact, topic, caller=caller, supersedes=supersedes, valid_from=valid_from, valid_to=valid_to
        )
    if as_json:
        emit(result, True)
        return
    out.print(f"stored {result['document_id']} in {result['assignment_id']}")
    for doc_id in result.get("superseded") or []:
        out.print(f"superseded {doc_id}")
    for possible in result.get("possibly_supersedes") or []:
        out.print(f"possibly supersedes {possible['document_id']}: {possible['content']}", highlight=False)


def recall(
    query: Annotated[str, typer.Argument(help="What to recall, 1 to 1000 characters.")],
    org: Annotated[str, typer.Option("--org")],
    assignment: Annotated[str, typer.Option("--assignment")],
    limit: Annotated[int, typer.Option("--limit", help="1 to 20.")] = 8,
    as_of: Annotated[str | None, typer.Option("--as-of", help="The facts valid then (ISO 8601).")] = None,
    include_superseded: Annotated[
        bool, typer.Option("--include-superseded", help="Also facts that no longer hold (history).")
    ] = False,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Recall an assignment's facts, best first."""
    config = load_config(data_dir)
    with or_fail():
        result = open_memory(config).recall(
            query,
            limit,
            caller=Caller(org_id=org, assignment_id=assignment),
            as_of=as_of,
            include_superseded=include_superseded,
        )
    if as_json:
        emit(result, True)
        return
    if result.get("degraded"):
        err.print(f"degraded: {result['degraded']}", highlight=False)
    table = Table("score", "topic", "fact", "valid from", "valid to")
    for f in result["facts"]:
        until = (f.get("valid_to") or "")[:19]
        if f.get("superseded_by"):
            until += f" (superseded by {f['superseded_by'][:12]})"
        valid_from = (f.get("valid_from") or f["stored_at"])[:19]
        table.add_row(f"{f['score']:.4f}", f["topic"] or "", f["content"], valid_from, until)
    out.print(table)


def history(
    document_id: Annotated[str, typer.Argument(help="A fact's id (any version of it).")],
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Print a fact's history: every version linked by supersession, oldest first, with its validity."""
    from haystack_osa_memory.errors import NotFoundError
    from haystack_osa_memory.validation import check_document_id

    config = load_config(data_dir)
    with or_fail():
        check_document_id(document_id)
        with open_lifecycle(config) as lifecycle:
            scope = lifecycle.find_scope(document_id)
            if scope is None:
                raise NotFoundError(f"no fact {document_id}")
            versions = lifecycle.chain(scope, document_id)
    if as_json:
        emit({"org_id": scope.org_id, "assignment_id": scope.assignment_id, "versions": versions}, True)
        return
    out.print(f"{scope.org_id} / {scope.assignment_id}: {len(versions)} version(s)", highlight=False)
    table = Table("valid from", "valid to", "status", "document id", "fact")
    for v in versions:
        marker = " *" if v["document_id"] == document_id else ""
        table.add_row(
            v["valid_from"][:19], (v["valid_to"] or "")[:19], v["status"], v["document_id"] + marker, v["content"] or ""
        )
    out.print(table)


def audit(
    assignment: Annotated[str | None, typer.Option("--assignment", help="Only this assignment.")] = None,
    org: Annotated[str | None, typer.Option("--org", help="Only this org.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100000)] = 1000,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Print the audit log: who changed what, when, on which fact."""
    config = load_config(data_dir)
    with or_fail(), open_lifecycle(config) as lifecycle:
        rows = lifecycle.audit(org_id=org, assignment_id=assignment, limit=limit)
    if as_json:
        emit(rows, True)
        return
    table = Table("at", "actor", "action", "org", "assignment", "document", "details")
    for r in rows:
        table.add_row(
            str(r["at"])[:19],
            r["actor"],
            r["action"],
            r["org_id"] or "",
            r["assignment_id"] or "",
            (r["document_id"] or "")[:12],
            json.dumps(r["details"], default=str),
        )
    out.print(table)


def reflect(
    assignment: Annotated[str | None, typer.Option("--assignment", help="Only this assignment.")] = None,
    org: Annotated[str | None, typer.Option("--org", help="Org of --assignment (required with it).")] = None,
    all_scopes: Annotated[bool, typer.Option("--all", help="Every assignment that has facts.")] = False,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Consolidate repeated facts into observations (idempotent; cron-friendly)."""
    from haystack_osa_memory.memory import Memory

    if all_scopes == (assignment is not None):
        fail("give exactly one of --assignment ASSIGNMENT --org ORG, or --all")
    if assignment is not None and org is None:
        fail("--assignment needs --org: assignment ids are unique within an org")
    config = load_config(data_dir)
    connect(config)
    memory = Memory(config)
    with or_fail():
        memory.warm_up()
        assert memory.lifecycle is not None
        scopes = memory.lifecycle.reflect_scopes() if all_scopes else []
        targets = [(s.org_id, s.assignment_id) for s in scopes] if all_scopes else [(str(org), str(assignment))]
        reports = [
            memory.reflect(caller=Caller(org_id=o, assignment_id=a, token_id=operator_actor())) for o, a in targets
        ]
    if as_json:
        emit(reports, True)
        return
    for r in reports:
        out.print(
            f"{r['org_id']}/{r['assignment_id']}: {r['groups']} groups, "
            f"{len(r['observations_created'])} observations created, {len(r['observations_updated'])} updated, "
            f"{r['facts_consolidated']} facts consolidated",
            highlight=False,
        )
    if not reports:
        out.print("no assignment has facts")
