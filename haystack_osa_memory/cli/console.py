"""`osa-memory console`: the review console's web server."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from haystack_osa_memory.cli.common import DataDir, connect, err, fail, load_config, or_fail


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
    config = load_config(data_dir)
    people: dict[str, str] = {}
    if sso_header or sso_proxy or sso_map:
        if not (sso_header and sso_proxy and sso_map):
            fail("SSO proxy mode needs all three: --sso-header, --sso-proxy (repeatable) and --sso-map")
        try:
            loaded = json.loads(sso_map.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            fail(f"--sso-map {sso_map} could not be read as JSON: {e}")
        if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
            fail('--sso-map must hold one JSON object: {"login": "token id", ...}')
        people = {str(k): v for k, v in loaded.items()}
    with or_fail():
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
    conn = console_conn or connect(config)
    if console_conn:
        from haystack_osa_memory.store.schema import check_schema

        with or_fail():
            check_schema(conn, config)
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
