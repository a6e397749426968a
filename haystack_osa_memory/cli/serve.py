"""`osa-memory serve`: the MCP server, in this process or in uvicorn worker processes, with its metrics."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from haystack_osa_memory.cli.common import RLS_VISIBLE_WARNING, DataDir, connect, err, fail, load_config
from haystack_osa_memory.config import MemoryConfig


def _serve_metrics(host: str, metrics_port: int | None, port: int, config: MemoryConfig) -> Any:
    """`serve --metrics-port`: the Prometheus endpoint (haystack_osa_memory.mcp.metrics), or None when off."""
    if metrics_port is None:
        return None
    if metrics_port == port:
        fail(f"--metrics-port {metrics_port} is also the MCP port; choose another port for the metrics")
    from haystack_osa_memory.mcp.metrics import serve_metrics

    try:
        endpoint = serve_metrics(host, metrics_port, config.offline_buffer_path)
    except OSError as e:
        fail(f"could not serve metrics on {host}:{metrics_port}: {e.strerror or e} (choose another --metrics-port)")
    err.print(f"Prometheus metrics on {endpoint.url}", highlight=False)
    return endpoint


def _export_for_tools(
    config: MemoryConfig, data_dir: Path | None, conn_str: str, pipelines_dir: Path | None, processes: int
) -> None:
    """Write what the tools need into this process's environment: the one place `serve` does.

    Hayhooks loads the tools' wrappers, which build their `Memory` from the environment
    (`memory.shared_memory()`), in this process or in uvicorn's worker processes; those are spawned
    with a copy of this process's environment, and uvicorn takes no other for them. So `--data-dir`, the
    embedded database this process started, `--pipelines-dir` and the workers' threads reach them here.
    """
    from haystack_osa_memory.mcp.forked_workers import use_cpu_threads
    from haystack_osa_memory.mcp.server import PIPELINES_DIR_ENV

    if data_dir is not None:
        os.environ["OSA_MEMORY_DATA_DIR"] = str(config.data_dir)
    if not config.pg_conn_str:
        os.environ["PG_CONN_STR"] = conn_str
    if processes > 1 and pipelines_dir is not None:
        os.environ[PIPELINES_DIR_ENV] = str(pipelines_dir.resolve())
    # One torch thread per serving process (torch would take one per CPU): a server embeds from many
    # threads at once (calls in flight, the query embedder's budget threads), each thread with threads of
    # its own becomes one more OpenMP team, and once the teams outnumber the CPUs every forward pass waits
    # on them (docs/traps.md). Calls in flight and the workers use the CPUs instead.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    use_cpu_threads()  # haystack has loaded torch already; the workers apply it again after their fork


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

    from haystack_osa_memory.mcp.call_slots import CallSlots
    from haystack_osa_memory.mcp.forked_workers import freeze_heap, preload
    from haystack_osa_memory.mcp.guard import start_database_guard, stop_database_guard
    from haystack_osa_memory.mcp.server import (
        CachingVerifier,
        create_app,
        default_workers,
        exit_on_sigterm,
        install_log_scrubbing,
    )
    from haystack_osa_memory.store.database import stop_embedded
    from haystack_osa_memory.store.memory_store import MemoryStore

    exit_on_sigterm()  # before the database starts: a SIGTERM at any point must still stop it
    install_log_scrubbing(log_level)  # before anything logs: settings and database errors are scrubbed too
    metrics_endpoint = None
    guard = None
    store: MemoryStore | None = None
    try:
        config = load_config(data_dir)
        # Before the app loads or any worker starts: they inherit the metrics folder it exports.
        metrics_endpoint = _serve_metrics(host, metrics_port, port, config)
        conn = connect(config)
        # The server's own store (tokens, schema checks) for as long as it serves.
        store = MemoryStore.from_config(config.model_copy(update={"pg_conn_str": conn}))
        processes = workers or default_workers()
        _export_for_tools(config, data_dir, conn, pipelines_dir, processes)
        if not config.pg_conn_str:
            guard = start_database_guard(config.data_dir)  # stops the embedded database if this process is killed
        where = "PG_CONN_STR" if config.pg_conn_str else f"embedded PostgreSQL in {config.data_dir}"
        if processes > 1:
            # Each worker loads the tools itself (uvicorn app factory), from what `_export_for_tools` wrote.
            err.print(
                f"osa-memory MCP server on http://{host}:{port}/mcp ({processes} workers; data: {where})",
                highlight=False,
            )
            if config.pg_conn_str and not store.check_schema().row_level_security:
                err.print(f"note: {RLS_VISIBLE_WARNING}", highlight=False)
            try:
                # Once here, shared by the forked workers (haystack_osa_memory.mcp.forked_workers).
                preload(config)
            except Exception as e:
                err.print(f"the MCP tools could not be loaded: {type(e).__name__}: {e}", highlight=False)
                raise typer.Exit(3) from None
            _serve_workers(host, port, log_level, processes)
            return
        tokens = store.tokens
        try:
            asgi = create_app(
                CachingVerifier(tokens, config.offline_grace), pipelines_dir, CallSlots.from_config(config)
            )
        except Exception as e:
            fail(f"the MCP tools could not be loaded: {type(e).__name__}: {e}")
        freeze_heap()  # the app and its models live as long as the process: out of the collector's way
        err.print(f"osa-memory MCP server on http://{host}:{port}/mcp (data: {where})", highlight=False)
        if config.pg_conn_str and not store.check_schema().row_level_security:
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
        if store is not None:
            store.close()
        stop_embedded()
        if guard is not None:  # this process left the database cleanly: the guard has nothing to do
            stop_database_guard(guard)


def _serve_workers(host: str, port: int, log_level: str, processes: int) -> None:
    """uvicorn's supervisor: ``processes`` workers, each listening on a socket of its own where the kernel spreads
    connections over them (`listening`; elsewhere on the supervisor's); a dead worker is replaced, one that cannot
    load the tools stops the server (exit 3)."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from haystack_osa_memory.mcp.forked_workers import forking_workers
    from haystack_osa_memory.mcp.listening import bind_workers_socket

    config = uvicorn.Config(
        "haystack_osa_memory.mcp.server:worker_app",
        factory=True,
        host=host,
        port=port,
        log_level=log_level,
        workers=processes,
    )
    try:
        # Each forked worker listens beside it on a socket of its own (haystack_osa_memory.mcp.listening).
        sock, guard = bind_workers_socket(host, port)
    except OSError as e:
        logging.getLogger("uvicorn.error").error(e)  # as uvicorn's own bind reports it
        raise typer.Exit(3) from None  # the address is taken
    address = f"[{host}]" if ":" in host else host
    logging.getLogger("uvicorn.error").info(
        "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", address, sock.getsockname()[1]
    )

    class Supervisor(Multiprocess):
        terminated = False

        def handle_term(self) -> None:
            self.terminated = True
            super().handle_term()

    supervisor = Supervisor(config, sockets=[sock])
    try:
        with forking_workers():
            supervisor.run()
    finally:
        sock.close()
        if guard is not None:
            guard.close()
    if any(p.process.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        raise typer.Exit(3)
    if supervisor.terminated:
        raise SystemExit(143)  # as with one process: SIGTERM ends with 128 + 15 (Ctrl-C with 0)
