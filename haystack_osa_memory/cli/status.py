"""`osa-memory status`: where the data lives, the embedder, and counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from haystack_osa_memory.cli.common import (
    RLS_VISIBLE_WARNING,
    DataDir,
    JsonFlag,
    connect,
    emit,
    err,
    load_config,
    or_fail,
    out,
)

if TYPE_CHECKING:  # the store is imported by the command (start-up time)
    from haystack_osa_memory.store.facts import BufferFit


def status(data_dir: DataDir = None, as_json: JsonFlag = False) -> None:
    """Show where the data lives, the embedder, and counts."""
    from haystack_osa_memory import __version__
    from haystack_osa_memory.embedders import resolve_embedder_choice
    from haystack_osa_memory.store.memory_store import MemoryStore

    config = load_config(data_dir)
    conn = connect(config)
    with or_fail(), MemoryStore.from_config(config.model_copy(update={"pg_conn_str": conn})) as store:
        rls = store.check_schema().row_level_security
        counts = store.count_facts()
        fit = store.buffer_fit()
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
        emit(data, True)
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
