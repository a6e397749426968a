"""The load benchmarks' workload: the facts and queries of `load.py`, `parameters.py` and `call_parts.py`,
their callers, and the database cluster's CPU time.

Every assignment's facts carry a tag word no other assignment's do (`tag`), so a recall that answered with
another assignment's fact would show it. `wrk_driver.LUA` draws its queries from the same words.
"""

from __future__ import annotations

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
