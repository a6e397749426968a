"""`osa-memory queue`: the facts the offline buffer set aside at replay, and queueing one again."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from haystack_osa_memory.cli.common import DataDir, JsonFlag, emit, fail, load_config, operator_actor, out

app = typer.Typer(
    help="The offline buffer: list the facts set aside at replay, and queue one again.", no_args_is_help=True
)


_QUEUE_ITEM_ID = "32 hexadecimal characters, as printed by `osa-memory queue rejected`"


@app.command("rejected")
def queue_rejected(
    org: Annotated[str | None, typer.Option("--org", help="Only this org.")] = None,
    assignment: Annotated[str | None, typer.Option("--assignment", help="Only this assignment.")] = None,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """List the buffered facts the replay set aside (token revoked or expired, or refused), with the reason.

    Reads the buffer's `.rejected` file (OSA_MEMORY_BUFFER); the database is not needed.
    """
    from haystack_osa_memory.durable_queue import DurableQueue

    config = load_config(data_dir)
    queue = DurableQueue(config.offline_buffer_path)
    items = queue.rejected() if queue.rejected_path.exists() else []
    rows = [
        {
            "id": i["id"],
            "org_id": i.get("org_id"),
            "assignment_id": i.get("assignment_id"),
            "token_id": i.get("token_id"),
            "queued_at": i.get("queued_at"),
            "rejected_at": i.get("rejected_at"),
            "reason": i.get("rejected_reason"),
            "topic": (i.get("meta") or {}).get("topic"),
            "fact": i.get("fact"),  # redacted before it was buffered
        }
        for i in items
        if (org is None or i.get("org_id") == org) and (assignment is None or i.get("assignment_id") == assignment)
    ]
    if as_json:
        emit(rows, True)
        return
    if not rows:
        out.print("no facts set aside", highlight=False)
        return
    table = Table("id", "org", "assignment", "token", "rejected at", "reason", "fact")
    for r in rows:
        table.add_row(
            r["id"], r["org_id"], r["assignment_id"], r["token_id"] or "-", r["rejected_at"], r["reason"], r["fact"]
        )
    out.print(table)


@app.command("retry")
def queue_retry(
    item_id: Annotated[str, typer.Argument(help="Item id from `queue rejected`.")],
    as_operator: Annotated[
        bool,
        typer.Option(
            "--as-operator",
            help="For an item set aside because its token is revoked or expired: store it without its token, "
            "vouched for by you (the audit shows a local actor).",
        ),
    ] = False,
    data_dir: DataDir = None,
) -> None:
    """Queue a fact set aside at replay again; the server's next call that reaches the database stores it
    (in its original org and assignment)."""
    import re

    from haystack_osa_memory.durable_queue import DurableQueue
    from haystack_osa_memory.offline import TOKEN_GONE

    if not re.fullmatch(r"[0-9a-f]{32}", item_id):
        fail(f"item id {item_id!r} is not allowed: {_QUEUE_ITEM_ID}")
    config = load_config(data_dir)
    queue = DurableQueue(config.offline_buffer_path)
    found = [i for i in (queue.rejected() if queue.rejected_path.exists() else []) if i["id"] == item_id]
    if not found:
        fail(f"no fact set aside with id {item_id}: `osa-memory queue rejected` lists them")
    item = found[0]
    token_id = item.get("token_id")
    token_gone = item.get("rejected_reason") == TOKEN_GONE and token_id is not None
    if token_gone and not as_operator:
        fail(
            f"item {item_id} was set aside because its token {token_id} is revoked or expired: queued as it is, "
            "it would be set aside again. Pass --as-operator to store it without its token, vouched for by you"
        )
    changes = {"token_id": None, "vouched_by": operator_actor(), "rejected_token_id": token_id} if as_operator else None
    queue.restore({item_id}, changes)
    scope = f"{item.get('org_id')}/{item.get('assignment_id')}"
    out.print(
        f"item {item_id} queued again for {scope}; stored by the next call that reaches the database",
        highlight=False,
    )
