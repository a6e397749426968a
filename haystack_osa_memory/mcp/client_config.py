"""`osa-memory mcp-config`: the MCP client configuration for Claude Code, Cursor or any other client.

The token is referenced through the ``OSA_MEMORY_TOKEN`` environment variable in each client's own
syntax (Claude Code: ``${OSA_MEMORY_TOKEN}``; Cursor: ``${env:OSA_MEMORY_TOKEN}``), so the printed file
can be committed. A literal token is embedded only when one is passed explicitly. See docs/clients.md.
"""

from __future__ import annotations

import json
from typing import Any, Literal
from urllib.parse import urlsplit

ClientName = Literal["claude-code", "cursor", "generic"]
Transport = Literal["http", "stdio"]

CLIENTS: tuple[ClientName, ...] = ("claude-code", "cursor", "generic")
SERVER_NAME = "osa-memory"
TOKEN_ENV = "OSA_MEMORY_TOKEN"  # noqa: S105 - the name of the variable, not a secret

#: How each client writes "the value of environment variable NAME" inside its config file.
_ENV_REFERENCE: dict[ClientName, str] = {
    "claude-code": "${%s}",  # .mcp.json: ${VAR} and ${VAR:-default} in command, args, env, url, headers
    "cursor": "${env:%s}",  # .cursor/mcp.json: ${env:NAME}, ${userHome}, ${workspaceFolder}
    "generic": "${%s}",  # the most common convention; replace it if your client has another
}

#: Where each client reads the printed JSON.
CONFIG_FILES: dict[ClientName, str] = {
    "claude-code": ".mcp.json (project root)",
    "cursor": ".cursor/mcp.json (project) or ~/.cursor/mcp.json (global)",
    "generic": "your client's MCP configuration",
}


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        msg = f"url must be the server's http(s) MCP endpoint, such as http://127.0.0.1:1417/mcp, not {url!r}"
        raise ValueError(msg)
    return url


def _token_value(client: ClientName, token: str | None) -> str:
    if token is not None:
        if not token.strip():
            msg = "token must not be empty; omit it to reference $OSA_MEMORY_TOKEN instead"
            raise ValueError(msg)
        return token.strip()
    return _ENV_REFERENCE[client] % TOKEN_ENV


def _http_entry(client: ClientName, url: str, token: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "http"} if client != "cursor" else {}
    entry["url"] = url
    entry["headers"] = {"Authorization": f"Bearer {_token_value(client, token)}"}
    return entry


def _stdio_entry(client: ClientName, url: str, token: str | None, command: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "stdio"} if client == "claude-code" else {}
    entry["command"] = command
    entry["args"] = ["mcp-stdio", "--url", url]
    entry["env"] = {TOKEN_ENV: _token_value(client, token)}
    return entry


def client_config(
    client: ClientName,
    *,
    url: str,
    token: str | None = None,
    transport: Transport = "http",
    command: str = "osa-memory",
) -> dict[str, Any]:
    """The JSON configuration that connects ``client`` to the osa-memory MCP server at ``url``.

    :param client: ``claude-code`` (project ``.mcp.json``), ``cursor`` (``.cursor/mcp.json``) or
        ``generic`` (both forms, an ``osa-memory`` HTTP entry and an ``osa-memory-stdio`` entry: keep
        the one your client supports; ``transport`` is ignored).
    :param url: The server's MCP endpoint, e.g. ``http://127.0.0.1:1417/mcp``.
    :param token: Embed this token literally. By default the config references ``$OSA_MEMORY_TOKEN``
        in the client's own syntax and holds no secret.
    :param transport: ``http`` connects straight to the server; ``stdio`` starts the local bridge
        (``osa-memory mcp-stdio``), which queues stores while the server is unreachable.
    :param command: The executable of the stdio bridge (an absolute path if it is not on the PATH the
        client starts processes with).
    :raises ValueError: unknown client or transport, or a URL that is not http(s).
    """
    if client not in CLIENTS:
        msg = f"unknown client {client!r}; choose one of {list(CLIENTS)}"
        raise ValueError(msg)
    if transport not in ("http", "stdio"):
        msg = f"unknown transport {transport!r}; choose http or stdio"
        raise ValueError(msg)
    if not command.strip():
        msg = "command must not be empty"
        raise ValueError(msg)
    url = _check_url(url)
    if client == "generic":
        servers = {
            SERVER_NAME: _http_entry(client, url, token),
            f"{SERVER_NAME}-stdio": _stdio_entry(client, url, token, command),
        }
    elif transport == "http":
        servers = {SERVER_NAME: _http_entry(client, url, token)}
    else:
        servers = {SERVER_NAME: _stdio_entry(client, url, token, command)}
    return {"mcpServers": servers}


def setup_hint(client: ClientName, *, embedded: bool = False) -> str:
    """One line for stderr: where to save the printed JSON and where the token must come from."""
    where = f"Save it as {CONFIG_FILES[client]}"
    if client == "generic":
        where = (
            "Keep the entry your client supports (osa-memory: HTTP; osa-memory-stdio: the local bridge) in "
            + (CONFIG_FILES[client])
        )
    if embedded:
        return f"{where}. It contains the token: keep it out of version control (chmod 600)."
    return (
        f"{where}; set {TOKEN_ENV} in the environment the client is started from (the file holds no secret). "
        "See docs/clients.md."
    )


def render(config: dict[str, Any]) -> str:
    """The configuration as the JSON text to save (2-space indent, trailing newline)."""
    return json.dumps(config, indent=2, ensure_ascii=False) + "\n"
