"""`osa-memory`: the command line of haystack-osa-memory (typer + rich).

Errors print one line (what, why, what to do) to stderr and exit with status 1 (2 for usage).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import OsaMemoryError

if TYPE_CHECKING:  # the store is imported by the commands that use it (start-up time)
    from haystack_osa_memory.store.facts import BufferFit

app = typer.Typer(
    name="osa-memory",
    help="Assignment-scoped agent memory in your Haystack + pgvector knowledge base, served over MCP.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
token_app = typer.Typer(
    help="Create, list and revoke access tokens (each bound to one org and assignment).", no_args_is_help=True
)
app.add_typer(token_app, name="token")
review_app = typer.Typer(help="Review proposed and flagged facts.", no_args_is_help=True)
app.add_typer(review_app, name="review")
assignment_app = typer.Typer(help="Kill switch for one assignment.", no_args_is_help=True)
app.add_typer(assignment_app, name="assignment")
org_app = typer.Typer(help="Kill switch for a whole org.", no_args_is_help=True)
app.add_typer(org_app, name="org")
queue_app = typer.Typer(
    help="The offline buffer: list the facts set aside at replay, and queue one again.", no_args_is_help=True
)
app.add_typer(queue_app, name="queue")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Embedded database folder (OSA_MEMORY_DATA_DIR); ignored when PG_CONN_STR is set."),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _fail(message: str) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@contextmanager
def _or_fail() -> Iterator[None]:
    """Turn our typed errors into the one-line error and exit status 1 of every command."""
    try:
        yield
    except OsaMemoryError as e:
        _fail(str(e))


def _config(data_dir: Path | None) -> MemoryConfig:
    if data_dir is not None:
        os.environ["OSA_MEMORY_DATA_DIR"] = str(data_dir)
    with _or_fail():
        return MemoryConfig.from_env()


def _connect(config: MemoryConfig) -> str:
    """Reach the database and check its schema version (no DDL: only `init` changes the schema)."""
    from haystack_osa_memory.errors import SchemaError
    from haystack_osa_memory.store.database import resolve_connection_string
    from haystack_osa_memory.store.schema import prepare_schema

    try:
        conn = resolve_connection_string(config, export=True)  # `serve`'s workers read it
        prepare_schema(conn, config)
    except SchemaError as e:
        _fail(str(e))
    except OsaMemoryError as e:
        _fail(f"{e} (check PG_CONN_STR, or unset it to use the embedded database)")
    except Exception as e:
        _fail(f"could not start or reach the database: {type(e).__name__}: {e}")
    return conn


def _emit(data: Any, as_json: bool) -> None:
    """Plain JSON on stdout (never coloured, even with FORCE_COLOR set)."""
    if as_json:
        sys.stdout.write(json.dumps(data, default=str, indent=2) + "\n")
        sys.stdout.flush()


RLS_VISIBLE_WARNING = (
    "row-level security is off: facts are visible to any pipeline or role that reads the chunk and "
    "governing tables without our filter (turn it on with `osa-memory init --row-level-security`)"
)


def _print_steps(report: Any) -> None:
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


@app.command()
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

    config = _config(data_dir)
    if runtime_role is not None and not runtime_role.replace("_", "a").isalnum():
        _fail(f"runtime role {runtime_role!r} is not allowed: use letters, digits and '_'")
    if console_role is not None and not console_role.replace("_", "a").isalnum():
        _fail(f"console role {console_role!r} is not allowed: use letters, digits and '_'")
    with _or_fail():
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
        repaired = None if dry_run else _repair(resolve_connection_string(config), config, dry_run=False)
    if as_json:
        _emit({**report.as_dict(), **({"repair": repaired.as_dict()} if repaired else {})}, True)
        return
    if dry_run:
        _print_steps(report)
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
        _print_repair(repaired)
    if runtime_role:
        out.print(f"granted  row rights to {runtime_role} (docs/operations.md)", highlight=False)
    if console_role:
        out.print(f"granted  console rights to {console_role} (docs/console.md)", highlight=False)
    if report.row_level_security:
        out.print("row-level security on: facts are visible only inside their scope", highlight=False)
    elif config.pg_conn_str:  # a team's database; the embedded default is ours alone
        err.print(f"note: {RLS_VISIBLE_WARNING}", highlight=False)


app.command("upgrade", help="Alias of init.")(init)


def _serve_metrics(host: str, metrics_port: int | None, port: int, config: MemoryConfig) -> Any:
    """`serve --metrics-port`: the Prometheus endpoint (haystack_osa_memory.mcp.metrics), or None when off."""
    if metrics_port is None:
        return None
    if metrics_port == port:
        _fail(f"--metrics-port {metrics_port} is also the MCP port; choose another port for the metrics")
    from haystack_osa_memory.mcp.metrics import serve_metrics

    try:
        endpoint = serve_metrics(host, metrics_port, config.offline_buffer_path)
    except OSError as e:
        _fail(f"could not serve metrics on {host}:{metrics_port}: {e.strerror or e} (choose another --metrics-port)")
    err.print(f"Prometheus metrics on {endpoint.url}", highlight=False)
    return endpoint


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 1417,
    pipelines_dir: Annotated[Path | None, typer.Option(help="Folder of pipeline wrappers (default: ours).")] = None,
    data_dir: DataDir = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve Prometheus metrics here at /metrics (same host; off by default).", min=1, max=65535),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=64, help="Worker processes (default: one per CPU, at most 4); 1: this process."),
    ] = None,
) -> None:
    """Serve the memory tools over MCP (streamable HTTP at /mcp) behind bearer-token auth.

    Ctrl-C or SIGTERM shut down gracefully and stop the embedded PostgreSQL this process started,
    unless another live process still uses it.
    """
    from contextlib import suppress

    import uvicorn

    from haystack_osa_memory.mcp.guard import start_database_guard, stop_database_guard
    from haystack_osa_memory.mcp.server import (
        PIPELINES_DIR_ENV,
        CachingVerifier,
        create_app,
        default_workers,
        exit_on_sigterm,
        install_log_scrubbing,
    )
    from haystack_osa_memory.store.database import stop_embedded
    from haystack_osa_memory.store.schema import check_schema
    from haystack_osa_memory.store.tokens import TokenStore

    exit_on_sigterm()  # before the database starts: a SIGTERM at any point must still stop it
    install_log_scrubbing(log_level)  # before anything logs: settings and database errors are scrubbed too
    metrics_endpoint = None
    guard = None
    try:
        config = _config(data_dir)
        # Before the app loads or any worker starts: they inherit the metrics folder it exports.
        metrics_endpoint = _serve_metrics(host, metrics_port, port, config)
        conn = _connect(config)
        if not config.pg_conn_str:
            guard = start_database_guard(config.data_dir)  # stops the embedded database if this process is killed
        processes = workers or default_workers()
        where = "PG_CONN_STR" if config.pg_conn_str else f"embedded PostgreSQL in {config.data_dir}"
        if processes > 1:
            # Each worker loads the tools itself (uvicorn app factory), reading the settings, the
            # exported PG_CONN_STR and the pipelines folder from the environment.
            if pipelines_dir is not None:
                os.environ[PIPELINES_DIR_ENV] = str(pipelines_dir.resolve())
            err.print(
                f"osa-memory MCP server on http://{host}:{port}/mcp ({processes} workers; data: {where})",
                highlight=False,
            )
            if config.pg_conn_str and not check_schema(conn, config).row_level_security:
                err.print(f"note: {RLS_VISIBLE_WARNING}", highlight=False)
            _serve_workers(host, port, log_level, processes)
            return
        tokens = TokenStore(conn, config)
        try:
            asgi = create_app(CachingVerifier(tokens, config.offline_grace), pipelines_dir)
        except Exception as e:
            _fail(f"the MCP tools could not be loaded: {type(e).__name__}: {e}")
        err.print(f"osa-memory MCP server on http://{host}:{port}/mcp (data: {where})", highlight=False)
        if config.pg_conn_str and not check_schema(conn, config).row_level_security:
            err.print(f"note: {RLS_VISIBLE_WARNING}", highlight=False)
        # uvicorn.Config sets up uvicorn's log handlers; the scrubber goes on them before anything is served.
        server = uvicorn.Server(uvicorn.Config(asgi, host=host, port=port, log_level=log_level))
        with suppress(KeyboardInterrupt):  # Ctrl-C after a graceful shutdown: a clean exit, as with uvicorn.run
            server.run()
        if not server.started:
            raise typer.Exit(3)  # as uvicorn.run: the server could not start (port in use, ...)
    finally:
        if metrics_endpoint is not None:
            metrics_endpoint.close()
        stop_embedded()
        if guard is not None:  # this process left the database cleanly: the guard has nothing to do
            stop_database_guard(guard)


def _serve_workers(host: str, port: int, log_level: str, processes: int) -> None:
    """uvicorn's supervisor: ``processes`` workers on one listening socket (the kernel spreads the
    connections); a dead worker is replaced, one that cannot load the tools stops the server (exit 3)."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    # The CPUs shared out between the workers' embedders (torch would give each one thread per CPU,
    # and workers embedding at once would then fight over the same cores).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    config = uvicorn.Config(
        "haystack_osa_memory.mcp.server:worker_app",
        factory=True,
        host=host,
        port=port,
        log_level=log_level,
        workers=processes,
    )
    try:
        sock = config.bind_socket()
    except SystemExit:
        raise typer.Exit(3) from None  # the address is taken (uvicorn logged it)

    class Supervisor(Multiprocess):
        terminated = False

        def handle_term(self) -> None:
            self.terminated = True
            super().handle_term()

    supervisor = Supervisor(config, sockets=[sock])
    try:
        supervisor.run()
    finally:
        sock.close()
    if any(p.process.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        raise typer.Exit(3)
    if supervisor.terminated:
        raise SystemExit(143)  # as with one process: SIGTERM ends with 128 + 15 (Ctrl-C with 0)


@token_app.command("create")
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
    from haystack_osa_memory.store.tokens import AGENT, ROLES, TokenStore, parse_duration

    if role not in ROLES:
        _fail(f"role {role!r} is not allowed: use one of {', '.join(ROLES)}")
    if role == AGENT and not assignment:
        _fail("an agent token needs at least one --assignment")
    if role != AGENT and (assignment or specialist):
        _fail(f"a {role} token acts on a whole org in the console: drop --assignment and --specialist")
    if role != AGENT and not name:
        _fail(f"a {role} token names its person: add --name (e.g. --name 'Ana Silva')")
    config = _config(data_dir)
    with _or_fail():
        lifetime = parse_duration(expires_in) if expires_in else None
        tokens = TokenStore(_connect(config), config)
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
        _emit(data, True)
        return
    out.print(token, highlight=False, soft_wrap=True)
    expiry = f"expires {expires_at.isoformat()}" if expires_at else "no expiry"
    scope = f"assignment(s) {', '.join(grants)}" if grants else f"the review console as {role}"
    err.print(
        f"token id {token_id} for org {org}, {scope}, {expiry}. Store it now: it is not shown again.",
        highlight=False,
    )


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(help="The token id printed by `token create`.")],
    data_dir: DataDir = None,
) -> None:
    """Revoke a token: from now on it gets HTTP 401."""
    from haystack_osa_memory.store.tokens import TokenStore

    config = _config(data_dir)
    with _or_fail():
        found = TokenStore(_connect(config), config).revoke(token_id)
    if not found:
        _fail(f"no token with id {token_id}: list them with `osa-memory token list`")
    out.print(f"revoked {token_id}")


@token_app.command("list")
def token_list(data_dir: DataDir = None, as_json: JsonFlag = False) -> None:
    """List tokens (ids, scopes, expiry; never secrets)."""
    from haystack_osa_memory.store.tokens import TokenStore

    config = _config(data_dir)
    with _or_fail():
        rows = TokenStore(_connect(config), config).list()
    if as_json:
        _emit(rows, True)
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


@app.command()
def console(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 1418,
    idle: Annotated[str, typer.Option("--idle", help="A session ends after this long without a request.")] = "30m",
    absolute: Annotated[str, typer.Option("--absolute", help="A session ends this long after sign-in.")] = "8h",
    secure_cookies: Annotated[
        bool, typer.Option("--secure-cookies", help="Mark the session cookie Secure (behind a TLS proxy).")
    ] = False,
    serve_status: Annotated[
        str | None,
        typer.Option("--serve-status", help="`osa-memory serve`'s status URL, for the health page."),
    ] = None,
    ssl_certfile: Annotated[Path | None, typer.Option(help="Serve over TLS with this certificate.")] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="The certificate's private key.")] = None,
    sso_header: Annotated[
        str | None, typer.Option("--sso-header", help="SSO proxy mode: the header naming the signed-in person.")
    ] = None,
    sso_proxy: Annotated[
        list[str] | None, typer.Option("--sso-proxy", help="The proxy's address; the header counts from it only.")
    ] = None,
    sso_map: Annotated[
        Path | None, typer.Option("--sso-map", help="JSON file: each person's login -> a reviewer or admin token id.")
    ] = None,
    data_dir: DataDir = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the review console (web pages for reviewers and admins; sign in with their token).

    Its own process and port: the agents' MCP endpoint serves no human UI. The database role comes from
    OSA_MEMORY_CONSOLE_PG_CONN_STR when set (`init --console-role`), else PG_CONN_STR.
    """
    from contextlib import suppress

    import uvicorn

    from haystack_osa_memory.console import ConsoleSettings, create_console_app
    from haystack_osa_memory.mcp.server import exit_on_sigterm, install_log_scrubbing
    from haystack_osa_memory.store.tokens import parse_duration

    exit_on_sigterm()
    install_log_scrubbing(log_level)
    config = _config(data_dir)
    people: dict[str, str] = {}
    if sso_header or sso_proxy or sso_map:
        if not (sso_header and sso_proxy and sso_map):
            _fail("SSO proxy mode needs all three: --sso-header, --sso-proxy (repeatable) and --sso-map")
        try:
            loaded = json.loads(sso_map.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            _fail(f"--sso-map {sso_map} could not be read as JSON: {e}")
        if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
            _fail('--sso-map must hold one JSON object: {"login": "token id", ...}')
        people = {str(k): v for k, v in loaded.items()}
    with _or_fail():
        settings = ConsoleSettings(
            idle=parse_duration(idle),
            absolute=parse_duration(absolute),
            secure_cookies=secure_cookies or ssl_certfile is not None,
            status_url=serve_status,
            sso_header=sso_header,
            sso_proxies=tuple(sso_proxy or ()),
            sso_people=people,
        )
    console_conn = os.environ.get("OSA_MEMORY_CONSOLE_PG_CONN_STR", "").strip()
    conn = console_conn or _connect(config)
    if console_conn:
        from haystack_osa_memory.store.schema import check_schema

        with _or_fail():
            check_schema(conn, config)
        # The assignment browser's search runs the recall pipeline, whose components connect through
        # PG_CONN_STR: in this process that is the console's role too.
        os.environ["PG_CONN_STR"] = console_conn
    app_ = create_console_app(conn, config, settings)
    scheme = "https" if ssl_certfile else "http"
    err.print(f"osa-memory review console on {scheme}://{host}:{port}/", highlight=False)
    # No access log: request lines carry fact ids and filters, and nothing of a console request needs it.
    server = uvicorn.Server(
        uvicorn.Config(
            app_,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
            ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None,
        )
    )
    with suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        raise typer.Exit(3)


def _memory(config: MemoryConfig) -> Any:
    from haystack_osa_memory.memory import Memory

    _connect(config)
    return Memory(config)


@app.command()
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
    config = _config(data_dir)
    with _or_fail():
        caller = Caller(org_id=org, assignment_id=assignment, specialist_id=specialist)
        result = _memory(config).store(
            fact, topic, caller=caller, supersedes=supersedes, valid_from=valid_from, valid_to=valid_to
        )
    if as_json:
        _emit(result, True)
        return
    out.print(f"stored {result['document_id']} in {result['assignment_id']}")
    for doc_id in result.get("superseded") or []:
        out.print(f"superseded {doc_id}")
    for possible in result.get("possibly_supersedes") or []:
        out.print(f"possibly supersedes {possible['document_id']}: {possible['content']}", highlight=False)


@app.command()
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
    config = _config(data_dir)
    with _or_fail():
        result = _memory(config).recall(
            query,
            limit,
            caller=Caller(org_id=org, assignment_id=assignment),
            as_of=as_of,
            include_superseded=include_superseded,
        )
    if as_json:
        _emit(result, True)
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


@app.command()
def status(data_dir: DataDir = None, as_json: JsonFlag = False) -> None:
    """Show where the data lives, the embedder, and counts."""
    from haystack_osa_memory import __version__
    from haystack_osa_memory.embedders import resolve_embedder_choice
    from haystack_osa_memory.store.facts import buffer_fit, count_facts
    from haystack_osa_memory.store.schema import check_schema

    config = _config(data_dir)
    conn = _connect(config)
    with _or_fail():
        rls = check_schema(conn, config).row_level_security
        counts = count_facts(conn, config)
        fit = buffer_fit(conn, config)
    data = {
        "version": __version__,
        "database": "PG_CONN_STR" if config.pg_conn_str else f"embedded ({config.data_dir})",
        "embedder": resolve_embedder_choice(config),
        "chunk_table": f"{config.kb_schema}.{config.chunk_table}",
        "governing_table": f"{config.kb_schema}.{config.governing_table}",
        "row_level_security": rls,
        **counts,
        "shared_buffers": fit.shared_buffers,
        "recall_rows_mb": round(fit.recall_rows_bytes / 2**20, 1),
    }
    if as_json:
        _emit(data, True)
        return
    for key, value in data.items():
        out.print(f"{key:>18}: {value}", highlight=False)
    if not rls and config.pg_conn_str:
        err.print(f"note: {RLS_VISIBLE_WARNING}", highlight=False)
    if not fit.fits:
        err.print(f"note: {buffers_note(fit)}", highlight=False)


def buffers_note(fit: BufferFit) -> str:
    """What `status` says when the recall rows outgrow the server's shared buffers."""
    return (
        f"the recall rows and their indexes ({fit.recall_rows_bytes / 2**20:.0f} MB) are bigger than shared_buffers "
        f"({fit.shared_buffers}): recall in big assignments reads pages from the operating system's cache "
        "(docs/operations.md, Sizing)"
    )


def _operator() -> str:
    """The audit actor of CLI commands: `cli:<login>`."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli:unknown"


def _lifecycle(config: MemoryConfig) -> Any:
    from haystack_osa_memory.store.lifecycle import LifecycleRepository

    return LifecycleRepository(_connect(config), config)


@review_app.command("list")
def review_list(
    org: Annotated[str | None, typer.Option("--org", help="Only this org.")] = None,
    assignment: Annotated[str | None, typer.Option("--assignment", help="Only this assignment.")] = None,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """List proposed and flagged facts waiting for a decision."""
    config = _config(data_dir)
    with _or_fail():
        rows = _lifecycle(config).review_list(org, assignment)
    if as_json:
        _emit(rows, True)
        return
    table = Table("document id", "org", "assignment", "status", "kind", "fact")
    for r in rows:
        table.add_row(r["document_id"], r["org_id"], r["assignment_id"], r["status"], r["kind"] or "fact", r["content"])
    out.print(table)


def _review(document_id: str, accept: bool, note: str | None, data_dir: Path | None, as_json: bool) -> None:
    config = _config(data_dir)
    with _or_fail():
        result = _lifecycle(config).review(document_id, accept=accept, actor=_operator(), note=note)
    if as_json:
        _emit(result, True)
    else:
        out.print(f"{document_id}: {result['previous_status']} -> {result['status']}")


@review_app.command("accept")
def review_accept(
    document_id: Annotated[str, typer.Argument(help="Id from `review list`.")],
    note: Annotated[str | None, typer.Option("--note", help="Why (kept in the audit).")] = None,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Accept a proposed or flagged fact: recall returns it again."""
    _review(document_id, True, note, data_dir, as_json)


@review_app.command("reject")
def review_reject(
    document_id: Annotated[str, typer.Argument(help="Id from `review list`.")],
    note: Annotated[str | None, typer.Option("--note", help="Why (kept in the audit).")] = None,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Reject a proposed or flagged fact: recall never returns it."""
    _review(document_id, False, note, data_dir, as_json)


def _switch(org: str, assignment: str, enabled: bool, reason: str | None, data_dir: Path | None) -> None:
    from haystack_osa_memory.markers import check_identifier
    from haystack_osa_memory.store.lifecycle import WILDCARD

    config = _config(data_dir)
    with _or_fail():
        for value, what in ((org, "org"), (assignment, "assignment")):
            if value != WILDCARD:
                check_identifier(value, what)
        _lifecycle(config).set_switch(org, assignment, enabled=enabled, actor=_operator(), reason=reason)
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


@app.command()
def history(
    document_id: Annotated[str, typer.Argument(help="A fact's id (any version of it).")],
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Print a fact's history: every version linked by supersession, oldest first, with its validity."""
    from haystack_osa_memory.errors import NotFoundError
    from haystack_osa_memory.validation import check_document_id

    config = _config(data_dir)
    with _or_fail():
        check_document_id(document_id)
        lifecycle = _lifecycle(config)
        scope = lifecycle.find_scope(document_id)
        if scope is None:
            raise NotFoundError(f"no fact {document_id}")
        versions = lifecycle.chain(scope, document_id)
    if as_json:
        _emit({"org_id": scope.org_id, "assignment_id": scope.assignment_id, "versions": versions}, True)
        return
    out.print(f"{scope.org_id} / {scope.assignment_id}: {len(versions)} version(s)", highlight=False)
    table = Table("valid from", "valid to", "status", "document id", "fact")
    for v in versions:
        marker = " *" if v["document_id"] == document_id else ""
        table.add_row(
            v["valid_from"][:19], (v["valid_to"] or "")[:19], v["status"], v["document_id"] + marker, v["content"] or ""
        )
    out.print(table)


@app.command()
def audit(
    assignment: Annotated[str | None, typer.Option("--assignment", help="Only this assignment.")] = None,
    org: Annotated[str | None, typer.Option("--org", help="Only this org.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100000)] = 1000,
    data_dir: DataDir = None,
    as_json: JsonFlag = False,
) -> None:
    """Print the audit log: who changed what, when, on which fact."""
    config = _config(data_dir)
    with _or_fail():
        rows = _lifecycle(config).audit(org_id=org, assignment_id=assignment, limit=limit)
    if as_json:
        _emit(rows, True)
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


@app.command()
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
        _fail("give exactly one of --assignment ASSIGNMENT --org ORG, or --all")
    if assignment is not None and org is None:
        _fail("--assignment needs --org: assignment ids are unique within an org")
    config = _config(data_dir)
    _connect(config)
    memory = Memory(config)
    with _or_fail():
        memory.warm_up()
        assert memory.lifecycle is not None
        scopes = memory.lifecycle.reflect_scopes() if all_scopes else []
        targets = [(s.org_id, s.assignment_id) for s in scopes] if all_scopes else [(str(org), str(assignment))]
        reports = [memory.reflect(caller=Caller(org_id=o, assignment_id=a, token_id=_operator())) for o, a in targets]
    if as_json:
        _emit(reports, True)
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


@app.command("import")
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
        _fail(f"{path} does not exist: give a .jsonl or .csv file, or a folder of .md notes")
    config = _config(data_dir)
    with _or_fail():
        caller = Caller(org_id=org, assignment_id=assignment, token_id=_operator())
        parsed = list(read_items(path))
    items = [i for i in parsed if isinstance(i, ImportItem)]
    invalid = [f"{origin}: {reason}" for origin, reason in (i for i in parsed if not isinstance(i, ImportItem))]
    memory = _memory(config)
    columns = (TextColumn("importing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, disable=as_json or not err.is_terminal) as progress:
        task = progress.add_task("import", total=len(items))
        try:
            report = memory.import_items(
                items, caller=caller, batch_size=batch_size, on_batch=lambda n: progress.advance(task, n)
            )
        except OsaMemoryError as e:
            _fail(f"{e} (already imported facts are kept; re-run to resume)")
    report.invalid[:0] = invalid  # lines refused while read, then facts refused while written
    report.read += len(invalid)
    data = report.as_dict()
    if as_json:
        _emit(data, True)
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


@app.command()
def export(
    org: Annotated[str, typer.Option("--org")],
    assignment: Annotated[str, typer.Option("--assignment")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (default: stdout).")] = None,
    data_dir: DataDir = None,
) -> None:
    """Export an assignment's facts as JSONL (what `import` reads back): a backup."""
    from haystack_osa_memory.transfer import export_line

    config = _config(data_dir)
    with _or_fail():
        caller = Caller(org_id=org, assignment_id=assignment, token_id=_operator())
        lines = [export_line(fact) for fact in _memory(config).export(caller=caller)]
    text = "".join(line + "\n" for line in lines)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
        err.print(f"exported {len(lines)} facts to {output}", highlight=False)


_QUEUE_ITEM_ID = "32 hexadecimal characters, as printed by `osa-memory queue rejected`"


@queue_app.command("rejected")
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

    config = _config(data_dir)
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
        _emit(rows, True)
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


@queue_app.command("retry")
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
        _fail(f"item id {item_id!r} is not allowed: {_QUEUE_ITEM_ID}")
    config = _config(data_dir)
    queue = DurableQueue(config.offline_buffer_path)
    found = [i for i in (queue.rejected() if queue.rejected_path.exists() else []) if i["id"] == item_id]
    if not found:
        _fail(f"no fact set aside with id {item_id}: `osa-memory queue rejected` lists them")
    item = found[0]
    token_id = item.get("token_id")
    token_gone = item.get("rejected_reason") == TOKEN_GONE and token_id is not None
    if token_gone and not as_operator:
        _fail(
            f"item {item_id} was set aside because its token {token_id} is revoked or expired: queued as it is, "
            "it would be set aside again. Pass --as-operator to store it without its token, vouched for by you"
        )
    changes = {"token_id": None, "vouched_by": _operator(), "rejected_token_id": token_id} if as_operator else None
    queue.restore({item_id}, changes)
    scope = f"{item.get('org_id')}/{item.get('assignment_id')}"
    out.print(
        f"item {item_id} queued again for {scope}; stored by the next call that reaches the database",
        highlight=False,
    )


@app.command("mcp-stdio")
def mcp_stdio(
    url: Annotated[str, typer.Option("--url", help="The server's MCP endpoint, e.g. http://127.0.0.1:1417/mcp.")],
    buffer: Annotated[
        Path | None,
        typer.Option("--buffer", help="Local buffer file (default: <data dir>/bridge-buffer.jsonl)."),
    ] = None,
    connect_timeout: Annotated[float, typer.Option(help="Seconds to reach the server.", min=0.1, max=300)] = 5.0,
    call_timeout: Annotated[float, typer.Option(help="Seconds to wait for a tool's answer.", min=1, max=3600)] = 60.0,
    retry_interval: Annotated[
        float, typer.Option(help="Seconds between reconnection attempts while stores wait (0: off).", min=0)
    ] = 30.0,
    log_level: Annotated[
        Literal["debug", "info", "warning", "error"], typer.Option(help="Log level (stderr).")
    ] = "info",
) -> None:
    """Serve MCP over stdio, proxying to `osa-memory serve`; the token comes from $OSA_MEMORY_TOKEN.

    Stores made while the server is unreachable are queued locally and sent, in order, on reconnect.
    """
    from haystack_osa_memory.mcp.stdio_bridge import main as bridge_main

    argv = ["--url", url, "--connect-timeout", str(connect_timeout), "--call-timeout", str(call_timeout)]
    argv += ["--retry-interval", str(retry_interval), "--log-level", log_level]
    if buffer is not None:
        argv += ["--buffer", str(buffer)]
    raise typer.Exit(bridge_main(argv))


@app.command("mcp-config")
def mcp_config(
    client: Annotated[
        Literal["claude-code", "cursor", "generic"], typer.Option("--client", help="Which client to configure.")
    ] = "claude-code",
    url: Annotated[str, typer.Option("--url", help="The server's MCP endpoint.")] = "http://127.0.0.1:1417/mcp",
    transport: Annotated[
        Literal["http", "stdio"],
        typer.Option("--transport", help="http: straight to the server; stdio: through `osa-memory mcp-stdio`."),
    ] = "http",
    embed_token: Annotated[
        bool,
        typer.Option("--embed-token", help="Write the value of $OSA_MEMORY_TOKEN instead of a reference to it."),
    ] = False,
    command: Annotated[
        str, typer.Option("--command", help="The bridge executable for --transport stdio (absolute path if needed).")
    ] = "osa-memory",
) -> None:
    """Print a working MCP client configuration (.mcp.json, .cursor/mcp.json, or both generic forms)."""
    from haystack_osa_memory.mcp.client_config import client_config, render, setup_hint

    token = None
    if embed_token:
        token = os.environ.get("OSA_MEMORY_TOKEN", "").strip()
        if not token:
            _fail("--embed-token needs OSA_MEMORY_TOKEN set to the token printed by `osa-memory token create`")
    try:
        config = client_config(client, url=url, token=token, transport=transport, command=command)
    except ValueError as e:
        _fail(str(e))
    sys.stdout.write(render(config))
    err.print(setup_hint(client, embedded=token is not None), highlight=False, soft_wrap=True)


def _repair(conn_str: str, config: MemoryConfig, *, dry_run: bool) -> Any:
    """The lifecycle repair (`store.repair`), then the other repairs of data an earlier version damaged."""
    from haystack_osa_memory.reflect import repair_observations
    from haystack_osa_memory.store.lifecycle import LifecycleRepository
    from haystack_osa_memory.store.repair import repair as repair_lifecycle

    report = repair_lifecycle(conn_str, config, actor=_operator(), dry_run=dry_run)
    lifecycle = LifecycleRepository(conn_str, config)
    report.observations_repaired = repair_observations(lifecycle, dry_run=dry_run, actor=_operator())
    return report


def _print_repair(report: Any) -> None:
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


@app.command()
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
    config = _config(data_dir)
    conn_str = _connect(config)
    with _or_fail():
        report = _repair(conn_str, config, dry_run=dry_run)
    if as_json:
        _emit(report.as_dict(), True)
        return
    _print_repair(report)


def main() -> None:
    """Entry point of the `osa-memory` script."""
    # Our own process (and the server's workers, which inherit it): nothing leaves the machine unless the
    # environment asks for Haystack's usage telemetry. Set before any command imports Haystack.
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
