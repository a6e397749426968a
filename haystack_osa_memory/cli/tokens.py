"""`osa-memory token`: create, revoke and list access tokens."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from haystack_osa_memory.cli.common import DataDir, JsonFlag, emit, err, fail, load_config, open_store, or_fail, out

app = typer.Typer(
    help="Create, list and revoke access tokens (each bound to one org and assignment).", no_args_is_help=True
)


@app.command("create")
def token_create(
    org: Annotated[str, typer.Option("--org", help="Org the token acts for.")],
    assignment: Annotated[
        list[str] | None,
        typer.Option("--assignment", help="Assignment the token may use; repeat to grant several (agent tokens)."),
    ] = None,
    specialist: Annotated[str | None, typer.Option("--specialist", help="Specialist id, recorded on facts.")] = None,
    expires_in: Annotated[str | None, typer.Option("--expires-in", help="Lifetime such as 30m, 8h, 7d.")] = None,
    role: Annotated[
        str,
        typer.Option(
            "--role", help="agent (acts over MCP), reviewer (review console) or admin (console, switches, tokens)."
        ),
    ] = "agent",
    name: Annotated[str | None, typer.Option("--name", help="The person a reviewer or admin token is for.")] = None,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a token; it is printed once (only its hash is stored).

    Agent tokens (the default) need `--assignment` (the first is the default). Reviewer and admin tokens
    name a person (`--name`) of one org, sign in to `osa-memory console` only and are refused on `/mcp`.
    """
    from haystack_osa_memory.store.tokens import AGENT, ROLES, parse_duration

    if role not in ROLES:
        fail(f"role {role!r} is not allowed: use one of {', '.join(ROLES)}")
    if role == AGENT and not assignment:
        fail("an agent token needs at least one --assignment")
    if role != AGENT and (assignment or specialist):
        fail(f"a {role} token acts on a whole org in the console: drop --assignment and --specialist")
    if role != AGENT and not name:
        fail(f"a {role} token names its person: add --name (e.g. --name 'Ana Silva')")
    config = load_config(data_dir)
    with or_fail():
        lifetime = parse_duration(expires_in) if expires_in else None
    with or_fail(), open_store(config) as store:
        tokens = store.tokens
        if role != AGENT:
            person = tokens.create_person(org_id=org, role=role, name=name or "", expires_in=lifetime)
            token_id, token, expires_at = person.token_id, person.token, person.expires_at
            grants: list[str] = []
        else:
            assert assignment
            issued = tokens.create(
                org_id=org,
                assignment_id=assignment[0],
                specialist_id=specialist,
                expires_in=lifetime,
                extra_assignments=assignment[1:],
            )
            token_id, token, expires_at = issued.token_id, issued.token, issued.expires_at
            grants = list(issued.caller.grants)
    data = {
        "token_id": token_id,
        "token": token,
        "org": org,
        "role": role,
        "assignment": grants[0] if grants else None,
        "assignments": grants,
        "specialist": specialist,
        "name": name if role != AGENT else None,
        "expires_at": expires_at.isoformat() if expires_at else None,
    }
    if as_json:
        emit(data, True)
        return
    out.print(token, highlight=False, soft_wrap=True)
    expiry = f"expires {expires_at.isoformat()}" if expires_at else "no expiry"
    scope = f"assignment(s) {', '.join(grants)}" if grants else f"the review console as {role}"
    err.print(
        f"token id {token_id} for org {org}, {scope}, {expiry}. Store it now: it is not shown again.",
        highlight=False,
    )


@app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(help="The token id printed by `token create`.")],
    data_dir: DataDir = None,
) -> None:
    """Revoke a token: from now on it gets HTTP 401."""
    config = load_config(data_dir)
    with or_fail(), open_store(config) as store:
        found = store.tokens.revoke(token_id)
    if not found:
        fail(f"no token with id {token_id}: list them with `osa-memory token list`")
    out.print(f"revoked {token_id}")


@app.command("list")
def token_list(data_dir: DataDir = None, as_json: JsonFlag = False) -> None:
    """List tokens (ids, scopes, expiry; never secrets)."""
    config = load_config(data_dir)
    with or_fail(), open_store(config) as store:
        rows = store.tokens.list()
    if as_json:
        emit(rows, True)
        return
    table = Table("token id", "role", "org", "assignments / name", "specialist", "expires", "revoked")
    for r in rows:
        table.add_row(
            r["token_id"],
            r["role"],
            r["org_id"],
            ", ".join(r["assignments"]) or (r["name"] or ""),
            r["specialist_id"] or "",
            str(r["expires_at"] or ""),
            str(r["revoked_at"] or ""),
        )
    out.print(table)
