"""What every benchmark shares: one percentile, one description of the machine, one scratch database.

Percentiles are linear interpolation between the two nearest ranks (numpy's default ``method="linear"``,
Hyndman & Fan type 7): with the ``n`` values sorted, the q-th percentile sits at rank ``q / 100 * (n - 1)``
and takes the weighted mean of the values on either side. Every latency figure a benchmark prints or
writes goes through ``percentile`` (wrk's own p50/p90/p99 excepted: those come from wrk's histogram).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.store.database import close_pools, scratch_database
from haystack_osa_memory.store.schema import ensure_schema

SERVER_VERSION = "SHOW server_version"
PGVECTOR_VERSION = "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
DROP_SCHEMA = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")


# ------------------------------------------------------------------------------------------ percentiles


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 <= q <= 100) of ``values``, interpolated linearly between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentiles(seconds: Sequence[float], digits: int | None = None) -> dict[str, float]:
    """p50, p95, p99 and mean in milliseconds of durations in seconds (``{}`` when there are none)."""
    if not seconds:
        return {}
    ms = [s * 1000 for s in seconds]
    out = {f"p{q}": percentile(ms, q) for q in (50, 95, 99)} | {"mean": statistics.fmean(ms)}
    return out if digits is None else {key: round(value, digits) for key, value in out.items()}


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """Mean, p50, p95 and max in milliseconds of durations in seconds, to 0.01 ms (``{}`` when there are none)."""
    if not seconds:
        return {}
    ms = [s * 1000 for s in seconds]
    return {
        "mean_ms": round(statistics.fmean(ms), 2),
        "p50_ms": round(percentile(ms, 50), 2),
        "p95_ms": round(percentile(ms, 95), 2),
        "max_ms": round(max(ms), 2),
    }


# -------------------------------------------------------------------------------------------- machine


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    with suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def server_versions(conn_str: str) -> dict[str, str | None]:
    """PostgreSQL's and pgvector's versions on the server of ``conn_str``."""
    with psycopg.connect(conn_str, prepare_threshold=None) as conn:
        server = conn.execute(SERVER_VERSION).fetchone()
        vector = conn.execute(PGVECTOR_VERSION).fetchone()
    return {"postgresql": server[0] if server else None, "pgvector": vector[0] if vector else None}


def machine_info(conn_str: str | None = None) -> dict[str, Any]:
    """The machine a run measured: CPU, cores, RAM (GiB), OS, Python, load average at the start; with
    ``conn_str``, also the PostgreSQL and pgvector versions of that server."""
    ram = None
    with suppress(ValueError, OSError, AttributeError):
        ram = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    info: dict[str, Any] = {
        "cpu_model": cpu_name(),
        "cores": os.cpu_count(),
        "ram_gib": ram,
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    return info | (server_versions(conn_str) if conn_str else {})


# ------------------------------------------------------------------------------------------- database


def database(prefix: str) -> AbstractContextManager[str]:
    """``PG_CONN_STR``, else an embedded PostgreSQL + pgvector in a temporary directory (deleted afterwards)."""
    return scratch_database(prefix=prefix)


def postmaster_pid(conn_str: str) -> int | None:
    """The pid of the cluster's postmaster (first line of postmaster.pid in its data directory)."""
    with suppress(Exception), psycopg.connect(conn_str) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
        if row:
            return int((Path(row[0]) / "postmaster.pid").read_text().split()[0])
    return None


def drop_schema(conn_str: str, *schemas: str) -> None:
    """Close the library's pools (they hold the schemas' tables), then drop ``schemas`` with all they hold."""
    close_pools()
    with psycopg.connect(conn_str, autocommit=True, prepare_threshold=None) as conn:
        for schema in dict.fromkeys(schemas):
            conn.execute(DROP_SCHEMA.format(sql.Identifier(schema)))


@contextmanager
def fresh_schema(conn_str: str, config: MemoryConfig) -> Iterator[MemoryConfig]:
    """The schemas of ``config`` created for one run and dropped after it."""
    ensure_schema(conn_str, config)
    try:
        yield config
    finally:
        drop_schema(conn_str, config.kb_schema, config.memory_schema)
