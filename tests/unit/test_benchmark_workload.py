"""benchmarks.workload: the database cluster's CPU between two samples, with real child processes standing in for
the cluster's (this process is their postmaster)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.workload import cluster_cpu, cpu_spent

# Burns ``argv[1]`` seconds of CPU, then waits for its standard input to close.
BURN = (
    "import sys, time\n"
    "end = time.process_time() + float(sys.argv[1])\n"
    "while time.process_time() < end: pass\n"
    "sys.stdin.read()"
)


def burning(seconds: float) -> subprocess.Popen[bytes]:
    """A child that has burnt ``seconds`` of CPU (waited for) and now waits."""
    child = subprocess.Popen([sys.executable, "-c", BURN, str(seconds)], stdin=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while cluster_cpu(os.getpid()).get(child.pid, 0.0) < 0.8 * seconds:
        assert time.monotonic() < deadline, "the child did not burn its CPU"
        time.sleep(0.02)
    return child


def test_a_process_that_ended_between_two_samples_is_missed_not_taken_off() -> None:
    child = burning(0.4)
    before = cluster_cpu(os.getpid())
    child.communicate(b"")
    after = cluster_cpu(os.getpid())
    assert child.pid in before
    assert child.pid not in after
    assert sum(after.values()) - sum(before.values()) < 0  # the totals' difference took its whole life off
    assert 0 <= cpu_spent(before, after) < 0.3


def test_a_process_started_between_two_samples_counts_whole() -> None:
    before = cluster_cpu(os.getpid())
    child = burning(0.3)
    try:
        after = cluster_cpu(os.getpid())
        assert child.pid not in before
        assert cpu_spent(before, after) >= after[child.pid] >= 0.24
    finally:
        child.communicate(b"")


def test_no_cluster_no_cpu() -> None:
    assert cluster_cpu(None) == {}
    assert cpu_spent({}, {}) == 0
