"""`serve --workers`' listening sockets (`mcp/listening.py`), on real sockets: the supervisor's holds the port
and refuses a port someone listens on (another `serve` too); each worker's own socket listens beside its
siblings' and the kernel spreads connections over them; a socket bound the usual way is shared as before."""

from __future__ import annotations

import socket
import time

import pytest

from haystack_osa_memory.mcp.listening import bind_workers_socket, own_socket, reuse_port

pytestmark = pytest.mark.skipif(not reuse_port(), reason="SO_REUSEPORT spreads connections on Linux only")


def accepted(listeners: list[socket.socket], port: int, connections: int) -> list[int]:
    """How many of ``connections`` opened to ``port`` each of ``listeners`` accepted."""
    for s in listeners:
        s.setblocking(False)
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    counts = [0] * len(listeners)
    deadline = time.monotonic() + 5
    while sum(counts) < connections and time.monotonic() < deadline:
        for n, s in enumerate(listeners):
            try:
                conn, _ = s.accept()
            except BlockingIOError:
                continue
            conn.close()
            counts[n] += 1
    for c in clients:
        c.close()
    return counts


def test_the_supervisor_socket_holds_the_port_for_the_workers_alone() -> None:
    sock, guard = bind_workers_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        assert sock.get_inheritable()
        with pytest.raises(OSError, match=r"another osa-memory serve listens on 127\.0\.0\.1"):
            bind_workers_socket("127.0.0.1", port)  # a second `serve` would split the connections: refused
    finally:
        sock.close()
        assert guard is not None
        guard.close()
    again, guard = bind_workers_socket("127.0.0.1", port)  # the port is free again once the first is done
    again.close()
    assert guard is not None
    guard.close()


def test_a_port_another_program_listens_on_is_refused() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(OSError, match="in use"):
            bind_workers_socket("127.0.0.1", other.getsockname()[1])


def test_each_worker_listens_on_its_own_socket_and_connections_are_spread() -> None:
    supervisor, guard = bind_workers_socket("127.0.0.1", 0)
    port = supervisor.getsockname()[1]
    inherited = [supervisor.dup(), supervisor.dup()]  # what each forked worker holds
    workers = [own_socket(s) for s in inherited]
    try:
        assert all(s.fileno() == -1 for s in inherited)  # the shared copy is closed in the worker
        assert all(w.getsockname() == ("127.0.0.1", port) for w in workers)
        for w in workers:
            w.listen(128)
        counts = accepted(workers, port, 64)
        assert sum(counts) == 64
        assert min(counts) >= 8, counts  # one of 64 connections each way: binomial, ~1e-9 to fall below
    finally:
        for s in [supervisor, *workers, *([guard] if guard else [])]:
            s.close()


def test_a_socket_bound_the_usual_way_is_shared_as_before() -> None:
    with socket.socket() as plain:
        plain.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        plain.bind(("127.0.0.1", 0))
        assert own_socket(plain) is plain
        assert plain.fileno() != -1
