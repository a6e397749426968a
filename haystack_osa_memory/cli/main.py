"""`osa-memory`: the command line of haystack-osa-memory (typer + rich).

The commands live in one module per job (`data`, `serve`, `console`, `facts`, `status`, `tokens`,
`review`, `switches`, `offline_queue`, `clients`, with `common` shared); this module puts them under one
`app`. Errors print one line (what, why, what to do) to stderr and exit with status 1 (2 for usage).
"""

from __future__ import annotations

import os
import sys

import typer

from haystack_osa_memory.cli import clients, offline_queue, review, tokens
from haystack_osa_memory.cli.clients import mcp_config, mcp_stdio
from haystack_osa_memory.cli.common import RLS_VISIBLE_WARNING, DataDir, JsonFlag, err, out
from haystack_osa_memory.cli.console import console
from haystack_osa_memory.cli.data import export, import_, init, repair
from haystack_osa_memory.cli.facts import audit, history, recall, reflect, store
from haystack_osa_memory.cli.offline_queue import queue_rejected, queue_retry
from haystack_osa_memory.cli.review import review_accept, review_list, review_reject
from haystack_osa_memory.cli.serve import serve
from haystack_osa_memory.cli.status import buffers_note, status
from haystack_osa_memory.cli.switches import (
    assignment_app,
    assignment_disable,
    assignment_enable,
    org_app,
    org_disable,
    org_enable,
)
from haystack_osa_memory.cli.tokens import token_create, token_list, token_revoke

app = typer.Typer(
    name="osa-memory",
    help="Assignment-scoped agent memory in your Haystack + pgvector knowledge base, served over MCP.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
token_app = tokens.app
review_app = review.app
queue_app = offline_queue.app

# In the order `osa-memory --help` lists them: the commands, then the groups.
app.command()(init)
app.command("upgrade", help="Alias of init.")(init)
app.command()(serve)
app.command()(console)
app.command()(store)
app.command()(recall)
app.command()(status)
app.command()(history)
app.command()(audit)
app.command()(reflect)
app.command("import")(import_)
app.command()(export)
app.command("mcp-stdio", **clients.MCP_STDIO_SETTINGS)(mcp_stdio)
app.command("mcp-config")(mcp_config)
app.command()(repair)
app.add_typer(token_app, name="token")
app.add_typer(review_app, name="review")
app.add_typer(assignment_app, name="assignment")
app.add_typer(org_app, name="org")
app.add_typer(queue_app, name="queue")


def main() -> None:
    """Entry point of the `osa-memory` script."""
    # Our own process (and the server's workers, which inherit it): nothing leaves the machine unless the
    # environment asks for Haystack's usage telemetry. Set before any command imports Haystack.
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


__all__ = [
    "RLS_VISIBLE_WARNING",
    "DataDir",
    "JsonFlag",
    "app",
    "assignment_app",
    "assignment_disable",
    "assignment_enable",
    "audit",
    "buffers_note",
    "console",
    "err",
    "export",
    "history",
    "import_",
    "init",
    "main",
    "mcp_config",
    "mcp_stdio",
    "org_app",
    "org_disable",
    "org_enable",
    "out",
    "queue_app",
    "queue_rejected",
    "queue_retry",
    "recall",
    "reflect",
    "repair",
    "review_accept",
    "review_app",
    "review_list",
    "review_reject",
    "serve",
    "status",
    "store",
    "token_app",
    "token_create",
    "token_list",
    "token_revoke",
]

if __name__ == "__main__":
    main()
