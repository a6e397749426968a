"""What every `osa-memory` command shares: the consoles, the common options, the one-line error, settings,
the database check, JSON output and the audit actor."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.errors import OsaMemoryError

if TYPE_CHECKING:  # the store is imported by the commands that use it (start-up time)
    from haystack_osa_memory.memory import Memory
    from haystack_osa_memory.store.lifecycle import LifecycleRepository
    from haystack_osa_memory.store.memory_store import MemoryStore

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Embedded database folder (OSA_MEMORY_DATA_DIR); ignored when PG_CONN_STR is set."),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]

RLS_VISIBLE_WARNING = (
    "row-level security is off: facts are visible to any pipeline or role that reads the chunk and "
    "governing tables without our filter (turn it on with `osa-memory init --row-level-security`)"
)


def fail(message: str) -> NoReturn:
    """Print the one-line error and exit with status 1."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@contextmanager
def or_fail() -> Iterator[None]:
    """Turn our typed errors into the one-line error and exit status 1 of every command."""
    try:
        yield
    except OsaMemoryError as e:
        fail(str(e))


def load_config(data_dir: Path | None) -> MemoryConfig:
    """The settings from the environment, with ``--data-dir`` in place of ``OSA_MEMORY_DATA_DIR`` when given."""
    with or_fail():
        return MemoryConfig.from_env(data_dir=data_dir)


def connect(config: MemoryConfig) -> str:
    """Reach the database and check its schema version (no DDL: only `init` changes the schema)."""
    from haystack_osa_memory.errors import SchemaError
    from haystack_osa_memory.store.database import resolve_connection_string
    from haystack_osa_memory.store.memory_store import MemoryStore

    try:
        conn = resolve_connection_string(config)
        with MemoryStore.from_config(config.model_copy(update={"pg_conn_str": conn})) as store:
            store.prepare_schema(embedded=config.pg_conn_str is None)
    except SchemaError as e:
        fail(str(e))
    except OsaMemoryError as e:
        fail(f"{e} (check PG_CONN_STR, or unset it to use the embedded database)")
    except Exception as e:
        fail(f"could not start or reach the database: {type(e).__name__}: {e}")
    return conn


def open_store(config: MemoryConfig) -> MemoryStore:
    """The `MemoryStore` of the checked database (`connect`); close it when done (``with``)."""
    from haystack_osa_memory.store.memory_store import MemoryStore

    return MemoryStore.from_config(config.model_copy(update={"pg_conn_str": connect(config)}))


def emit(data: Any, as_json: bool) -> None:
    """Plain JSON on stdout (never coloured, even with FORCE_COLOR set)."""
    if as_json:
        sys.stdout.write(json.dumps(data, default=str, indent=2) + "\n")
        sys.stdout.flush()


def operator_actor() -> str:
    """The audit actor of CLI commands: `cli:<login>`."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli:unknown"


def open_memory(config: MemoryConfig) -> Memory:
    """`Memory` on the checked database."""
    from haystack_osa_memory.memory import Memory

    connect(config)
    return Memory(config)


@contextmanager
def open_lifecycle(config: MemoryConfig) -> Iterator[LifecycleRepository]:
    """The lifecycle repository (review, switches, history, audit) of the checked database's `MemoryStore`,
    closed when the block ends."""
    with open_store(config) as store:
        yield store.lifecycle
