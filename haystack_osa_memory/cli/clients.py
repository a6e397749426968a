"""`osa-memory mcp-stdio` and `mcp-config`: what an MCP client starts, and its configuration."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any, Literal

import typer

from haystack_osa_memory.cli.common import err, fail

#: How `mcp-stdio` is registered: every argument, `--help` included, goes to the bridge untouched. The
#: bridge's parser (`mcp.stdio_bridge.parse_options`) is the one definition of its options and defaults,
#: shared with `python -m haystack_osa_memory.mcp.stdio_bridge`.
MCP_STDIO_SETTINGS: dict[str, Any] = {
    "context_settings": {"allow_extra_args": True, "ignore_unknown_options": True},
    "add_help_option": False,
}


def mcp_stdio(ctx: typer.Context) -> None:
    """Serve MCP over stdio, proxying to `osa-memory serve`; the token comes from $OSA_MEMORY_TOKEN.

    Stores made while the server is unreachable are queued locally and sent, in order, on reconnect.
    """
    from haystack_osa_memory.mcp.stdio_bridge import parse_options, serve_stdio

    raise typer.Exit(serve_stdio(parse_options(ctx.args)))


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
            fail("--embed-token needs OSA_MEMORY_TOKEN set to the token printed by `osa-memory token create`")
    try:
        config = client_config(client, url=url, token=token, transport=transport, command=command)
    except ValueError as e:
        fail(str(e))
    sys.stdout.write(render(config))
    err.print(setup_hint(client, embedded=token is not None), highlight=False, soft_wrap=True)
