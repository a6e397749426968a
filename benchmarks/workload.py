"""The load benchmarks' workload: the facts and queries of `load.py`, `parameters.py` and `call_parts.py`,
their callers, and the database cluster's CPU time; for the two in-process scripts, a seeded knowledge base
and the blocks of calls they measure two ways of, alternating.

Every assignment's facts carry a tag word no other assignment's do (`tag`), so a recall that answered with
another assignment's fact would show it. `wrk_driver.LUA` draws its queries from the same words.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.harness import database, fresh_schema, postmaster_pid
from haystack_osa_memory import Caller, Memory, MemoryConfig, use_lean_input_copies
from haystack_osa_memory.transfer import ImportItem

#: CPU milliseconds per call of one block: this process's, the database cluster's.
BlockCpu = tuple[float, float]

SUBJECTS = ("staging", "billing", "search", "ingest", "auth", "reports", "mobile", "gateway", "scheduler", "ledger")
THINGS = ("VPN profile", "cache bucket", "deploy window", "feature flag", "runbook", "on-call rota", "db replica")
VERBS = ("uses", "needs", "moved to", "depends on", "is pinned to", "was switched to")


def tag(assignment: int) -> str:
    """The word every fact of assignment ``assignment`` carries (and no other assignment's does)."""
    return f"zq{assignment:03d}tag"


def fact_text(assignment: int, n: int, rnd: random.Random) -> str:
    """A fact of assignment ``assignment``: its tag word, a subject, a thing, a verb and a value."""
    subject, thing, verb = rnd.choice(SUBJECTS), rnd.choice(THINGS), rnd.choice(VERBS)
    return f"{tag(assignment)}: {subject} {thing} {verb} value-{rnd.randrange(10**6)} (note {n})"


def query_text(assignment: int, rnd: random.Random) -> str:
    """A question of assignment ``assignment``: its tag word, a thing and a subject."""
    return f"{tag(assignment)} which {rnd.choice(THINGS)} does {rnd.choice(SUBJECTS)} use?"


def caller_of(assignment: int) -> Caller:
    """The caller working on assignment ``assignment`` (two orgs, assignments alternating between them)."""
    return Caller(org_id=f"load-org-{assignment % 2}", assignment_id=f"asg-{assignment:03d}", specialist_id="s")


def cluster_cpu_s(postmaster: int | None) -> float:
    """CPU seconds of the database cluster: its postmaster and that process's children (/proc); 0 without one."""
    if postmaster is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(entry) == postmaster or int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def add_block_arguments(
    parser: argparse.ArgumentParser, *, assignments: int, block: int, rounds: int, warmup: int
) -> None:
    """The options of a benchmark that seeds assignments and measures calls in alternating blocks."""
    parser.add_argument("--embedder", choices=["none", "minilm"], default="none")
    parser.add_argument("--assignments", type=int, default=assignments)
    parser.add_argument("--facts", type=int, default=60, help="facts seeded per assignment")
    parser.add_argument("--block", type=int, default=block, help="calls per block")
    parser.add_argument("--rounds", type=int, default=rounds, help="pairs of blocks")
    parser.add_argument("--warmup", type=int, default=warmup, help="calls each way before measuring")
    parser.add_argument("--json", type=Path)


def check_block_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, *more: str) -> None:
    """Refuse counts below 1 (the options of `add_block_arguments` and ``more``) and a negative warm-up."""
    names = ["assignments", "facts", "block", "rounds", *more]
    if min(getattr(args, n) for n in names) < 1 or args.warmup < 0:
        listed = ", ".join(f"--{n}" for n in names)
        parser.error(f"{listed} must be at least 1, --warmup at least 0")


@contextmanager
def knowledge_base(prefix: str, embedder: str) -> Iterator[tuple[MemoryConfig, int | None]]:
    """A fresh schema on a scratch database (or ``PG_CONN_STR``'s), configured as `serve` runs, and the pid of
    its cluster's postmaster; the schema is dropped afterwards."""
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    use_lean_input_copies()  # as `serve` runs
    with database(f"osa-{prefix}-") as conn_str:
        schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
        config = MemoryConfig(pg_conn_str=conn_str, kb_schema=schema, memory_schema=schema, embedder=embedder)
        with fresh_schema(conn_str, config):
            yield config, postmaster_pid(conn_str)


def seed(memory: Memory, callers: list[Caller], facts: int, rnd: random.Random) -> None:
    """``facts`` facts per caller's assignment, imported."""
    for a, caller in enumerate(callers):
        items = [ImportItem(fact_text(a, n, rnd), f"seed:{n}", topic="load") for n in range(facts)]
        memory.import_items(items, caller=caller)


def alternating_blocks(
    call: Callable[[bool], object],
    postmaster: int | None,
    *,
    warmup: int,
    block: int,
    rounds: int,
    switch: Callable[[bool], object] | None = None,
) -> dict[bool, list[BlockCpu]]:
    """``call(way)`` in blocks of ``block`` calls, way False then True, then True then False, ``rounds`` times,
    after ``warmup`` calls each way: the CPU per call of each block, by way. ``switch(way)``, when given, runs
    before each block (outside its measurement)."""

    def run(way: bool, calls: int) -> BlockCpu:
        if switch is not None:
            switch(way)
        db, cpu = cluster_cpu_s(postmaster), time.process_time()
        for _ in range(calls):
            call(way)
        return (time.process_time() - cpu) / max(calls, 1) * 1000, (cluster_cpu_s(postmaster) - db) / max(
            calls, 1
        ) * 1000

    for way in (True, False):
        run(way, warmup)
    samples: dict[bool, list[BlockCpu]] = {True: [], False: []}
    for r in range(rounds):
        for way in (False, True) if r % 2 == 0 else (True, False):
            samples[way].append(run(way, block))
    return samples


def paired_medians(samples: dict[bool, list[BlockCpu]]) -> dict[str, tuple[float, float, float]]:
    """For the process (``server``), the cluster (``postgres``) and both (``total``): the median CPU per call of
    way False, of way True, and the median of the paired differences (True minus False)."""
    out = {}
    for part, pick in (("server", lambda x: x[0]), ("postgres", lambda x: x[1]), ("total", lambda x: x[0] + x[1])):
        off = statistics.median(pick(x) for x in samples[False])
        on = statistics.median(pick(x) for x in samples[True])
        paired = statistics.median(pick(t) - pick(f) for t, f in zip(samples[True], samples[False], strict=True))
        out[part] = (off, on, paired)
    return out
