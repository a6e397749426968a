"""Knowledge updates: after a value changed (once or several times), is the CURRENT value recalled first?

Usage::

    python benchmarks/updates.py [--subjects 150] [--seed 7] [--json out.json] [--only both|ours|mem0]
                                 [--examples 8] [--no-topics] [--dump-data facts.json] [--keep] [--no-progress]

``PG_CONN_STR`` selects the database; when it is unset, an embedded PostgreSQL + pgvector is started
in a temporary directory and deleted afterwards. Ours runs in a fresh schema, mem0 in fresh tables of
``public``; everything is dropped at the end (``--keep`` keeps it). mem0 is the optional ``bench``
extra; without it the mem0 side is skipped with a note.

The data (generated, seeded: ``--seed`` regenerates another set)
----------------------------------------------------------------
``--subjects`` subjects drawn round-robin from ten attribute families of an engineering team (the
VPN profile of an environment, the port of a service, the on-call engineer of a team, the release
date of a version, the region of a cluster, the owner of a repository, a person's phone extension,
the version of a database, the timeout of a job, the standup room of a team). Many subjects share a
family and its templates (25 services, each with a port), and two families share their subjects (a
team has an on-call engineer AND a standup room), so confusing subjects costs. Each subject is
stated once, then restated with a changed value 1-3 times, every statement in a different wording
(3 first-statement and 5 restatement paraphrases per family, one of which names the old value).
Statements of different subjects are interleaved in time order (each subject's versions in order),
with 0-2 unrelated filler facts after each (1 on average). One question per subject asks for the
current value in question wording ("Which VPN profile does staging use?"). Each fact is stored with
an explicit ``valid_from`` from a synthetic clock: 2026-01-01T00:00:00+00:00, one hour per stored
fact (fillers too). Each statement is stored with its family's topic ("vpn", "service ports", ...), each
filler with one of four generic topics ("team", "office", ...); ``--no-topics`` stores no topic at all.
``--dump-data PATH`` writes the generated facts and questions as JSON (outside the repository, please).

What is measured (one ``Memory`` with the MiniLM embedders, one fresh assignment per mode)
-----------------------------------------------------------------------------------------
- **(a) supersedes given**: each restatement is stored with ``supersedes=[previous version's id]``.
- **(b) agent confirms**: plain stores; a simulated agent reads each result's ``possibly_supersedes``
  and confirms ONLY the suggestions that truly are earlier, still-current versions of the same
  subject (the generator knows), by storing the same fact again (same text, same topic, same
  ``valid_from``: same document, upserted) with ``supersedes=[confirmed ids]``. Suggestions are
  scored: true (an earlier version of the same subject) or false (by what they were: another subject
  of the family, the same subject name in another family, another family, a filler), and the live
  predecessors that were not suggested are counted as misses.
- **(c) no help**: plain stores.

Every question is asked with ``Memory.recall(question, limit=5)`` in the mode's assignment. Per
mode: the share whose top-1 fact is the current version of the subject, the share where an older
version ranks above the current one (or is returned while the current one is not), the share with
the current version in the top 5, and what the top-1 was when it was not the current version. For
(a) also: an older version first although the newer one was stored with ``supersedes`` (must be
0), superseded versions returned by a default recall, and the history: with
``include_superseded=True`` every version of the subject is returned, and with ``as_of`` one minute
before the last restatement's ``valid_from`` the previous version comes first.

mem0 OSS (``infer=False``, as in ``vs_mem0.py``: the same local MiniLM, the same server, its LLM
replaced by a guard, telemetry off): (c) plain ``add`` calls; and mem0's own way to replace a value,
``update(memory_id, text)`` on the subject's memory, reported beside (a). ``update`` overwrites the
vector row (its previous text survives only in mem0's SQLite history, ``history(memory_id)``, which
search never reads). (b) has no mem0 equivalent without its LLM. mem0 searches with ``top_k=5`` and
its default threshold.

Targets (from the issue): top-1 current (a) 100%, (b) >= 95%, (c) >= 80%; never an older value first
when the newer one was stored with ``supersedes``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import tempfile
import time
import uuid
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import database, drop_schema, latency_summary, machine_info
from benchmarks.mem0_peer import (
    MEM0_THRESHOLD,
    Mem0Side,
    mem0_environment,
    mem0_nlp_state,
    set_torch_threads,
    versions,
)
from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.errors import SupersessionError
from haystack_osa_memory.store.database import close_pools

ORG = "updates"
K = 5
CLOCK_START = datetime(2026, 1, 1, tzinfo=UTC)
CLOCK_STEP = timedelta(hours=1)
AS_OF_BEFORE = timedelta(minutes=1)  # as_of = the last restatement's valid_from minus this
TARGETS = {"a_supersedes": 1.0, "b_agent_confirms": 0.95, "c_plain": 0.80}
MODE_LABELS = {
    "a_supersedes": "(a) supersedes given",
    "b_agent_confirms": "(b) agent confirms suggestions",
    "c_plain": "(c) plain stores, no help",
    "a_update": "(a') update(memory_id, text)",
}
console = Console(width=None if sys.stdout.isatty() else 140)


def say(text: str) -> None:
    """Print plain text (no rich markup)."""
    console.print(text, markup=False, highlight=False)


# ------------------------------------------------------------------------------------------ families

FIRST_NAMES = [
    "Maria", "Jonas", "Priya", "Kenji", "Amara", "Lucas", "Sofia", "Omar", "Elena", "Mateo", "Aisha", "Noah",
    "Yuki", "Leila", "Tomasz", "Ingrid", "Ravi", "Chloe", "Diego", "Hannah", "Kwame", "Nadia", "Felix", "Zara",
    "Arjun", "Maya", "Pedro", "Signe", "Tariq", "Freya",
]  # fmt: skip
LAST_NAMES = [
    "Novak", "Okafor", "Lindqvist", "Tanaka", "Moreau", "Costa", "Schmidt", "Haddad", "Kowalski", "Rossi",
    "Mensah", "Ivanova", "Fischer", "Duarte", "Nakamura", "Osei", "Berg", "Castillo", "Petrov", "Walsh",
]  # fmt: skip
TEAMS = [
    "payments", "platform", "data", "mobile", "search", "identity", "infra", "checkout", "growth", "billing",
    "observability", "security", "ML", "frontend", "storage", "networking", "support tooling", "analytics",
    "messaging", "release engineering", "developer experience", "fraud", "logistics", "notifications", "compliance",
]  # fmt: skip
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
    "December",
]  # fmt: skip
REGIONS = [
    "eu-west-1", "eu-central-1", "us-east-1", "us-east-2", "us-west-2", "ap-southeast-1", "ap-northeast-1",
    "eu-north-1", "ca-central-1", "sa-east-1", "eu-west-3", "ap-south-1",
]  # fmt: skip
ROOMS = [
    "Kepler", "Curie", "Turing", "Hopper", "Lovelace", "Noether", "Darwin", "Fermi", "Bohr", "Euler", "Gauss",
    "Tesla", "Pascal", "Newton", "Galileo", "Meitner", "Ramanujan",
]  # fmt: skip
DB_VERSIONS = {
    "PostgreSQL": ["13.14", "14.11", "15.6", "16.2", "16.4", "17.0", "17.2"],
    "MySQL": ["5.7.44", "8.0.36", "8.4.0", "9.0.1", "9.1.0"],
    "MariaDB": ["10.6.17", "10.11.7", "11.2.3", "11.4.2"],
    "MongoDB": ["5.0.26", "6.0.14", "7.0.8", "8.0.1"],
    "Redis": ["6.2.14", "7.0.15", "7.2.4", "7.4.0"],
}
PRODUCTS = ["Atlas", "Nimbus", "Mobile app", "CLI", "Python SDK", "Web dashboard", "Go SDK", "Agent"]
ENVIRONMENTS = [
    "staging", "production", "qa", "sandbox", "perf-test", "demo", "preprod", "uat", "canary", "integration",
    "dev-eu", "dev-us", "load-test", "training", "hotfix", "nightly", "beta", "partner-sandbox", "dr-site",
    "edge-lab", "research", "chaos-lab", "ml-lab", "security-lab", "release-candidate",
]  # fmt: skip
SERVICES = [
    "billing-api", "auth-service", "search-gateway", "ledger-service", "notification-worker", "invoice-renderer",
    "user-profile-api", "payments-gateway", "audit-logger", "feature-flags", "report-builder", "image-resizer",
    "session-store", "checkout-api", "catalog-service", "pricing-engine", "email-dispatcher", "geo-lookup",
    "rate-limiter", "webhook-relay", "metrics-proxy", "token-exchange", "export-service", "sync-daemon",
    "order-tracker",
]  # fmt: skip
CLUSTERS = [
    "orion", "kestrel", "heron", "falcon", "osprey", "puffin", "raven", "swift", "tern", "wren", "egret", "ibis",
    "kite", "lark", "merlin", "plover", "robin", "shrike", "stork", "vireo", "avocet", "bunting", "crane", "dunlin",
    "finch",
]  # fmt: skip
REPOSITORIES = [
    "infra-terraform", "web-frontend", "data-pipelines", "mobile-ios", "mobile-android", "api-gateway",
    "design-system", "ci-templates", "docs-site", "ml-models", "billing-core", "auth-lib", "helm-charts",
    "event-bus", "admin-console", "search-indexer", "etl-jobs", "load-tests", "sdk-python", "sdk-js",
    "k8s-operators", "perf-tools", "onboarding-app", "status-page", "cost-reports",
]  # fmt: skip
DATABASES = [
    "orders", "users", "inventory", "billing", "sessions", "catalog", "audit", "payments ledger", "shipping",
    "reviews", "notifications", "loyalty", "fraud-signals", "warehouse", "recommendations", "pricing",
    "support-tickets", "invoices", "events", "accounts", "subscriptions", "returns", "coupons", "search-logs",
    "telemetry",
]  # fmt: skip
JOBS = [
    "nightly backup", "invoice export", "search reindex", "log rotation", "cache warm-up", "data retention purge",
    "report generation", "certificate renewal", "dependency scan", "usage aggregation", "email digest",
    "image cleanup", "metrics rollup", "ledger reconciliation", "user sync", "sitemap build", "volume snapshot",
    "GDPR export", "cost report", "token cleanup", "thumbnail generation", "price refresh", "fraud scoring",
    "catalog import", "archive compaction",
]  # fmt: skip


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def distinct(draw: Callable[[], str], taken: Sequence[str]) -> str:
    for _ in range(1000):
        value = draw()
        if value not in taken:
            return value
    msg = "could not draw a new value"
    raise RuntimeError(msg)


def abbreviation(name: str) -> str:
    """``staging`` -> ``stg``: the first letter and the next two consonants."""
    letters = [c for c in name.lower() if c.isalpha()]
    picked = letters[:1] + [c for c in letters[1:] if c not in "aeiou"]
    return "".join(picked[:3]) if len(picked) >= 3 else "".join(letters[:3])


def vpn_values(rng: random.Random, subject: str, n: int) -> list[str]:
    prefix = abbreviation(subject)
    values: list[str] = []
    for i in range(n):
        suffix = "" if i == 0 and rng.random() < 0.5 else str(rng.randint(2, 9))
        values.append(distinct(lambda s=suffix: f"{prefix}-{rng.choice(['eu', 'us', 'ap', 'ca'])}{s}", values))
    return values


def sequence(rng: random.Random, n: int, draw: Callable[[], str]) -> list[str]:
    values: list[str] = []
    for _ in range(n):
        values.append(distinct(draw, values))
    return values


def release_values(rng: random.Random, subject: str, n: int) -> list[str]:
    day = datetime(2026, 2, 1, tzinfo=UTC) + timedelta(days=rng.randint(0, 240))
    values: list[str] = []
    for _ in range(n):
        values.append(f"{day.day} {MONTHS[day.month - 1]} {day.year}")
        day += timedelta(days=rng.randint(5, 45) if rng.random() < 0.8 else -rng.randint(3, 14))
    return values


def db_values(rng: random.Random, subject: str, n: int) -> list[str]:
    engine = rng.choice([e for e, vs in DB_VERSIONS.items() if len(vs) >= n])
    picked = sorted(rng.sample(range(len(DB_VERSIONS[engine])), n))
    return [f"{engine} {DB_VERSIONS[engine][i]}" for i in picked]


@dataclass(frozen=True)
class Family:
    """One attribute: its subjects, how values are drawn, and the wordings."""

    key: str
    topic: str
    subjects: list[str]
    values: Callable[[random.Random, str, int], list[str]]
    first: list[str]  # first statement wordings: {s} subject, {S} capitalised, {v} value
    restate: list[str]  # restatement wordings, also {old}: the previous value
    questions: list[str]


def _releases() -> list[str]:
    pool = random.Random(0)  # a fixed pool of subjects; the run's seed picks among them
    names: list[str] = []
    while len(names) < 25:
        name = f"{pool.choice(PRODUCTS)} {pool.randint(1, 9)}.{pool.randint(0, 9)}"
        if name not in names:
            names.append(name)
    return names


def _people() -> list[str]:
    pool = random.Random(1)
    names: list[str] = []
    while len(names) < 25:
        name = person(pool)
        if name not in names:
            names.append(name)
    return names


FAMILIES = [
    Family(
        "vpn",
        "vpn",
        ENVIRONMENTS,
        vpn_values,
        [
            "{S} uses the VPN profile {v}.",
            "The VPN profile for {s} is {v}.",
            "To reach {s}, connect with the {v} VPN profile.",
        ],
        [
            "{S} now uses the VPN profile {v}.",
            "The VPN profile for {s} changed to {v}.",
            "We moved {s} to VPN profile {v}.",
            "{S} switched from VPN profile {old} to {v}.",
            "Heads-up: connecting to {s} needs the {v} VPN profile from now on.",
        ],
        ["Which VPN profile does {s} use?", "What VPN profile do I need to reach {s}?"],
    ),
    Family(
        "port",
        "service ports",
        SERVICES,
        lambda rng, s, n: sequence(rng, n, lambda: str(rng.randint(1024, 9999))),
        [
            "The {s} listens on port {v}.",
            "{S} runs on port {v}.",
            "The {s} service is exposed on port {v}.",
        ],
        [
            "The {s} now listens on port {v}.",
            "We changed the port of {s} to {v}.",
            "{S} moved from port {old} to port {v}.",
            "After the migration, {s} is served on port {v}.",
            "Port for {s} is {v} now, update your configs.",
        ],
        ["Which port does {s} listen on?", "What port is {s} running on?"],
    ),
    Family(
        "oncall",
        "on-call",
        TEAMS,
        lambda rng, s, n: sequence(rng, n, lambda: person(rng)),
        [
            "{v} is the on-call engineer for the {s} team.",
            "The {s} team's on-call engineer is {v}.",
            "On-call for {s} this rotation: {v}.",
        ],
        [
            "{v} has taken over on-call for the {s} team.",
            "The {s} team's on-call changed to {v}.",
            "{v} is now on call for {s}, replacing {old}.",
            "Rotation update: {s} on-call is {v} now.",
            "Page {v} for {s} issues from now on.",
        ],
        ["Who is on call for the {s} team?", "Who should I page for {s} problems?"],
    ),
    Family(
        "release",
        "releases",
        _releases(),
        release_values,
        [
            "{S} is scheduled for release on {v}.",
            "The release date of {s} is {v}.",
            "We plan to ship {s} on {v}.",
        ],
        [
            "{S} slipped to {v}.",
            "The release of {s} moved to {v}.",
            "New release date for {s}: {v}.",
            "{S} will now ship on {v} instead of {old}.",
            "Release management rescheduled {s} to {v}.",
        ],
        ["When is {s} being released?", "What is the release date of {s}?"],
    ),
    Family(
        "region",
        "clusters",
        CLUSTERS,
        lambda rng, s, n: sequence(rng, n, lambda: rng.choice(REGIONS)),
        [
            "The {s} cluster runs in {v}.",
            "{S} is deployed in the {v} region.",
            "The {s} cluster lives in region {v}.",
        ],
        [
            "The {s} cluster was migrated to {v}.",
            "{S} now runs in {v}.",
            "We moved the {s} cluster from {old} to {v}.",
            "The region of the {s} cluster is {v} after the move.",
            "{S} cluster: new home is {v}.",
        ],
        ["Which region is the {s} cluster in?", "Where does the {s} cluster run?"],
    ),
    Family(
        "owner",
        "repositories",
        REPOSITORIES,
        lambda rng, s, n: sequence(rng, n, lambda: person(rng)),
        [
            "{v} owns the {s} repository.",
            "The owner of the {s} repo is {v}.",
            "{S} is maintained by {v}.",
        ],
        [
            "{v} is the new owner of the {s} repository.",
            "Ownership of {s} moved to {v}.",
            "The {s} repo changed hands from {old} to {v}.",
            "{S} is now maintained by {v}.",
            "Ask {v} about {s} from now on; they own it.",
        ],
        ["Who owns the {s} repository?", "Who maintains {s}?"],
    ),
    Family(
        "extension",
        "phone extensions",
        _people(),
        lambda rng, s, n: sequence(rng, n, lambda: str(rng.randint(1000, 9999))),
        [
            "{S}'s phone extension is {v}.",
            "You can reach {s} on extension {v}.",
            "{S} has desk extension {v}.",
        ],
        [
            "{S}'s extension changed to {v}.",
            "{S} now answers on extension {v}.",
            "{S} moved desks; new extension {v}.",
            "{S}'s phone extension is no longer {old}, it is {v}.",
            "Call {s} on {v} from now on.",
        ],
        ["What is {s}'s phone extension?", "Which extension reaches {s}?"],
    ),
    Family(
        "database",
        "databases",
        DATABASES,
        db_values,
        [
            "The {s} database runs {v}.",
            "The {s} DB is on {v}.",
            "The {s} database version is {v}.",
        ],
        [
            "The {s} database was upgraded to {v}.",
            "The {s} DB now runs {v}.",
            "We upgraded the {s} database from {old} to {v}.",
            "After last night's maintenance, the {s} database is on {v}.",
            "{S} DB version bumped to {v}.",
        ],
        ["Which database version does the {s} database run?", "What version is the {s} database on?"],
    ),
    Family(
        "timeout",
        "jobs",
        JOBS,
        lambda rng, s, n: sequence(
            rng, n, lambda: str(rng.choice([5, 10, 15, 20, 25, 30, 40, 45, 50, 60, 75, 90, 120, 150, 180, 240]))
        ),
        [
            "The {s} job times out after {v} minutes.",
            "The timeout of the {s} job is {v} minutes.",
            "The {s} job is killed if it runs longer than {v} minutes.",
        ],
        [
            "The {s} job timeout is now {v} minutes.",
            "We changed the {s} timeout to {v} minutes.",
            "The {s} timeout went from {old} to {v} minutes.",
            "New limit for the {s} job: {v} minutes.",
            "Since the config change, the {s} job gets {v} minutes before it is killed.",
        ],
        ["What is the timeout of the {s} job?", "How long can the {s} job run before it times out?"],
    ),
    Family(
        "standup",
        "standups",
        TEAMS,
        lambda rng, s, n: sequence(rng, n, lambda: rng.choice(ROOMS)),
        [
            "The {s} standup is in room {v}.",
            "The {s} team holds its daily standup in the {v} room.",
            "The daily {s} standup meets in {v}.",
        ],
        [
            "The {s} standup moved to room {v}.",
            "The {s} standup is now in {v}.",
            "The {s} team changed its standup room from {old} to {v}.",
            "From next week the {s} standup is held in {v}.",
            "Standup room for {s}: {v} (changed).",
        ],
        ["Which room is the {s} standup in?", "Where does the {s} team hold its standup?"],
    ),
]
FAMILY = {f.key: f for f in FAMILIES}

FILLERS = [
    "The {day} retro will focus on {theme}.",
    "{p} prefers async code reviews for {feature} changes.",
    "The coffee machine on floor {n} is being repaired.",
    "The lunch-and-learn on {theme} is on {day}.",
    "{p} is on parental leave until {month}.",
    "The design review for {feature} is on {day}.",
    "{p} wrote the runbook for {feature}.",
    "The team offsite is planned for {month} in {city}.",
    "Expense reports for {month} are due on the {nth}.",
    "{p} likes to pair on {theme} problems.",
    "The {feature} feature flag is enabled for internal users only.",
    "The hackathon theme this quarter is {theme}.",
    "{p} recommends the book club's pick about {theme}.",
    "Our style guide asks for type hints in new {lang} code.",
    "{p} will demo {feature} at the all-hands on {day}.",
    "The {city} office closes early on {day}.",
    "{p} collects feedback on {feature} until the end of {month}.",
    "New hires get a {lang} onboarding session with {p}.",
]
FEATURE_NAMES = [
    "dark mode", "bulk export", "onboarding flow", "saved searches", "two-factor login", "usage dashboards",
    "smart retries", "CSV import", "team invites", "audit trails", "offline sync", "SSO for partners",
]  # fmt: skip
THEMES = ["testing culture", "observability", "accessibility", "incident reviews", "technical writing", "pairing"]
CITIES = ["Lisbon", "Berlin", "Toronto", "Nairobi", "Osaka", "Krakow", "Austin"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
LANGS = ["Python", "TypeScript", "Go", "Kotlin", "Rust"]


def filler(rng: random.Random) -> tuple[str, str]:
    """An unrelated fact and its wording id (``filler.<template>``)."""
    i = rng.randrange(len(FILLERS))
    text = FILLERS[i].format(
        day=rng.choice(DAYS),
        theme=rng.choice(THEMES),
        p=person(rng),
        feature=rng.choice(FEATURE_NAMES),
        n=rng.randint(2, 9),
        month=rng.choice(MONTHS),
        city=rng.choice(CITIES),
        nth=rng.choice(["5th", "10th", "15th", "20th", "25th"]),
        lang=rng.choice(LANGS),
    )
    return text, f"filler.{i}"


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# ------------------------------------------------------------------------------------------ dataset


@dataclass
class Statement:
    """One stored fact, in time order."""

    index: int
    text: str
    topic: str | None
    valid_from: str
    subject: str | None = None  # Subject.key; None for a filler
    version: int = 0
    wording: str = "filler"  # "<family>.first.<i>", "<family>.restate.<i>" or "filler.<i>"


@dataclass
class Subject:
    key: str  # "<family>:<name>"
    family: str
    name: str
    values: list[str]
    question: str
    question_wording: str
    statements: list[int] = field(default_factory=list)  # Statement.index per version

    @property
    def latest(self) -> int:
        return len(self.values) - 1


@dataclass
class Dataset:
    seed: int
    subjects: dict[str, Subject]
    stream: list[Statement]

    def statement(self, subject: str, version: int) -> Statement:
        return self.stream[self.subjects[subject].statements[version]]

    def summary(self) -> dict[str, Any]:
        restatements = Counter(s.latest for s in self.subjects.values())
        return {
            "seed": self.seed,
            "subjects": len(self.subjects),
            "families": dict(Counter(s.family for s in self.subjects.values())),
            "facts_stored": len(self.stream),
            "statements": sum(1 for st in self.stream if st.subject),
            "restatements": sum(s.latest for s in self.subjects.values()),
            "fillers": sum(1 for st in self.stream if st.subject is None),
            "subjects_by_restatements": {str(k): restatements[k] for k in sorted(restatements)},
            "questions": len(self.subjects),
            "clock": {"start": CLOCK_START.isoformat(), "step_hours": CLOCK_STEP.total_seconds() / 3600},
        }


def generate(n_subjects: int, seed: int, *, topics: bool = True) -> Dataset:
    """The knowledge-update set for ``seed``: subjects, their versions interleaved with fillers, questions."""
    rng = random.Random(seed)
    pools = {f.key: rng.sample(f.subjects, len(f.subjects)) for f in FAMILIES}
    capacity = sum(len(p) for p in pools.values())
    if not 1 <= n_subjects <= capacity:
        msg = f"--subjects must be from 1 to {capacity}"
        raise ValueError(msg)
    subjects: dict[str, Subject] = {}
    order = [f.key for f in FAMILIES]
    rng.shuffle(order)
    i = 0
    while len(subjects) < n_subjects:
        family = FAMILY[order[i % len(order)]]
        i += 1
        if not pools[family.key]:
            continue
        name = pools[family.key].pop()
        n_versions = 1 + rng.randint(1, 3)
        q = rng.randrange(len(family.questions))
        subjects[f"{family.key}:{name}"] = Subject(
            key=f"{family.key}:{name}",
            family=family.key,
            name=name,
            values=family.values(rng, name, n_versions),
            question=cap(family.questions[q].format(s=name)),
            question_wording=f"{family.key}.question.{q}",
        )
    # Wordings: the first statement from the first-statement paraphrases, each restatement a different one.
    wordings: dict[str, list[tuple[str, str]]] = {}
    for subject in subjects.values():
        family = FAMILY[subject.family]
        f = rng.randrange(len(family.first))
        picks = rng.sample(range(len(family.restate)), subject.latest)
        wordings[subject.key] = [(family.first[f], f"{family.key}.first.{f}")] + [
            (family.restate[r], f"{family.key}.restate.{r}") for r in picks
        ]
    # Time order: subjects interleaved (weighted by what they have left), 0-2 fillers after each statement.
    left = dict.fromkeys(subjects, 0)
    stream: list[Statement] = []
    used_fillers: set[str] = set()

    def add(text: str, **kw: Any) -> Statement:
        st = Statement(
            index=len(stream), text=text, valid_from=(CLOCK_START + len(stream) * CLOCK_STEP).isoformat(), **kw
        )
        stream.append(st)
        return st

    while left:
        keys = list(left)
        key = rng.choices(keys, weights=[len(subjects[k].values) - left[k] for k in keys])[0]
        subject = subjects[key]
        version = left[key]
        template, wording = wordings[key][version]
        old = subject.values[version - 1] if version else ""
        text = template.format(s=subject.name, S=cap(subject.name), v=subject.values[version], old=old)
        family = FAMILY[subject.family]
        st = add(cap(text), topic=family.topic if topics else None, subject=key, version=version, wording=wording)
        subject.statements.append(st.index)
        left[key] += 1
        if left[key] == len(subject.values):
            del left[key]
        for _ in range(rng.choice([0, 1, 1, 2])):
            for _ in range(1000):
                text, wording = filler(rng)
                if text not in used_fillers:
                    break
            used_fillers.add(text)
            add(text, topic=rng.choice(["team", "office", "process", "events"]) if topics else None, wording=wording)
    return Dataset(seed=seed, subjects=subjects, stream=stream)


# ------------------------------------------------------------------------------------------ scoring


@dataclass
class Judged:
    """One question's answer: the ranked statements (None: an id this mode did not store)."""

    subject: Subject
    ranked: list[Statement | None]
    seconds: float
    facts: list[dict[str, Any]] = field(default_factory=list)

    def position(self, version: int) -> int | None:
        for i, st in enumerate(self.ranked):
            if st is not None and st.subject == self.subject.key and st.version == version:
                return i
        return None

    @property
    def current(self) -> int | None:
        return self.position(self.subject.latest)

    @property
    def top1_current(self) -> bool:
        return self.current == 0

    @property
    def older_first(self) -> bool:
        top = self.ranked[0] if self.ranked else None
        return top is not None and top.subject == self.subject.key and top.version < self.subject.latest

    @property
    def older_above_current(self) -> bool:
        olders = [self.position(v) for v in range(self.subject.latest)]
        current = self.current if self.current is not None else len(self.ranked)
        return any(p is not None and p < current for p in olders)

    @property
    def older_returned(self) -> int:
        return sum(1 for v in range(self.subject.latest) if self.position(v) is not None)

    def miss_kind(self) -> str:
        """What came first instead of the current version."""
        if not self.ranked:
            return "nothing returned"
        top = self.ranked[0]
        if top is None:
            return "unknown id"
        if top.subject is None:
            return "filler"
        if top.subject == self.subject.key:
            return "older version of the subject"
        family, name = top.subject.split(":", 1)
        if family == self.subject.family:
            return "other subject, same attribute"
        if name == self.subject.name:
            return "same name, other attribute"
        return "other attribute"


def mode_summary(data: Dataset, judged: list[Judged], examples: int) -> dict[str, Any]:
    n = len(judged)
    misses = [j for j in judged if not j.top1_current]
    by_wording: dict[str, list[bool]] = defaultdict(list)
    by_question: dict[str, list[bool]] = defaultdict(list)
    by_family: dict[str, list[bool]] = defaultdict(list)
    by_versions: dict[str, list[bool]] = defaultdict(list)
    for j in judged:
        by_wording[data.statement(j.subject.key, j.subject.latest).wording].append(j.top1_current)
        by_question[j.subject.question_wording].append(j.top1_current)
        by_family[j.subject.family].append(j.top1_current)
        by_versions[str(len(j.subject.values))].append(j.top1_current)

    def rates(groups: dict[str, list[bool]]) -> dict[str, dict[str, Any]]:
        return {
            k: {"n": len(v), "top1_current": round(sum(v) / len(v), 4)}
            for k, v in sorted(groups.items(), key=lambda kv: (sum(kv[1]) / len(kv[1]), kv[0]))
        }

    def example(j: Judged) -> dict[str, Any]:
        top = j.ranked[0] if j.ranked else None
        current = data.statement(j.subject.key, j.subject.latest)
        return {
            "question": j.subject.question,
            "current": current.text,
            "current_wording": current.wording,
            "current_rank": None if j.current is None else j.current + 1,
            "top1": None if top is None else top.text,
            "top1_is": j.miss_kind(),
            "top1_wording": None if top is None else top.wording,
        }

    return {
        "questions": n,
        "top1_current": round(sum(j.top1_current for j in judged) / n, 4) if n else None,
        "older_above_current": round(sum(j.older_above_current for j in judged) / n, 4) if n else None,
        "current_in_top5": round(sum(j.current is not None for j in judged) / n, 4) if n else None,
        "older_first": sum(j.older_first for j in judged),
        "older_versions_returned": sum(j.older_returned for j in judged),
        "questions_with_older_versions_returned": sum(1 for j in judged if j.older_returned),
        "misses": len(misses),
        "misses_by_top1": dict(Counter(j.miss_kind() for j in misses).most_common()),
        "top1_current_by_current_wording": rates(by_wording),
        "top1_current_by_question_wording": rates(by_question),
        "top1_current_by_family": rates(by_family),
        "top1_current_by_versions": rates(by_versions),
        "recall_latency": latency_summary([j.seconds for j in judged]),
        "miss_examples": [example(j) for j in misses[:examples]],
    }


# ------------------------------------------------------------------------------------------ ours


class Ours:
    """``haystack_osa_memory.Memory`` (MiniLM hybrid) on its own schema."""

    def __init__(self, conn_str: str, data_dir: Path) -> None:
        self.conn_str = conn_str
        self.schema = "upd_" + uuid.uuid4().hex[:12]
        self.config = MemoryConfig(
            pg_conn_str=conn_str,
            kb_schema=self.schema,
            memory_schema=self.schema,
            embedder="minilm",
            data_dir=data_dir,
        )
        self.memory = Memory(self.config, init_schema=True)
        self.memory.warm_up()
        self.redactions = 0

    @staticmethod
    def caller(scope: str) -> Caller:
        return Caller(org_id=ORG, assignment_id=scope)

    def store(self, scope: str, st: Statement, supersedes: list[str] | None = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"caller": self.caller(scope), "valid_from": st.valid_from}
        if supersedes:
            kwargs["supersedes"] = supersedes
        result = self.memory.store(st.text, st.topic, **kwargs)
        if not result.get("stored"):
            msg = f"ours did not store a fact: {result}"
            raise RuntimeError(msg)
        self.redactions += int(result.get("redactions") or 0)
        return result

    def recall(self, scope: str, query: str, **kwargs: Any) -> list[dict[str, Any]]:
        return list(self.memory.recall(query, limit=K, caller=self.caller(scope), **kwargs)["facts"])

    def drop(self) -> None:
        drop_schema(self.conn_str, self.schema)


def progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description:<34}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not enabled,
    )


@dataclass
class Suggestions:
    """Mode (b): what ``possibly_supersedes`` suggested, judged against the truth."""

    made: int = 0
    stores_with_suggestions: int = 0
    true_live: int = 0  # an earlier version of the same subject, still current: confirmed
    true_already_superseded: int = 0  # an earlier version the agent had already superseded
    false_by_kind: Counter[str] = field(default_factory=Counter)
    live_predecessors: int = 0  # earlier versions still current when a restatement was stored
    missed_predecessors: int = 0
    restatements: int = 0
    restatements_with_predecessor_suggested: int = 0
    confirm_stores: int = 0
    confirm_errors: list[str] = field(default_factory=list)
    not_reported_superseded: int = 0
    on_first_statements: int = 0
    on_fillers: int = 0
    by_wording: dict[str, list[bool]] = field(default_factory=lambda: defaultdict(list))
    false_examples: list[dict[str, str]] = field(default_factory=list)
    missed_examples: list[dict[str, str]] = field(default_factory=list)

    def summary(self, examples: int) -> dict[str, Any]:
        true = self.true_live + self.true_already_superseded
        false = sum(self.false_by_kind.values())
        return {
            "suggestions_made": self.made,
            "stores_with_suggestions": self.stores_with_suggestions,
            "true_positives": true,
            "true_positives_live": self.true_live,
            "true_positives_already_superseded": self.true_already_superseded,
            "false_positives": false,
            "false_positives_by_kind": dict(self.false_by_kind.most_common()),
            "suggestions_on_first_statements": self.on_first_statements,
            "suggestions_on_fillers": self.on_fillers,
            "precision": round(true / self.made, 4) if self.made else None,
            "precision_on_statements": round(true / (self.made - self.on_fillers), 4)
            if self.made > self.on_fillers
            else None,
            "live_predecessors": self.live_predecessors,
            "missed_predecessors": self.missed_predecessors,
            "recall": round(1 - self.missed_predecessors / self.live_predecessors, 4)
            if self.live_predecessors
            else None,
            "restatements": self.restatements,
            "restatements_with_predecessor_suggested": self.restatements_with_predecessor_suggested,
            "recall_by_restatement_wording": {
                k: {"n": len(v), "suggested": round(sum(v) / len(v), 4)}
                for k, v in sorted(self.by_wording.items(), key=lambda kv: (sum(kv[1]) / len(kv[1]), kv[0]))
            },
            "confirming_stores": self.confirm_stores,
            "confirming_store_errors": len(self.confirm_errors),
            "confirming_store_error_examples": self.confirm_errors[:examples],
            "confirmed_but_not_reported_superseded": self.not_reported_superseded,
            "false_positive_examples": self.false_examples[:examples],
            "missed_examples": self.missed_examples[:examples],
        }


def classify(new: Statement, old: Statement | None, superseded: set[str], doc_id: str) -> str:
    if old is None:
        return "unknown id (not stored in this assignment)"
    if old.index == new.index:
        return "the fact itself"
    if old.subject is not None and old.subject == new.subject and old.version < new.version:
        return "true: already superseded" if doc_id in superseded else "true"
    if new.subject is None:
        if old.subject is not None:
            return "filler stored, a statement suggested"
        same = old.wording == new.wording
        return (
            "filler stored, filler of the same template suggested" if same else "filler stored, other filler suggested"
        )
    if old.subject is None:
        return "statement stored, a filler suggested"
    family, name = old.subject.split(":", 1)
    new_family, new_name = new.subject.split(":", 1)
    if old.subject == new.subject:
        return "later version of the same subject"
    if family == new_family:
        return "other subject, same attribute"
    if name == new_name:
        return "same name, other attribute"
    return "other attribute"


@dataclass
class OursRun:
    """The ids one mode stored, and what it saw."""

    mode: str
    scope: str
    ids: dict[str, Statement] = field(default_factory=dict)
    id_of: dict[int, str] = field(default_factory=dict)  # Statement.index -> document id
    store_seconds: list[float] = field(default_factory=list)
    superseded_mismatch: list[str] = field(default_factory=list)
    suggestions: Suggestions = field(default_factory=Suggestions)

    def record(self, st: Statement, result: dict[str, Any]) -> str:
        doc_id = str(result["document_id"])
        self.ids[doc_id] = st
        self.id_of[st.index] = doc_id
        return doc_id


def store_mode(ours: Ours, data: Dataset, mode: str, scope: str, show: bool, examples: int) -> OursRun:
    run = OursRun(mode, scope)
    superseded: set[str] = set()  # the agent's view (mode b): ids it has superseded
    with progress(show) as bar:
        task = bar.add_task(f"ours {MODE_LABELS[mode]}", total=len(data.stream))
        for st in data.stream:
            supersedes = None
            if mode == "a_supersedes" and st.subject and st.version:
                supersedes = [run.id_of[data.subjects[st.subject].statements[st.version - 1]]]
            t0 = time.perf_counter()
            result = ours.store(scope, st, supersedes)
            run.store_seconds.append(time.perf_counter() - t0)
            doc_id = run.record(st, result)
            if supersedes and set(result.get("superseded") or []) != set(supersedes):
                run.superseded_mismatch.append(f"{st.text!r}: superseded={result.get('superseded')}")
            if mode == "b_agent_confirms":
                agent_confirms(ours, data, run, st, doc_id, result, superseded, examples)
            bar.advance(task)
    return run


def agent_confirms(
    ours: Ours,
    data: Dataset,
    run: OursRun,
    st: Statement,
    doc_id: str,
    result: dict[str, Any],
    superseded: set[str],
    examples: int,
) -> None:
    """The simulated agent of mode (b): confirm only true, still-current earlier versions."""
    sug = run.suggestions
    suggested = [str(s["document_id"]) for s in result.get("possibly_supersedes") or []]
    sug.made += len(suggested)
    sug.stores_with_suggestions += 1 if suggested else 0
    if suggested and st.subject is None:
        sug.on_fillers += len(suggested)
    elif suggested and st.version == 0:
        sug.on_first_statements += len(suggested)
    confirmed: list[str] = []
    for sid in suggested:
        kind = classify(st, run.ids.get(sid), superseded, sid)
        if kind == "true":
            sug.true_live += 1
            confirmed.append(sid)
        elif kind == "true: already superseded":
            sug.true_already_superseded += 1
        else:
            sug.false_by_kind[kind] += 1
            if len(sug.false_examples) < examples:
                old = run.ids.get(sid)
                sug.false_examples.append({"stored": st.text, "suggested": old.text if old else sid, "kind": kind})
    if st.subject and st.version:
        subject = data.subjects[st.subject]
        live = [run.id_of[subject.statements[v]] for v in range(st.version)]
        live = [i for i in live if i not in superseded]
        missed = [i for i in live if i not in suggested]
        sug.restatements += 1
        sug.live_predecessors += len(live)
        sug.missed_predecessors += len(missed)
        found = len(missed) < len(live)
        sug.restatements_with_predecessor_suggested += 1 if found else 0
        sug.by_wording[st.wording].append(found)
        if missed and len(sug.missed_examples) < examples:
            sug.missed_examples.append({"stored": st.text, "wording": st.wording, "missed": run.ids[missed[0]].text})
    if not confirmed:
        return
    sug.confirm_stores += 1
    try:
        again = ours.store(run.scope, st, confirmed)
    except SupersessionError as e:
        sug.confirm_errors.append(f"{st.text!r} supersedes {confirmed}: {e}")
        return
    if str(again["document_id"]) != doc_id:  # the same text must be the same document
        run.record(st, again)
    superseded.update(confirmed)
    if set(again.get("superseded") or []) != set(confirmed):
        sug.not_reported_superseded += 1


def ask(
    ours: Ours, data: Dataset, run: OursRun, questions: list[Subject], show: bool, label: str, **kwargs: Any
) -> list[Judged]:
    judged: list[Judged] = []
    with progress(show) as bar:
        task = bar.add_task(label, total=len(questions))
        for subject in questions:
            t0 = time.perf_counter()
            facts = ours.recall(run.scope, subject.question, **kwargs)
            seconds = time.perf_counter() - t0
            ranked = [run.ids.get(str(f["document_id"])) for f in facts]
            judged.append(Judged(subject, ranked, seconds, facts))
            bar.advance(task)
    return judged


def as_of_for(data: Dataset, subject: Subject) -> str:
    last = datetime.fromisoformat(data.statement(subject.key, subject.latest).valid_from)
    return (last - AS_OF_BEFORE).isoformat()


def conflict_flags(run: OursRun, judged: list[Judged]) -> dict[str, Any]:
    """Whether the answers carry ``conflicts_with`` between versions of the same subject."""
    flagged_any = both_returned = both_flagged = linked_current_above = unlinked_current_above = 0
    older_first_flagged = 0
    for j in judged:
        links = {str(f["document_id"]): set(f.get("conflicts_with") or []) for f in j.facts}
        flagged_any += 1 if any(links.values()) else 0
        current_id = run.id_of[j.subject.statements[j.subject.latest]]
        older = {run.id_of[j.subject.statements[v]] for v in range(j.subject.latest)} & set(links)
        if current_id in links and older:
            both_returned += 1
            linked = bool(links[current_id] & older) or any(current_id in links[o] for o in older)
            both_flagged += 1 if linked else 0
            above = not j.older_above_current
            linked_current_above += 1 if linked and above else 0
            unlinked_current_above += 1 if not linked and above else 0
        if j.older_first and links.get(str(j.facts[0]["document_id"])):
            older_first_flagged += 1
    return {
        "answers_with_conflicts_with": flagged_any,
        "answers_with_current_and_older": both_returned,
        "of_which_current_and_older_linked": both_flagged,
        "linked_with_current_above_older": linked_current_above,
        "not_linked_with_current_above_older": unlinked_current_above,
        "older_first_answers": sum(j.older_first for j in judged),
        "of_which_top1_has_conflicts_with": older_first_flagged,
    }


def run_ours(
    conn_str: str, data: Dataset, questions: list[Subject], show: bool, examples: int, keep: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tag = f"s{data.seed}-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory(prefix="osa-updates-ours-") as tmp:
        ours = Ours(conn_str, Path(tmp))
        try:
            warm = Statement(0, "Warm-up fact: the update benchmark starts now.", None, CLOCK_START.isoformat())
            ours.store("upd-warmup", warm)
            ours.recall("upd-warmup", "when does the benchmark start?")
            for mode in ("a_supersedes", "b_agent_confirms", "c_plain"):
                t0 = time.perf_counter()
                run = store_mode(ours, data, mode, f"upd-{mode[0]}-{tag}", show, examples)
                store_wall = time.perf_counter() - t0
                judged = ask(ours, data, run, questions, show, f"recall {MODE_LABELS[mode]}")
                summary = mode_summary(data, judged, examples)
                summary["store"] = {
                    "facts": len(data.stream),
                    "seconds": round(store_wall, 2),
                    **latency_summary(run.store_seconds),
                }
                summary["conflicts_with"] = conflict_flags(run, judged)
                if mode == "a_supersedes":
                    summary["older_first_with_supersedes"] = summary["older_first"]
                    summary["superseded_in_default_recall"] = summary["older_versions_returned"]
                    summary["superseded_not_reported_by_store"] = len(run.superseded_mismatch)
                    summary["superseded_not_reported_examples"] = run.superseded_mismatch[:examples]
                    summary["history"] = history_check(ours, data, run, questions, show)
                if mode == "b_agent_confirms":
                    summary["suggestions"] = run.suggestions.summary(examples)
                out[mode] = summary
            out["redactions"] = ours.redactions
            out["schema"] = ours.schema
        finally:
            if keep:
                close_pools()
            else:
                ours.drop()
    return out


def history_check(ours: Ours, data: Dataset, run: OursRun, questions: list[Subject], show: bool) -> dict[str, Any]:
    """(a) only: older versions are still there when asked for (include_superseded, as_of)."""
    everything = ask(ours, data, run, questions, show, "recall include_superseded=True", include_superseded=True)
    all_versions = sum(1 for j in everything if all(j.position(v) is not None for v in range(len(j.subject.values))))
    current_first = sum(1 for j in everything if j.top1_current)
    marked = 0
    for j in everything:
        older_ids = {run.id_of[j.subject.statements[v]] for v in range(j.subject.latest)}
        marked += sum(
            1 for f in j.facts if str(f["document_id"]) in older_ids and (f.get("superseded_by") or f.get("valid_to"))
        )
    past: list[Judged] = []
    with progress(show) as bar:
        task = bar.add_task("recall as_of before last update", total=len(questions))
        for subject in questions:
            t0 = time.perf_counter()
            facts = ours.recall(run.scope, subject.question, as_of=as_of_for(data, subject))
            ranked = [run.ids.get(str(f["document_id"])) for f in facts]
            past.append(Judged(subject, ranked, time.perf_counter() - t0, facts))
            bar.advance(task)
    previous_first = sum(1 for j in past if j.position(j.subject.latest - 1) == 0)
    current_returned = sum(1 for j in past if j.current is not None)
    n = len(questions)
    return {
        "include_superseded": {
            "all_versions_returned": round(all_versions / n, 4),
            "current_first": round(current_first / n, 4),
            "older_versions_returned": sum(j.older_returned for j in everything),
            "older_versions_marked_superseded": marked,
        },
        "as_of": {
            "as_of": f"the last restatement's valid_from minus {int(AS_OF_BEFORE.total_seconds())} s",
            "previous_version_first": round(previous_first / n, 4),
            "previous_version_in_top5": round(
                sum(1 for j in past if j.position(j.subject.latest - 1) is not None) / n, 4
            ),
            "current_version_returned": current_returned,
        },
    }


# ------------------------------------------------------------------------------------------ mem0


def run_mem0(
    conn_str: str, mem0_dir: Path, data: Dataset, questions: list[Subject], show: bool, examples: int, keep: bool
) -> dict[str, Any]:
    side = Mem0Side(conn_str, mem0_dir)
    out: dict[str, Any] = {"nlp": mem0_nlp_state()}
    tag = f"s{data.seed}-{uuid.uuid4().hex[:6]}"
    try:
        side.store_one("upd-warmup", "Warm-up fact: the update benchmark starts now.")
        side.recall("upd-warmup", "when does the benchmark start?", K)
        for mode in ("a_update", "c_plain"):
            scope = f"upd-{mode[0]}-{tag}"
            ids: dict[str, Statement] = {}
            memory_of: dict[str, str] = {}  # subject -> its memory id (mode a_update)
            seconds: list[float] = []
            t0 = time.perf_counter()
            with progress(show) as bar:
                task = bar.add_task(f"mem0 {MODE_LABELS[mode]}", total=len(data.stream))
                for st in data.stream:
                    started = time.perf_counter()
                    if mode == "a_update" and st.subject and st.version:
                        mid = memory_of[st.subject]
                        side.memory.update(mid, text=st.text)
                        ids[mid] = st  # the row now holds this version only
                    else:
                        mid = side.store_one(scope, st.text)
                        ids[mid] = st
                        if st.subject:
                            memory_of[st.subject] = mid
                    seconds.append(time.perf_counter() - started)
                    bar.advance(task)
            store_wall = time.perf_counter() - t0
            judged: list[Judged] = []
            with progress(show) as bar:
                task = bar.add_task(f"mem0 recall {MODE_LABELS[mode]}", total=len(questions))
                for subject in questions:
                    started = time.perf_counter()
                    found = side.memory.search(
                        subject.question, top_k=K, filters={"user_id": scope}, threshold=MEM0_THRESHOLD
                    )["results"]
                    elapsed = time.perf_counter() - started
                    ranked: list[Statement | None] = []
                    for r in found:
                        st = ids.get(str(r["id"]))
                        # An updated row must hold the text of its latest version (checked, not assumed).
                        ranked.append(st if st is not None and r.get("memory") == st.text else None)
                    judged.append(Judged(subject, ranked, elapsed, found))
                    bar.advance(task)
            summary = mode_summary(data, judged, examples)
            summary["store"] = {"facts": len(data.stream), "seconds": round(store_wall, 2), **latency_summary(seconds)}
            if mode == "a_update":
                summary["older_first_with_update"] = summary["older_first"]
                kept = 0
                for subject in questions:
                    history = side.memory.history(memory_of[subject.key])
                    texts = {h.get("old_memory") for h in history} | {h.get("new_memory") for h in history}
                    kept += (
                        1
                        if all(data.statement(subject.key, v).text in texts for v in range(len(subject.values)))
                        else 0
                    )
                summary["history"] = {
                    "search_returns_older_versions": False,
                    "as_of": None,
                    "history_call_lists_all_versions": round(kept / len(questions), 4),
                }
            out[mode] = summary
    finally:
        with suppress(Exception):
            side.close() if keep else side.drop()
    return out


# ------------------------------------------------------------------------------------------ report


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    ours = results.get("ours") or {}
    rows: list[dict[str, Any]] = []
    for mode, goal in TARGETS.items():
        value = (ours.get(mode) or {}).get("top1_current")
        comparator = "=" if goal == 1.0 else ">="
        rows.append(
            {
                "target": f"{MODE_LABELS[mode]}: top-1 current {comparator} {pct(goal)}",
                "value": value,
                "met": None if value is None else value >= goal,
            }
        )
    older = (ours.get("a_supersedes") or {}).get("older_first_with_supersedes")
    rows.append(
        {
            "target": "older value first when the newer was stored with supersedes = 0",
            "value": older,
            "met": None if older is None else older == 0,
        }
    )
    return rows


def print_report(report: dict[str, Any], examples: int) -> None:
    results = report["results"]
    table = Table(
        title=f"Knowledge updates: {report['dataset']['subjects']} subjects, {report['dataset']['restatements']} "
        f"restatements, {report['dataset']['fillers']} fillers (seed {report['dataset']['seed']}), top-{K}",
        title_justify="left",
    )
    for column in ("system", "mode", "top-1 current", "older above current", "current in top 5", "older first"):
        table.add_column(column, justify="left" if column in {"system", "mode"} else "right")
    table.add_column("target")
    table.add_column("met", justify="center")
    for system in ("ours", "mem0"):
        side = results.get(system) or {}
        for mode in ("a_supersedes", "a_update", "b_agent_confirms", "c_plain"):
            r = side.get(mode)
            if not r:
                continue
            goal = TARGETS.get(mode) if system == "ours" else None
            table.add_row(
                system,
                MODE_LABELS[mode],
                pct(r["top1_current"]),
                pct(r["older_above_current"]),
                pct(r["current_in_top5"]),
                str(r["older_first"]),
                "" if goal is None else (">= " if goal < 1 else "= ") + pct(goal),
                "" if goal is None else ("yes" if r["top1_current"] >= goal else "no"),
            )
    console.print(table)
    for t in report["targets"]:
        met = "-" if t["met"] is None else ("yes" if t["met"] else "NO")
        say(f"  target: {t['target']}: {t['value']} -> met: {met}")

    ours = results.get("ours") or {}
    if a := ours.get("a_supersedes"):
        h, every = a["history"], a["history"]["include_superseded"]
        say(
            f"(a) history: include_superseded=True returns every version for {pct(every['all_versions_returned'])} "
            f"of subjects (current first {pct(every['current_first'])}); as_of 1 min before the last "
            f"restatement puts the previous version first for {pct(h['as_of']['previous_version_first'])} "
            f"(current version returned anyway: {h['as_of']['current_version_returned']}); superseded versions in "
            f"default recall: {a['superseded_in_default_recall']}; store results not listing the superseded id: "
            f"{a['superseded_not_reported_by_store']}"
        )
    if b := ours.get("b_agent_confirms"):
        s = b["suggestions"]
        say(
            f"(b) possibly_supersedes: {s['suggestions_made']} suggestions on {s['stores_with_suggestions']} stores; "
            f"true {s['true_positives']} ({s['true_positives_already_superseded']} already superseded), "
            f"false {s['false_positives']} {s['false_positives_by_kind']}; precision {pct(s['precision'])} "
            f"({pct(s['precision_on_statements'])} on the stores of statements, fillers aside); "
            f"live predecessors {s['live_predecessors']}, missed {s['missed_predecessors']} "
            f"(recall {pct(s['recall'])}); on first statements {s['suggestions_on_first_statements']}, on fillers "
            f"{s['suggestions_on_fillers']}; confirming stores {s['confirming_stores']}, errors "
            f"{s['confirming_store_errors']}"
        )
        worst = [(k, v) for k, v in s["recall_by_restatement_wording"].items() if v["suggested"] < 1][:6]
        for wording, v in worst:
            say(f"    suggestion recall {pct(v['suggested'])} of {v['n']} for {template_of(wording)!r}")
        for e in s["false_positive_examples"][:examples]:
            say(f"    false suggestion ({e['kind']}): stored {e['stored']!r} -> suggested {e['suggested']!r}")
        for e in s["missed_examples"][:examples]:
            say(f"    missed predecessor: stored {e['stored']!r}, not suggested {e['missed']!r}")
    for system in ("ours", "mem0"):
        for mode in ("a_supersedes", "b_agent_confirms", "c_plain", "a_update"):
            r = (results.get(system) or {}).get(mode)
            if not r or not r["misses"]:
                continue
            say(f"{system} {MODE_LABELS[mode]}: {r['misses']} misses, top-1 was {r['misses_by_top1']}")
            worst = [(k, v) for k, v in r["top1_current_by_current_wording"].items() if v["top1_current"] < 1][:6]
            for wording, v in worst:
                say(f"    top-1 current {pct(v['top1_current'])} of {v['n']} if current is {template_of(wording)!r}")
            for e in r["miss_examples"][:examples]:
                say(
                    f"    Q {e['question']!r}: top-1 {e['top1']!r} ({e['top1_is']}); current {e['current']!r} "
                    f"at rank {e['current_rank']}"
                )
            if system == "ours" and (c := r.get("conflicts_with")):
                say(f"    conflicts_with in answers: {c}")
    if "skipped" in (results.get("mem0") or {}):
        say(f"mem0 skipped: {results['mem0']['skipped']}")


def template_of(wording: str) -> str:
    if wording.startswith("filler."):
        return FILLERS[int(wording.split(".")[1])]
    family, kind, i = wording.rsplit(".", 2)
    f = FAMILY[family]
    pool = {"first": f.first, "restate": f.restate, "question": f.questions}[kind]
    return pool[int(i)]


# ------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--subjects", type=int, default=150, help="subjects (each stated, then restated 1-3 times)")
    parser.add_argument("--seed", type=int, default=7, help="the generator's seed")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--only", choices=["both", "ours", "mem0"], default="both", help="which systems to run")
    parser.add_argument("--examples", type=int, default=8, help="examples of misses and false suggestions to print")
    parser.add_argument("--no-topics", action="store_true", help="store every fact without a topic")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (0 = torch's default)")
    parser.add_argument("--dump-data", type=Path, help="write the generated facts and questions as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the schema and tables")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    capacity = sum(len(f.subjects) for f in FAMILIES)
    if not 1 <= args.subjects <= capacity:
        parser.error(f"--subjects must be from 1 to {capacity}")
    return args


def dump(data: Dataset, path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "summary": data.summary(),
                "facts": [
                    {
                        "valid_from": st.valid_from,
                        "text": st.text,
                        "topic": st.topic,
                        "subject": st.subject,
                        "version": st.version,
                        "wording": st.wording,
                    }
                    for st in data.stream
                ],
                "questions": [
                    {"subject": s.key, "question": s.question, "current": data.statement(s.key, s.latest).text}
                    for s in data.subjects.values()
                ],
            },
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    want = ["ours", "mem0"] if args.only == "both" else [args.only]
    results: dict[str, Any] = {}
    if "mem0" in want and importlib.util.find_spec("mem0") is None:
        note = "mem0ai is not installed (pip install -e '.[bench]')"
        say(f"{note}: the mem0 side is skipped")
        want.remove("mem0")
        results["mem0"] = {"skipped": note}
        if not want:
            return 2
    data = generate(args.subjects, args.seed, topics=not args.no_topics)
    if args.dump_data:
        dump(data, args.dump_data)
    questions = list(data.subjects.values())
    random.Random(args.seed + 1).shuffle(questions)
    torch_threads = set_torch_threads(args.torch_threads)
    started_at = datetime.now(UTC)
    machine = machine_info()
    summary = data.summary()
    say(
        f"{started_at:%Y-%m-%d %H:%M UTC} - {machine['cpu_model']}, {machine['cores']} cores, "
        f"{machine['ram_gib']} GiB RAM, load {machine['load_avg_at_start']}"
    )
    say(
        f"seed {args.seed}: {summary['subjects']} subjects in {len(summary['families'])} attributes, "
        f"{summary['statements']} statements ({summary['restatements']} restatements), {summary['fillers']} fillers, "
        f"{summary['questions']} questions; systems: {', '.join(want)}; torch threads {torch_threads}"
    )
    show = not args.no_progress and console.is_terminal  # a bar in a file or pipe only leaves blank lines
    started = time.perf_counter()
    phases: dict[str, float] = {}
    version_info: dict[str, Any] = {}
    with database("osa-updates-") as conn_str, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        if "ours" in want:
            t0 = time.perf_counter()
            results["ours"] = run_ours(conn_str, data, questions, show, args.examples, args.keep)
            phases["ours_seconds"] = round(time.perf_counter() - t0, 1)
        if "mem0" in want:
            t0 = time.perf_counter()
            with mem0_environment() as mem0_dir:
                results["mem0"] = run_mem0(conn_str, mem0_dir, data, questions, show, args.examples, args.keep)
            phases["mem0_seconds"] = round(time.perf_counter() - t0, 1)
        with suppress(Exception):
            version_info = versions(conn_str)
        close_pools()
    machine["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report: dict[str, Any] = {
        "date": started_at.isoformat(timespec="seconds"),
        "machine": machine,
        "versions": version_info,
        "params": {
            "subjects": args.subjects,
            "seed": args.seed,
            "k": K,
            "topics": not args.no_topics,
            "torch_threads": torch_threads,
            "mem0_threshold": MEM0_THRESHOLD,
            "as_of_before_last_restatement_seconds": AS_OF_BEFORE.total_seconds(),
        },
        "dataset": summary,
        "results": results,
        "targets": targets(results),
        "phases": phases,
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    print_report(report, args.examples)
    say(
        f"total wall time {report['total_seconds']:.1f} s; phases {phases}; load average at start "
        f"{machine['load_avg_at_start']}, at end {machine['load_avg_at_end']}"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        say(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
