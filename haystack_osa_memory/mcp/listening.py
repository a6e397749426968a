"""The listening sockets of `serve --workers`: one per worker, the kernel spreading new connections over them.

uvicorn's supervisor binds one socket and every worker accepts on it. A worker woken by a burst of connections
accepts all it can, so the split depends on which worker the kernel wakes first: 32 connections opened at once
went 32/0, 31/1 or 28/4 in runs of the benchmark's (benchmarks/README.md, "Connections spread over the
workers"), and a worker left without connections leaves its core idle while the other queues every call.
Where the kernel spreads connections over sockets bound with ``SO_REUSEPORT`` (Linux: by a hash of each
connection's addresses), the supervisor binds its socket so (`bind_workers_socket`: it only holds the port, it
never listens) and each forked worker listens on a socket of its own beside it (`own_socket`). Elsewhere the
workers share the supervisor's socket as before.

Usage:
```python
sock, guard = bind_workers_socket("127.0.0.1", 8000)   # in the supervisor
listening = own_socket(sock)                            # in each forked worker, before it serves
```
"""

from __future__ import annotations

import errno
import socket
import sys

#: The abstract Unix socket a `serve` supervisor holds while it serves an address (`bind_workers_socket`).
GUARD_NAME = "\0osa-memory-serve/{host}:{port}"


def reuse_port() -> bool:
    """Whether the kernel spreads connections over sockets bound with ``SO_REUSEPORT`` (Linux). Elsewhere the
    option either does not exist or hands every connection to one of the sockets."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def bind_workers_socket(host: str, port: int) -> tuple[socket.socket, socket.socket | None]:
    """The supervisor's socket, bound to ``host`` and ``port`` (IPv6 when ``host`` holds a ``:``, as uvicorn
    binds) and inheritable, with ``SO_REUSEPORT`` where `reuse_port`; and with it, the guard that keeps a second
    `serve` off the port (close both when serving ends; the guard is ``None`` without ``SO_REUSEPORT``).

    A port another program listens on is refused: it is first bound without ``SO_REUSEPORT``. Sockets bound with
    it would also let a second `serve` join the first and split its connections, silently; so the supervisor
    binds an abstract Unix socket named after the address as well, which only one process can hold.

    :raises OSError: the address is taken (by another program or another `serve`) or cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    spread = reuse_port()
    if spread:
        with socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    guard = None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if spread:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if spread:
            bound = sock.getsockname()[1]
            guard = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                guard.bind(GUARD_NAME.format(host=host, port=bound))
            except OSError as e:
                guard.close()
                msg = f"another osa-memory serve listens on {host}:{bound}"
                raise OSError(errno.EADDRINUSE, msg) from e
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock, guard


def own_socket(shared: socket.socket) -> socket.socket:
    """In a forked worker: a socket of its own, bound where the supervisor's ``shared`` is, ``shared`` closed in
    this process; ``shared`` itself when it was not bound with ``SO_REUSEPORT`` (the workers then share it).

    :raises OSError: the address cannot be bound again (the worker then fails to start, as uvicorn's would).
    """
    if not reuse_port() or shared.family not in (socket.AF_INET, socket.AF_INET6):
        return shared
    if not shared.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
        return shared
    sock = socket.socket(shared.family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(shared.getsockname())
    except OSError:
        sock.close()
        raise
    shared.close()
    return sock
