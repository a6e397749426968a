"""The load benchmarks' workload: the facts and queries of `load.py`, `parameters.py` and `call_parts.py`,
their callers, and the database cluster's CPU time.

Every assignment's facts carry a tag word no other assignment's do (`tag`), so a recall that answered with
another assignment's fact would show it. `wrk_driver.LUA` draws its queries from the same words.
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

from haystack_osa_memory import Caller

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
