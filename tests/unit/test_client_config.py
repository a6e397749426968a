"""`client_config`: the JSON that `osa-memory mcp-config` prints for Claude Code, Cursor and other clients."""

from __future__ import annotations

import itertools
import json
from typing import Any, get_args

import pytest

from haystack_osa_memory.mcp import stdio_bridge as bridge
from haystack_osa_memory.mcp.client_config import CLIENTS, ClientName, Transport, client_config, render

URL = "http://127.0.0.1:1417/mcp"
TOKEN = "osam_0123456789abcdef_" + "S" * 43


def test_claude_code_http_is_a_project_mcp_json_with_an_env_reference() -> None:
    assert client_config("claude-code", url=URL) == {
        "mcpServers": {
            "osa-memory": {
                "type": "http",
                "url": URL,
                "headers": {"Authorization": "Bearer ${OSA_MEMORY_TOKEN}"},
            }
        }
    }


def test_cursor_http_uses_cursor_interpolation_and_no_type() -> None:
    assert client_config("cursor", url=URL) == {
        "mcpServers": {
            "osa-memory": {
                "url": URL,
                "headers": {"Authorization": "Bearer ${env:OSA_MEMORY_TOKEN}"},
            }
        }
    }


def test_claude_code_stdio_starts_the_bridge() -> None:
    assert client_config("claude-code", url=URL, transport="stdio") == {
        "mcpServers": {
            "osa-memory": {
                "type": "stdio",
                "command": "osa-memory",
                "args": ["mcp-stdio", "--url", URL],
                "env": {"OSA_MEMORY_TOKEN": "${OSA_MEMORY_TOKEN}"},
            }
        }
    }


def test_cursor_stdio_starts_the_bridge() -> None:
    assert client_config("cursor", url=URL, transport="stdio") == {
        "mcpServers": {
            "osa-memory": {
                "command": "osa-memory",
                "args": ["mcp-stdio", "--url", URL],
                "env": {"OSA_MEMORY_TOKEN": "${env:OSA_MEMORY_TOKEN}"},
            }
        }
    }


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_generic_gives_both_forms(transport: Transport) -> None:
    servers = client_config("generic", url=URL, transport=transport)["mcpServers"]
    assert servers == {
        "osa-memory": {
            "type": "http",
            "url": URL,
            "headers": {"Authorization": "Bearer ${OSA_MEMORY_TOKEN}"},
        },
        "osa-memory-stdio": {
            "command": "osa-memory",
            "args": ["mcp-stdio", "--url", URL],
            "env": {"OSA_MEMORY_TOKEN": "${OSA_MEMORY_TOKEN}"},
        },
    }


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


@pytest.mark.parametrize(("client", "transport"), list(itertools.product(CLIENTS, ("http", "stdio"))))
def test_no_literal_token_unless_passed(client: ClientName, transport: Transport) -> None:
    config = client_config(client, url=URL, transport=transport)
    text = render(config)
    assert "osam_" not in text
    assert TOKEN not in text
    # every credential is a reference to OSA_MEMORY_TOKEN, never a value
    secrets = [s for s in _strings(config) if s.startswith("Bearer ")] + [
        entry["env"]["OSA_MEMORY_TOKEN"] for entry in config["mcpServers"].values() if "env" in entry
    ]
    assert secrets
    for secret in secrets:
        assert "OSA_MEMORY_TOKEN" in secret
        assert secret.removeprefix("Bearer ").startswith("${")


@pytest.mark.parametrize(("client", "transport"), list(itertools.product(CLIENTS, ("http", "stdio"))))
def test_an_explicit_token_is_embedded(client: ClientName, transport: Transport) -> None:
    config = client_config(client, url=URL, token=f"  {TOKEN}\n", transport=transport)
    for entry in config["mcpServers"].values():
        if "headers" in entry:
            assert entry["headers"] == {"Authorization": f"Bearer {TOKEN}"}
        else:
            assert entry["env"] == {"OSA_MEMORY_TOKEN": TOKEN}
    assert "${" not in render(config)


def test_the_stdio_args_are_what_the_bridge_accepts() -> None:
    entry = client_config("claude-code", url=URL, transport="stdio")["mcpServers"]["osa-memory"]
    assert entry["args"][0] == "mcp-stdio"
    args = bridge._parser().parse_args(entry["args"][1:])
    assert args.url == URL
    assert args.buffer is None  # the default buffer under the data folder


def test_a_custom_command_path() -> None:
    entry = client_config("cursor", url=URL, transport="stdio", command="/opt/venv/bin/osa-memory")
    assert entry["mcpServers"]["osa-memory"]["command"] == "/opt/venv/bin/osa-memory"


def test_https_urls_and_render() -> None:
    config = client_config("claude-code", url="https://memory.example.com/mcp")
    text = render(config)
    assert text.endswith("\n")
    assert json.loads(text) == config
    assert text.startswith('{\n  "mcpServers"')


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"client": "vscode", "url": URL}, "unknown client"),
        ({"client": "cursor", "url": URL, "transport": "sse"}, "unknown transport"),
        ({"client": "cursor", "url": "127.0.0.1:1417/mcp"}, r"http\(s\)"),
        ({"client": "cursor", "url": "ftp://host/mcp"}, r"http\(s\)"),
        ({"client": "cursor", "url": "http:///mcp"}, r"http\(s\)"),
        ({"client": "cursor", "url": URL, "token": "  "}, "token"),
        ({"client": "cursor", "url": URL, "transport": "stdio", "command": " "}, "command"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        client_config(**kwargs)


def test_the_clients_literal_matches_the_tuple() -> None:
    assert get_args(ClientName) == CLIENTS
