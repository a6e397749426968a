"""Prometheus metrics of `osa-memory serve --metrics-port PORT`, for one server process or several.

Two sides, always in prometheus-client's multiprocess mode, so one design serves a single process and
`--workers N` alike:

- the **serving process** (`serve`, before any worker starts) calls :func:`serve_metrics`: it makes a
  fresh private (0700) folder, exports it as ``PROMETHEUS_MULTIPROC_DIR`` and ``OSA_MEMORY_METRICS_DIR``
  (inherited by every worker) and serves the endpoint on its own port, reading every process's files
  (``MultiProcessCollector``) plus the offline queue's depth, which it reads from the queue file itself;
- **each process that runs the MCP app** calls :func:`start_worker` (through the tool-call
  instrumentation in `haystack_osa_memory.mcp.telemetry`): its tool latencies, errors, embedder batch
  sizes and connection-pool use are written to that folder.

With one process both sides are the same process. Gauges of the pools are ``livesum``: the files of a
worker that exited are dropped (`mark_process_dead`, at its exit and, for a worker that was killed, at
the next scrape); counters and histograms keep a dead worker's counts, so totals never go backwards.

Labels carry a tool name (one of the served tools, else ``unknown``) and an error kind (a class name of
`haystack_osa_memory.errors`, else ``internal`` or ``cancelled``) and nothing else: never fact text,
queries, tokens, org or assignment ids.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from haystack_osa_memory import instruments
from haystack_osa_memory.errors import OsaMemoryError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

logger = logging.getLogger(__name__)

#: Set by `serve_metrics` for the server's processes: metrics are on, their files go there.
ENV_DIR = "OSA_MEMORY_METRICS_DIR"
PROMETHEUS_DIR = "PROMETHEUS_MULTIPROC_DIR"

UNKNOWN_TOOL = "unknown"
INTERNAL = "internal"
CANCELLED = "cancelled"

#: Seconds between two samples of the connection pools (each tool call also takes one).
POOL_SAMPLE_SECONDS = 5.0

TOOL_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
EMBED_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


#: Gauges sampled from the connection pools and the held assignments (`_WorkerMetrics.sample`).
LIVE_GAUGES = {
    "osa_memory_db_pool_connections": "Open pooled database connections.",
    "osa_memory_db_pool_in_use": "Pooled connections lent out right now.",
    "osa_memory_db_pool_idle": "Pooled connections open and idle.",
    "osa_memory_db_pool_max": "Most connections the pools may open.",
    "osa_memory_db_pool_waiting": "Requests waiting for a pooled connection.",
    "osa_memory_held_scopes": "Big assignments held in memory for recall.",
    "osa_memory_held_facts": "Facts of the assignments held in memory.",
    "osa_memory_held_bytes": "Bytes of the arrays held for those facts.",
}
#: Counters sampled from the same (what happened since the last sample is added).
COUNTERS = {
    "osa_memory_db_pool_requests_total": "Connections asked of the pools.",
    "osa_memory_db_pool_requests_queued_total": "Requests that had to wait for a connection.",
    "osa_memory_db_pool_wait_seconds_total": "Time requests spent waiting for a connection.",
    "osa_memory_db_pool_request_errors_total": "Requests that got no connection (timeouts).",
    "osa_memory_held_full_reads_total": "Held assignments read in full (first use, a change, every 30 s).",
    "osa_memory_held_appends_total": "Held assignments brought up to date by reading only new facts.",
    "osa_memory_held_dropped_total": "Facts dropped from memory after their governing row refused them.",
}


#: Every metric name, for the documentation and its test.
METRIC_NAMES = (
    "osa_memory_tool_duration_seconds",
    "osa_memory_tool_errors_total",
    "osa_memory_embed_batch_size",
    "osa_memory_document_embed_batch_size",
    "osa_memory_offline_queue_depth",
    "osa_memory_offline_queue_rejected",
    *LIVE_GAUGES,
    *COUNTERS,
)


def tool_label(name: str, served: Iterable[str]) -> str:
    """The tool's name when it is one of the served tools, else ``unknown`` (clients choose the name)."""
    return name if name in served else UNKNOWN_TOOL


def error_kind(error: BaseException) -> str:
    """Our typed error's class name, ``internal`` for any other exception, ``cancelled`` for a cancellation.

    Never the message: messages may quote arguments.
    """
    if isinstance(error, OsaMemoryError):
        return type(error).__name__
    if isinstance(error, Exception):
        return INTERNAL
    return CANCELLED


class _WorkerMetrics:
    """The metrics one server process writes (to its own files in the shared folder)."""

    def __init__(self, tools: Iterable[str]) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        # registry=None: in multiprocess mode the files are the registry; the endpoint reads them all.
        self.tool_seconds = Histogram(
            "osa_memory_tool_duration_seconds",
            "Time to answer one MCP tool call, errors included.",
            ["tool"],
            buckets=TOOL_SECONDS_BUCKETS,
            registry=None,
        )
        self.tool_errors = Counter(
            "osa_memory_tool_errors_total",
            "Tool calls answered with an error, by error kind.",
            ["tool", "kind"],
            registry=None,
        )
        self.embed_batch = Histogram(
            "osa_memory_embed_batch_size",
            "Query texts embedded by one call of the query embedder.",
            buckets=EMBED_BATCH_BUCKETS,
            registry=None,
        )
        self.document_batch = Histogram(
            "osa_memory_document_embed_batch_size",
            "Fact texts embedded together (concurrent stores share forward passes).",
            buckets=EMBED_BATCH_BUCKETS,
            registry=None,
        )

        # Live gauges add up the running processes only; counters keep an exited process's counts.
        self.gauges = {
            name: Gauge(name, help_text, multiprocess_mode="livesum", registry=None)
            for name, help_text in LIVE_GAUGES.items()
        }
        self.counters = {name: Counter(name, help_text, registry=None) for name, help_text in COUNTERS.items()}
        # Series at zero for every served tool, so rates and dashboards work before the first call.
        for tool in tools:
            self.tool_seconds.labels(tool)
        self._sample_lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_forever, name="osa-memory-metrics", daemon=True)

    def sample(self) -> None:
        from haystack_osa_memory.store.database import pool_stats
        from haystack_osa_memory.store.scope_cache import held_stats

        with self._sample_lock:  # the sampler thread and tool calls: each popped counter is added once
            stats = pool_stats(pop=True)
            held = held_stats(pop=True)

            def total(key: str) -> float:
                return float(sum(s.get(key, 0) for s in stats))

            size, idle = total("pool_size"), total("pool_available")
            gauges = {
                "osa_memory_db_pool_connections": size,
                "osa_memory_db_pool_idle": idle,
                "osa_memory_db_pool_in_use": max(size - idle, 0),
                "osa_memory_db_pool_max": total("pool_max"),
                "osa_memory_db_pool_waiting": total("requests_waiting"),
                "osa_memory_held_scopes": held.scopes,
                "osa_memory_held_facts": held.facts,
                "osa_memory_held_bytes": held.array_bytes,
            }
            counts = {
                "osa_memory_db_pool_requests_total": total("requests_num"),
                "osa_memory_db_pool_requests_queued_total": total("requests_queued"),
                "osa_memory_db_pool_wait_seconds_total": total("requests_wait_ms") / 1000,
                "osa_memory_db_pool_request_errors_total": total("requests_errors"),
                "osa_memory_held_full_reads_total": held.full_reads,
                "osa_memory_held_appends_total": held.appends,
                "osa_memory_held_dropped_total": held.dropped,
            }
            for name, value in gauges.items():
                self.gauges[name].set(value)
            for name, value in counts.items():
                self.counters[name].inc(value)

    def _sample_forever(self) -> None:
        while not self._stop.wait(POOL_SAMPLE_SECONDS):
            try:
                self.sample()
            except Exception as e:  # a metrics hiccup must not end the sampling, nor reach a caller
                logger.debug("metrics sample failed: %s", type(e).__name__)


_worker: _WorkerMetrics | None = None
_worker_lock = threading.Lock()


def start_worker(tools: Iterable[str] = ()) -> bool:
    """Turn this process's metrics on when `serve --metrics-port` asked for them; idempotent.

    Returns whether metrics are on. ``tools``: the served tools, whose series start at zero.
    """
    global _worker
    from haystack_osa_memory.settings import load_config

    folder = load_config(only=("metrics_dir",)).metrics_dir
    if folder is None:
        return False
    directory = str(folder)
    with _worker_lock:
        if _worker is not None:
            return True
        os.environ[PROMETHEUS_DIR] = directory
        from prometheus_client import values

        # prometheus-client picks its value class when first imported; a process that imported it before
        # the folder was known would keep its counts in memory, where the endpoint cannot see them.
        if values.ValueClass is values.MutexValue:
            values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
        _worker = _WorkerMetrics(tools)
        _worker._sampler.start()
        instruments.set_embed_batch_sink(observe_embed_batch)
        instruments.set_document_batch_sink(observe_document_batch)
        atexit.register(_leave, os.getpid(), directory)
    return True


def _leave(pid: int, directory: str) -> None:
    """At this process's exit: its live gauges no longer count (a killed process is pruned at scrape)."""
    from prometheus_client import multiprocess

    if os.getpid() == pid and os.path.isdir(directory):
        multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


def record_tool_call(tool: str, seconds: float, error: BaseException | None) -> None:
    """One answered tool call (``tool`` already bounded by :func:`tool_label`); no-op when metrics are off."""
    worker = _worker
    if worker is None:
        return
    worker.tool_seconds.labels(tool).observe(seconds)
    if error is not None:
        worker.tool_errors.labels(tool, error_kind(error)).inc()
    try:
        worker.sample()
    except Exception as e:
        logger.debug("metrics sample failed: %s", type(e).__name__)


def observe_document_batch(size: int) -> None:
    """The document embedder embeds ``size`` texts together; no-op when metrics are off."""
    worker = _worker
    if worker is not None:
        worker.document_batch.observe(size)


def observe_embed_batch(size: int) -> None:
    """The query embedder embeds ``size`` texts in one call; no-op when metrics are off.

    Components report through `haystack_osa_memory.instruments.observe_embed_batch` (they sit below
    the server); this is the sink it calls.
    """
    worker = _worker
    if worker is not None:
        worker.embed_batch.observe(size)


# -- the serving process: the endpoint ---------------------------------------------------------


def _process_alive(pid: int) -> bool:
    import psutil  # type: ignore[import-untyped]

    try:  # an unreaped worker that was killed is a zombie: dead for our purpose
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


class _ScrapeCollector:
    """What one scrape returns: every process's files, minus the live gauges of dead processes, plus
    the offline queue's depth read from the queue itself (it is shared by every process)."""

    def __init__(self, directory: Path, offline_buffer: Path | None) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        self.directory = directory
        self.offline_buffer = offline_buffer
        self.files = MultiProcessCollector(None, str(directory))  # type: ignore[no-untyped-call]

    def prune_dead(self) -> list[int]:
        """`mark_process_dead` for every process whose live gauges remain but which no longer runs."""
        from prometheus_client import multiprocess

        pids: set[int] = set()
        for path in self.directory.glob("gauge_live*_*.db"):
            suffix = path.stem.rsplit("_", 1)[-1]
            if suffix.isdigit() and int(suffix) != os.getpid():
                pids.add(int(suffix))
        dead = sorted(pid for pid in pids if not _process_alive(pid))
        for pid in dead:
            multiprocess.mark_process_dead(pid, str(self.directory))  # type: ignore[no-untyped-call]
        return dead

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        self.prune_dead()
        yield from self.files.collect()  # type: ignore[no-untyped-call]
        if self.offline_buffer is None:
            return
        from haystack_osa_memory.offline import OfflineBuffer

        try:
            pending, rejected = OfflineBuffer(self.offline_buffer, "").counts()
        except Exception as e:  # an unreadable queue costs these two metrics, not the scrape
            logger.warning("metrics: the offline queue could not be read: %s", type(e).__name__)
            return
        yield GaugeMetricFamily(
            "osa_memory_offline_queue_depth", "Facts waiting in the offline buffer (every scope).", value=pending
        )
        yield GaugeMetricFamily(
            "osa_memory_offline_queue_rejected",
            "Facts set aside at replay (token revoked or expired), kept for an operator.",
            value=rejected,
        )


@dataclass
class MetricsEndpoint:
    """The running endpoint of :func:`serve_metrics`; :meth:`close` stops it and removes its folder."""

    directory: Path
    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread
    _previous_env: dict[str, str | None] = field(default_factory=dict)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        for name, value in self._previous_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(self.directory, ignore_errors=True)


def serve_metrics(host: str, port: int, offline_buffer: Path | None = None) -> MetricsEndpoint:
    """Serve Prometheus metrics at ``http://host:port/metrics`` from a daemon thread of this process.

    Call it in the serving process before the MCP app is loaded or any worker starts: it exports the
    metrics folder to them. ``offline_buffer``: the offline queue whose depth is reported.

    Raises:
        OSError: the port cannot be bound.
    """
    directory = Path(tempfile.mkdtemp(prefix="osa-memory-metrics-"))  # 0700, ours alone
    previous = {name: os.environ.get(name) for name in (ENV_DIR, PROMETHEUS_DIR)}
    os.environ[ENV_DIR] = os.environ[PROMETHEUS_DIR] = str(directory)
    try:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_ScrapeCollector(directory, offline_buffer))
        server, thread = start_http_server(port, addr=host, registry=registry)
    except BaseException:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return MetricsEndpoint(directory, host, port, server, thread, previous)


__all__ = [
    "ENV_DIR",
    "METRIC_NAMES",
    "MetricsEndpoint",
    "error_kind",
    "observe_document_batch",
    "observe_embed_batch",
    "record_tool_call",
    "serve_metrics",
    "start_worker",
    "tool_label",
]
