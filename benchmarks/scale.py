"""Scale benchmark: does an assignment's fact stay findable in a big knowledge base, and how fast?

Usage::

    python benchmarks/scale.py --chunks 100000 [--assignments 200] [--facts-per-assignment 20]
                               [--queries 100] [--json out.json] [--plot out.png] [--explain] [--no-mcp]
    python benchmarks/scale.py --big-scope --chunks 10000 [--assignments 2] [--scope-sizes 1000,10000,100000]
                               [--queries 200] [--exact-scope-max 5000] [--torch-threads 1] [--json out.json]

``PG_CONN_STR`` selects the database (a fresh schema is created and dropped at the end); when it
is unset, an embedded PostgreSQL + pgvector is started in a temporary directory and deleted after.

Method
------
**Knowledge base.** ``--chunks`` customer chunks (documents of 1-4 chunks; governing row with
audience ``customer`` + pgvector-haystack chunks) and ``--assignments`` x ``--facts-per-assignment``
facts (governing row ``agent_fact``/``ai_internal`` + marked chunk) spread over four orgs. Everything
is about one of ``--topics`` topics. A topic has three keywords (a system, an aspect, a common
word, e.g. "payroll credentials checklist") and an anchor vector. Customer chunks pick their topic
with Zipf popularity (a few topics are covered by many documents, most by few); their text repeats
the topic keywords 1-4 times among generated filler sentences, and their vector has a cosine to the
anchor drawn uniformly from [0.30, 0.95]. A fact mentions its topic's keywords once among specific
details (person, team, ticket code), and its vector has a cosine of 0.6-0.8 to the anchor.
Vectors are deterministic synthetic 384-d unit vectors. Customer chunks are bulk-loaded with ``COPY``;
facts are written through the product's writer (the rows of ``ScopeMarkerWriter``, written by
``GovernedFactWriter`` / ``FactRepository.write`` in batches of 64, the synthetic vector as embedding), so that
each fact gets its recall row in ``osa_fact_terms`` as in production (a fact loaded by other means has none,
and recall reads it the slow way, from its chunk). The benchmark adds ``assignment_id`` to the facts' chunk
meta (design (b) filters on it; the product does not write it there).

**Targets.** ``--queries`` facts (one per assignment, on distinct topics) are written through the
real ``Memory.store`` pipeline, which gives the store latency. Each is queried twice:

- *own text*: the fact's text and the fact's own vector;
- *paraphrase*: the topic keywords plus the fact's team, and a vector with cosine 0.9 to the
  topic anchor and a small component towards the fact (cosine ~0.74 to the fact). Topic chunks
  whose anchor cosine exceeds ~0.82 are closer to it than the fact, and topic chunks that repeat
  the keywords outrank the fact lexically: the bigger the topic, the more of them.

A query is *complete* when the target fact is in the top ``--k``; ``rows/k`` is how many rows a
design returned on average (a post-filter or a filtered HNSW scan returns fewer than k). Latency is
the wall time of the database work per query, measured in this process after three warm-up
queries (statements, pool checkout, post-filter look-ups; the query "embedding" is a lookup table,
so embedding time is excluded). Store latency is ``Memory.store`` end to end, without and then
with the HNSW index to maintain. Bulk import is rows per second of ``COPY`` (governing rows +
chunks, with the keyword GIN and btree indexes in place); text generation is timed apart. Memory
is RSS and PSS summed over the postmaster and its children (psutil; only when the server runs on
this machine), at each phase and as the peak of one-second samples.

**Through MCP** (skipped with ``--no-mcp``). The same recall as an agent makes it: a real
``osa-memory serve`` in its own process (``python -m haystack_osa_memory.cli serve`` on a free loopback
port), configured through ``OSA_MEMORY_*`` variables with this run's database, schema and settings,
and the official ``mcp`` client over streamable HTTP. One bearer token per queried assignment is
created in process (``TokenStore.create``, bound to the target's org and assignment); each token gets
ONE client session (``initialize`` + ``list_tools``, timed apart as "session open"), in which
``kb_memory_recall`` (``query``, ``limit`` = k) is called for every query kind of that assignment's
targets, after three unmeasured warm-up calls. Only ``ClientSession.call_tool`` is timed: the
JSON-RPC request, the HTTP POST over loopback, the bearer-token check (one PostgreSQL look-up per
request), argument validation, ``Memory.recall`` in the server, and the JSON result back (SSE
framing included). The server runs with ``OSA_MEMORY_EMBEDDER=none``, i.e. LEXICAL recall and no
query embedding: the in-process embedders here are lookup tables a server cannot have, and a real
embedder's query vectors would not match the synthetic stored vectors. So that the comparison is
like for like, an in-process lexical ``Memory.recall`` on the same targets is measured right before
(row "Memory.recall (lexical)"); the difference of the two rows is what MCP costs. A call that
errors, answers for another assignment or answers "degraded" stops the run with the server's log;
completeness through MCP is whether the target's document id is among the returned facts. The
server is stopped (SIGTERM, then SIGKILL after 15 s) when the measurement ends, whatever happens.

**Designs.**

- (a) *post-filter* (the old design): top k over the whole chunk table (exact scan, then with the
  HNSW index; and ``ts_rank_cd`` keyword search as pgvector-haystack does it), then keep the rows
  whose governing row is the caller's assignment.
- (b) *WHERE filter + HNSW*: ``WHERE meta->>'assignment_id' = ...`` on the chunk table (the
  pgvector-haystack filter; the benchmark copies ``assignment_id`` into the chunk ``meta`` for
  this, ``Memory.store`` does not write it there) with an HNSW index, with pgvector's default scan
  and with ``hnsw.iterative_scan = relaxed_order``.
- (c) *ours*: ``FactRepository.scoped_candidates`` (the scope applied in SQL, the scope's rows
  ranked by BM25 and exact vector distance, the text of the ranked facts fetched), and the full
  ``Memory.recall`` pipeline (hybrid, fused).

Order of a run: bulk load, ANALYZE, store the targets, measure the designs that need no vector
index, lexical recall in process and through MCP (server started and stopped), build the HNSW index
(``--maintenance-work-mem``), measure the HNSW designs and ours again, store more facts (latency
with the index), drop the schema.

The numbers of (a) and (b) depend on this synthetic topic model (topic sizes, noise levels); the
point of the benchmark is the trend with ``--chunks`` and that (c) does not depend on it.

Big scopes (``--big-scope``)
----------------------------
Recall reads every fact of a scope and ranks them exactly (the *exact path*), which costs time in
proportion to the scope; past ``FactRepository.exact_scope_max`` recall rows it takes candidates from the
indexes of ``osa_fact_terms`` instead (the *big-scope path*). This mode measures both on one assignment as it
grows through ``--scope-sizes`` (default 1,000, 10,000 and 100,000 facts; ``--facts-per-assignment N`` alone
means the default sizes below N, then N), instead of the design comparison:

- ``--chunks`` customer chunks are COPY-loaded as above; ``--assignments`` assignments of one org (default 2:
  only the assignment id tells the scopes apart) grow together, batch by batch in turn, through
  ``Memory.import_items`` with the real bundled MiniLM (``MiniLMDocumentEmbedder`` in the configuration's
  ``document_precision``: float32 by default, the product's forward batches of 8 inside import batches of 64).
  The first assignment is measured; the others store the same texts in their own scopes (embedded once:
  ``CachingDocumentEmbedder``), so the table's HNSW and GIN indexes hold other scopes' near neighbours. Facts are
  template facts on Zipf-popular topics with distinct details (a ticket code used once, a person, a team, a
  place, a day, a month, an hour). A progress bar is shown while storing (a line per tenth when the output is not
  a terminal). After each growth the tables are vacuumed and analyzed (as autovacuum would soon after such an
  import) and the measured scope must hold one usable recall row per fact.
- At each size ``--queries`` facts (default 200, fixed seed) are queried by their own text and by a
  paraphrase (the same person, ticket code, system and aspect in other words) through ``Memory.recall``
  (top ``--k``, default 8) in process, **query embedding included** (``MiniLMTextEmbedder``, the configured
  query precision, int8 by default). Every query runs on three paths back to back (the order alternates), on
  a fresh ``Memory``: the scope held in memory and ranked exactly (``FactRepository.scope_cache``, "held"; a
  scope bigger than the cache takes the big path there too); the big path (indexes, cache off); the
  exact path. The big paths with ``exact_scope_max`` = ``--exact-scope-max`` (default
  the product's ``EXACT_SCOPE_MAX``), or 0 where the scope is not bigger than that (the row says
  "forced"), and the exact path with ``exact_scope_max`` = 10^9, set on the ``FactRepository`` that recall
  uses and restored afterwards. Reported per path: latency p50/p95/p99, the share of queries whose fact is
  in the top k (own text, paraphrase), degraded answers; across paths: the share of queries with identical
  top-k sets (and identical order), the mean overlap of the two top k, and the speed-up exact/big.
  The query embedding alone is timed apart.
- Targets (printed as met / not met / not measured): big path p95 <= 50 ms at 100,000 facts; recall at
  10,000 facts (the product's path there) no slower than the exact path at 1,000 (p50 and p95); own text in
  the top 8 >= 99 % on the big path at every size.
- torch runs MiniLM on ``--torch-threads`` intra-op threads (default 1): on a machine whose cores other work
  shares, torch's default (one thread per core) spins against that work (on this project's 2-core VM, with
  one core busy elsewhere, 15 documents/s instead of 198).
- The JSON (``--json``) is written after every size, so a run stopped at 100,000 keeps 1,000 and 10,000.
  It records a fingerprint (sha256, modification time) of ``store/facts.py`` and ``store/ranking.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import numpy as np
import psutil
import psycopg
from haystack import Document, component
from haystack.utils import Secret
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.types.json import Jsonb
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import database, machine_info, percentiles
from haystack_osa_memory import Caller, GovernedFactWriter, Memory, MemoryConfig, MemoryStore, ScopeMarkerWriter
from haystack_osa_memory.config import ENVIRONMENT
from haystack_osa_memory.markers import content_hash, document_id, marked_fact
from haystack_osa_memory.store.database import close_pools
from haystack_osa_memory.store.facts import (
    EXACT_SCOPE_MAX,
    FACT_AUDIENCE,
    FactRepository,
    vector_literal,
)
from haystack_osa_memory.store.ranking import RankingParams
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.store.tokens import TokenStore
from haystack_osa_memory.transfer import ImportItem

DIM = 384
ORGS = ("acme", "globex", "initech", "umbrella")
QueryKind = Literal["own", "para"]
KINDS: tuple[QueryKind, ...] = ("own", "para")
#: Facts per `Memory.import_items` batch (its default: one store-pipeline run and one pipelined write each).
IMPORT_BATCH = 64

# Vector model (cosines to the topic anchor).
CHUNK_COS = (0.30, 0.95)
FACT_COS = (0.60, 0.80)
PARA_ANCHOR, PARA_FACT = 0.90, 0.15


def words(text: str) -> tuple[str, ...]:
    """A word list written as one string."""
    return tuple(text.split())


SYSTEMS = words(
    "ledger gateway scheduler warehouse payroll mailer catalog checkout inventory kiosk telemetry firewall "
    "router printer scanner dashboard wiki helpdesk intranet timesheet badge elevator thermostat projector "
    "laptop tablet switchboard voicemail turnstile locker parking cafeteria shuttle hangar freezer boiler "
    "generator antenna satellite vpn"
)
ASPECTS = words(
    "credentials rotation outage maintenance migration renewal upgrade audit escalation failover licensing provisioning"
)
COMMONS = words("procedure checklist contact policy window handbook runbook quota")
TEAMS = words("platform finance facilities security support legal data mobile sales research")
PLACES = words("Berlin Lisbon Osaka Toronto Nairobi Lyon Austin Porto Seoul Dublin Oslo Quito")
DAYS = words("Monday Tuesday Wednesday Thursday Friday")
MONTHS = words("January March April June August October November")
NOUNS = words(
    "budget roadmap invoices onboarding hiring travel expenses feedback training contracts forecasts "
    "refunds shipping pricing receipts interviews newsletters benchmarks"
)
EVENTS = words("review incident offsite release retrospective workshop demo kickoff")
FIRST = words("Ana Bruno Chiara Dmitri Esra Farid Greta Hiro Ines Jonas Kemal Lena Mateo Nadia Omar Priya")
LAST = words("Okafor Lindqvist Moreau Tanaka Silva Novak Haddad Brennan Kowalski Reyes Fischer Mensah")

TOPIC_SENTENCES = (
    "The {system} {aspect} {common} for {place} is reviewed by the {team} team every {day}.",
    "{Team} updated the {system} {common} and the {aspect} notes after the {month} {event}.",
    "Customers asking about {system} {aspect} should read the {common} page first.",
    "Our {system} {aspect} {common} guide covers {noun}, {noun2} and the {system} {aspect} itself.",
    "If the {system} {aspect} fails, follow the {common} in the {place} binder and call {team}.",
    "{System} {aspect}: see {common} section {section} before the {month} {event}.",
    "Since {month}, every {system} {aspect} request needs the {common} signed by {person}.",
)
FILLER_SENTENCES = (
    "{Team} met in {place} on {day} to discuss {noun} and {noun2}.",
    "The {month} {event} covered {noun}, {noun2} and a short demo from {team}.",
    "Questions about {noun} go to the {team} desk in {place}.",
    "{Person} summarised the {event}: {noun} is on track, {noun2} slipped to {month}.",
    "Remember to file {noun} before {day}; {team} closes the books at {hour}.",
    "The {place} office moves its {noun} archive to the new shelves in {month}.",
)
FACT_TEMPLATES = (
    "{System} {aspect} {common}: {person} from the {team} team signs off, normally on {day} after {hour}; "
    "keep ticket {code} open until then.",
    "Note for later: the {system} {aspect} {common} moved to {place} in {month}, {person} ({team}) is the one "
    "to ask; reference {code}.",
    "When the {system} {aspect} {common} is due, message {person} on {day} morning; the {team} runbook {code} "
    "lives in {place}.",
    "Learned the hard way: {system} {aspect} needs the {common} from {team} ({person}) first, see {code}.",
)

console = Console(width=None if sys.stdout.isatty() else 150)
VECTOR_LITERAL = re.compile(r"'\[[-0-9.e,]+\]'")


# --------------------------------------------------------------------------------------------- text


class _Slots(dict[str, str]):
    """``str.format_map`` mapping that draws each missing field at random (capitalised if asked)."""

    def __init__(self, rnd: random.Random, fixed: dict[str, str]) -> None:
        super().__init__()
        self.rnd = rnd
        self.fixed = fixed

    def __missing__(self, key: str) -> str:
        low = key.lower()
        value = self.fixed.get(low)
        if value is None:
            value = _draw(low, self.rnd)
        return value[:1].upper() + value[1:] if key[:1].isupper() else value


def _draw(slot: str, rnd: random.Random) -> str:
    if slot == "hour":
        return f"{rnd.randint(7, 18)}:{rnd.choice(('00', '15', '30', '45'))}"
    if slot == "person":
        return f"{rnd.choice(FIRST)} {rnd.choice(LAST)}"
    if slot == "section":
        return str(rnd.randint(1, 60))
    if slot == "code":
        return "".join(rnd.choices("ABCDEFGHJKLMNPQRSTUVWXYZ", k=2)) + f"-{rnd.randint(1000, 9999)}"
    pools = {"team": TEAMS, "place": PLACES, "day": DAYS, "month": MONTHS, "noun": NOUNS, "noun2": NOUNS}
    return rnd.choice(pools.get(slot, EVENTS))


def fill(template: str, rnd: random.Random, **fixed: str) -> str:
    return template.format_map(_Slots(rnd, fixed))


# --------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Params:
    """Parameters of one run."""

    chunks: int
    assignments: int
    facts_per_assignment: int
    queries: int
    topics: int
    k: int
    seed: int
    batch: int
    hnsw_m: int
    hnsw_ef_construction: int
    ef_search: int
    maintenance_work_mem: str
    big_scope: bool = False
    scope_sizes: tuple[int, ...] = ()
    exact_scope_max: int = EXACT_SCOPE_MAX
    torch_threads: int = 1


@dataclass(frozen=True)
class Topic:
    words: dict[str, str]
    anchor: np.ndarray


@dataclass(frozen=True)
class Target:
    """A queried fact: stored through Memory.store, then looked up by its own text and a paraphrase."""

    caller: Caller
    topic: int
    text: str
    paraphrase: str
    vector: np.ndarray
    paraphrase_vector: np.ndarray
    document_id: str = ""

    def query(self, kind: QueryKind) -> tuple[str, np.ndarray]:
        return (self.text, self.vector) if kind == "own" else (self.paraphrase, self.paraphrase_vector)


def unit(v: np.ndarray) -> np.ndarray:
    """``v`` (or each row of it) scaled to length 1, as float32."""
    out: np.ndarray = (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)
    return out


def orthogonal_unit(rng: np.random.Generator, *basis: np.ndarray) -> np.ndarray:
    """Random unit vectors (one per row) orthogonal to each row of every ``basis`` array."""
    g = rng.standard_normal(basis[0].shape)
    for b in basis:
        g -= (g * b).sum(axis=-1, keepdims=True) * b
    return unit(g)


class Corpus:
    """Topics (keywords, anchor, Zipf popularity) and the generators of texts and vectors."""

    def __init__(self, params: Params) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.rnd = random.Random(params.seed)
        combos = [(s, a, c) for s in SYSTEMS for a in ASPECTS for c in COMMONS]
        if params.topics > len(combos):
            msg = f"--topics must be at most {len(combos)}"
            raise SystemExit(msg)
        picked = self.rnd.sample(combos, params.topics)
        anchors = unit(self.rng.standard_normal((params.topics, DIM)))
        self.topics = [Topic({"system": s, "aspect": a, "common": c}, anchors[i]) for i, (s, a, c) in enumerate(picked)]
        self.anchors = anchors
        weights = 1.0 / np.arange(1, params.topics + 1)
        self.rng.shuffle(weights)
        self.popularity = weights / weights.sum()

    def vectors(self, topics: np.ndarray, cosines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectors with the given cosine to their topic anchor; also returns the orthogonal parts."""
        anchors = self.anchors[topics]
        ortho = orthogonal_unit(self.rng, anchors)
        out = cosines[:, None] * anchors + np.sqrt(1 - cosines**2)[:, None] * ortho
        return unit(out), ortho

    def chunk_text(self, topic: int) -> str:
        rnd = self.rnd
        words = self.topics[topic].words
        parts = [fill(rnd.choice(TOPIC_SENTENCES), rnd, **words) for _ in range(rnd.randint(1, 4))]
        parts += [fill(rnd.choice(FILLER_SENTENCES), rnd) for _ in range(rnd.randint(2, 5))]
        rnd.shuffle(parts)
        return " ".join(parts)

    def fact_text(self, topic: int) -> tuple[str, str]:
        """A fact and its team (used by the paraphrase query)."""
        team = self.rnd.choice(TEAMS)
        text = fill(self.rnd.choice(FACT_TEMPLATES), self.rnd, team=team, **self.topics[topic].words)
        return text, team

    def customer_batches(self, org_of: Callable[[int], str]) -> Iterator[tuple[list[tuple[Any, ...]], list[Any]]]:
        """Batches of (governing rows, chunk rows) until ``--chunks`` chunks exist."""
        p, rnd = self.params, self.rnd
        made, doc = 0, 0
        while made < p.chunks:
            size = min(p.batch, p.chunks - made)
            sizes: list[int] = []
            while sum(sizes) < size:
                sizes.append(min(rnd.randint(1, 4), size - sum(sizes)))
            doc_topics = self.rng.choice(p.topics, size=len(sizes), p=self.popularity)
            docs = [(int(t), n) for t, n in zip(doc_topics, sizes, strict=True)]  # (topic, chunks)
            topics = np.repeat([t for t, _ in docs], [n for _, n in docs])
            cosines = self.rng.uniform(*CHUNK_COS, size=len(topics))
            vectors, _ = self.vectors(topics, cosines)
            gov, chunks, i = [], [], 0
            for topic, n in docs:
                org = org_of(doc)
                doc_id = document_id(org, "kb", content_hash(f"customer-{doc}"))
                texts = [self.chunk_text(topic) for _ in range(n)]
                words = self.topics[topic].words
                title = f"{words['system'].title()} {words['aspect']} guide"
                gov.append(
                    (doc_id, org, None, "kb", "upload", "customer", "approved", content_hash("\n".join(texts)),
                     title, "{}")
                )  # fmt: skip
                for part, text in enumerate(texts):
                    meta = {"document_id": doc_id, "org_id": org, "source": "upload", "audience": "customer"}
                    chunks.append((f"{doc_id}-{part}", vectors[i], text, Jsonb({**meta, "part": part})))
                    i += 1
                doc += 1
            made += size
            yield gov, chunks

    def fact_items(self, topics: list[int]) -> list[tuple[str, np.ndarray]]:
        """Texts and synthetic vectors of bulk facts on the given topics (stored through the product's writer)."""
        vectors, _ = self.vectors(np.array(topics), self.rng.uniform(*FACT_COS, size=len(topics)))
        return [(self.fact_text(topic)[0], vector) for topic, vector in zip(topics, vectors, strict=True)]

    def targets(self, callers: list[Caller]) -> list[Target]:
        topics = np.array(self.rnd.sample(range(self.params.topics), len(callers)))
        cosines = self.rng.uniform(*FACT_COS, size=len(callers))
        vectors, ortho = self.vectors(topics, cosines)
        anchors = self.anchors[topics]
        noise = orthogonal_unit(self.rng, anchors, ortho)
        rest = np.sqrt(1 - PARA_ANCHOR**2 - PARA_FACT**2)
        para = unit(PARA_ANCHOR * anchors + PARA_FACT * ortho + rest * noise)
        out = []
        for caller, topic, vector, pvec in zip(callers, topics, vectors, para, strict=True):
            text, team = self.fact_text(int(topic))
            words = self.topics[int(topic)].words
            paraphrase = f"{words['system']} {words['aspect']} {words['common']} {team}"
            out.append(Target(caller, int(topic), text, paraphrase, vector, pvec))
        return out


# --------------------------------------------------------------------------------------------- helpers


@component
class LookupTextEmbedder:
    """The synthetic vector of a known query text (stands in for a real embedder; costs nothing)."""

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = vectors

    @component.output_types(embedding=list[float])
    def run(self, text: str) -> dict[str, list[float]]:
        return {"embedding": self.vectors[text]}


@component
class LookupDocumentEmbedder:
    """The synthetic vector of a known fact text."""

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = vectors

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, list[Document]]:
        return {"documents": [replace(d, embedding=self.vectors[d.content or ""]) for d in documents]}


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description:<44}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def find_postmaster(conn: psycopg.Connection[Any]) -> psutil.Process | None:
    """The postmaster serving ``conn``, when the server runs on this machine (else ``None``)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    try:
        postmaster = psutil.Process(int(row[0]) if row else -1).parent()
    except psutil.Error:
        return None
    if postmaster is None or "postgres" not in postmaster.name():
        return None
    return postmaster


def postgres_memory(postmaster: psutil.Process) -> dict[str, float] | None:
    """RSS and PSS (MiB) summed over the postmaster and all its children.

    RSS counts shared buffers once per process that touched them; PSS splits shared pages
    between the processes that map them, so its sum is the better estimate of the real footprint.
    """
    try:
        procs = [postmaster, *postmaster.children(recursive=True)]
    except psutil.Error:
        return None
    rss = pss = 0
    for proc in procs:
        with suppress(psutil.Error):
            info = proc.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
    return {"processes": len(procs), "rss_mib": round(rss / 2**20, 1), "pss_mib": round(pss / 2**20, 1)}


class MemorySampler(threading.Thread):
    """Samples the server's memory every ``interval`` seconds and keeps the peaks."""

    def __init__(self, postmaster: psutil.Process, interval: float = 1.0) -> None:
        super().__init__(daemon=True, name="postgres-memory-sampler")
        self.postmaster = postmaster
        self.interval = interval
        self.peak: dict[str, float] = {"processes": 0, "rss_mib": 0.0, "pss_mib": 0.0}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            sample = postgres_memory(self.postmaster)
            if sample is not None:
                self.peak = {key: max(self.peak[key], value) for key, value in sample.items()}

    def stop(self) -> dict[str, float]:
        self._stop_event.set()
        self.join()
        return self.peak


@dataclass(frozen=True)
class Hit:
    """One query's outcome on one side: was the target in the top k, and how many rows came back."""

    found: bool
    returned: int


@dataclass
class MethodResult:
    """Completeness and latency of one design on one side."""

    design: str
    side: str
    completeness: dict[str, float]
    returned: float
    latency_ms: dict[str, float]
    queries: int
    note: str = ""


@dataclass
class Report:
    machine: dict[str, Any]
    params: dict[str, Any]
    started_at: str
    server: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    store_latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    results: list[MethodResult] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    sizes_mib: dict[str, float] = field(default_factory=dict)
    plans: dict[str, str] = field(default_factory=dict)
    mcp: dict[str, Any] = field(default_factory=dict)
    big_scope: dict[str, Any] = field(default_factory=dict)
    total_seconds: float = 0.0
    load_avg_at_end: list[float] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- MCP

MCP_TOOL = "kb_memory_recall"
MCP_WARM_UP_CALLS = 3
SERVER_START_TIMEOUT_S = 90.0
SERVER_STOP_TIMEOUT_S = 15.0
OSA_MEMORY = (sys.executable, "-m", "haystack_osa_memory.cli")  # `osa-memory`, from this interpreter
#: MemoryConfig settings handed to the server as OSA_MEMORY_* variables (so both sides read the same data).
SERVER_SETTINGS = (
    "kb_schema",
    "chunk_table",
    "governing_table",
    "memory_schema",
    "embedding_dimension",
    "language",
    "embedder",
    "dataset",
    "statement_timeout_ms",
)
MCP_TIMED = (
    "ClientSession.call_tool only: JSON-RPC request, HTTP POST over loopback, bearer-token check (a PostgreSQL "
    "lookup per request), argument validation, Memory.recall in the server (lexical scoped SQL, ACL, marker "
    "strip; no query embedding), JSON result and its SSE framing back to the client. Not timed: opening the "
    "session (initialize + list_tools, reported apart) and parsing the result's JSON here."
)


class McpCallError(RuntimeError):
    """A tool call through MCP failed (tool error, protocol error, or an answer that is not a recall)."""


def describe(error: BaseException) -> str:
    """``Type: message`` of an error, or of every error inside an exception group (as anyio raises them)."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(describe(e) for e in error.exceptions)
    return f"{type(error).__name__}: {error}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(config: MemoryConfig, conn_str: str, data_dir: Path) -> dict[str, str]:
    """This process's environment minus every osa-memory setting, plus the benchmark's settings."""
    env = {key: value for key, value in os.environ.items() if key not in ENVIRONMENT}
    variable = {name: var for var, name in ENVIRONMENT.items()}
    for name in SERVER_SETTINGS:
        env[variable[name]] = str(getattr(config, name))
    env |= {"PG_CONN_STR": conn_str, "OSA_MEMORY_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    return env


@dataclass
class McpServer:
    """``osa-memory serve`` in its own process on a free loopback port."""

    env: dict[str, str]
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def log_tail(self, lines: int = 40) -> str:
        with suppress(OSError):
            return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        return "(no server log)"

    def start(self) -> None:
        """Start the server and wait until ``/status`` answers (the pipelines are set up by then)."""
        command = [*OSA_MEMORY, "serve", "--port", str(self.port), "--log-level", "warning"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                msg = f"osa-memory serve exited with {self.proc.returncode}:\n{self.log_tail()}"
                raise RuntimeError(msg)
            with suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/status", timeout=1).status_code == 200:
                    return
            time.sleep(0.2)
        msg = f"osa-memory serve did not answer /status within {SERVER_START_TIMEOUT_S:.0f} s:\n{self.log_tail()}"
        raise RuntimeError(msg)

    def stop(self) -> None:
        """Terminate the server (kill it if it does not exit in time) and reap it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(SERVER_STOP_TIMEOUT_S)


@contextmanager
def running_server(config: MemoryConfig, conn_str: str) -> Iterator[McpServer]:
    """A started :class:`McpServer` on the benchmark's schema; stopped on the way out, whatever happens."""
    with tempfile.TemporaryDirectory(prefix="osa-bench-mcp-") as tmp:
        server = McpServer(server_env(config, conn_str, Path(tmp) / "data"), Path(tmp) / "server.log")
        try:
            server.start()
            yield server
        finally:
            server.stop()


@asynccontextmanager
async def mcp_session(url: str, token: str) -> AsyncIterator[ClientSession]:
    """An initialised session of the official MCP client (streamable HTTP) with ``token`` as bearer."""
    async with (
        httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        # call_tool lists the tools on a session's first call (to validate output schemas): do it here, untimed.
        await session.list_tools()
        yield session


async def recall_over_mcp(session: ClientSession, target: Target, kind: QueryKind, k: int) -> tuple[float, Hit]:
    """(seconds of the tool call, outcome) of one ``kb_memory_recall``; raises :class:`McpCallError` on failure."""
    text, _ = target.query(kind)
    t0 = time.perf_counter()
    result = await session.call_tool(MCP_TOOL, {"query": text, "limit": k})
    elapsed = time.perf_counter() - t0
    body = "".join(getattr(c, "text", "") for c in result.content)
    if result.isError:
        msg = f"{MCP_TOOL} returned an error for {target.caller.assignment_id} ({kind}): {body}"
        raise McpCallError(msg)
    try:
        answer = json.loads(body)
        ids = [fact["document_id"] for fact in answer["facts"]]
    except (ValueError, KeyError, TypeError) as e:
        msg = f"{MCP_TOOL} answered something that is not a recall result ({e!r}): {body[:500]}"
        raise McpCallError(msg) from None
    if answer.get("assignment_id") != target.caller.assignment_id or "degraded" in answer:
        msg = f"{MCP_TOOL} answered for the wrong assignment or degraded: {body[:500]}"
        raise McpCallError(msg)
    return elapsed, Hit(target.document_id in ids, len(ids))


@dataclass
class McpRun:
    """What the MCP measurement collected."""

    call_seconds: list[float] = field(default_factory=list)
    session_open_seconds: list[float] = field(default_factory=list)
    found: dict[QueryKind, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    returned: int = 0


async def measure_mcp(url: str, tokens: dict[str, str], targets: list[Target], k: int) -> McpRun:
    """Warm up, then one session per token: every query kind of every target of that token's assignment."""
    for t in targets[:MCP_WARM_UP_CALLS]:
        async with mcp_session(url, tokens[t.caller.assignment_id]) as session:
            await recall_over_mcp(session, t, "para", k)
    by_assignment: dict[str, list[Target]] = {}
    for t in targets:
        by_assignment.setdefault(t.caller.assignment_id, []).append(t)
    run = McpRun()
    with progress() as bar:
        task = bar.add_task(f"MCP {MCP_TOOL} ({len(by_assignment)} sessions)", total=len(targets) * len(KINDS))
        for assignment, group in by_assignment.items():
            t0 = time.perf_counter()
            async with mcp_session(url, tokens[assignment]) as session:
                run.session_open_seconds.append(time.perf_counter() - t0)
                for kind in KINDS:
                    for t in group:
                        seconds, hit = await recall_over_mcp(session, t, kind, k)
                        run.call_seconds.append(seconds)
                        run.found[kind] += hit.found
                        run.returned += hit.returned
                        bar.advance(task)
    return run


def issue_tokens(conn_str: str, config: MemoryConfig, callers: list[Caller]) -> dict[str, str]:
    """One bearer token per assignment (bound to its org and assignment), in process."""
    store = TokenStore(conn_str, config)
    tokens: dict[str, str] = {}
    for caller in callers:
        if caller.assignment_id not in tokens:
            issued = store.create(
                org_id=caller.org_id,
                assignment_id=caller.assignment_id,
                specialist_id=caller.specialist_id,
                expires_in=timedelta(hours=6),
            )
            tokens[caller.assignment_id] = issued.token
    return tokens


# --------------------------------------------------------------------------------------------- benchmark


class Bench:
    """One benchmark run on one fresh schema."""

    def __init__(self, conn_str: str, params: Params, embedder: Literal["none", "minilm"] = "none") -> None:
        self.conn_str = conn_str
        self.p = params
        name = "bench_" + uuid.uuid4().hex[:10]
        self.config = MemoryConfig(
            pg_conn_str=conn_str, kb_schema=name, memory_schema=name, embedder=embedder, statement_timeout_ms=600000
        )
        self.names = {
            **self.config.sql_names(),
            "hnsw": sql.Identifier(f"{self.config.chunk_table}_hnsw_index"),
        }
        self.corpus = Corpus(params)
        self.conn = psycopg.connect(conn_str, autocommit=True, prepare_threshold=None)
        self.report = Report(
            machine=machine_info(), params=asdict(params), started_at=datetime.now(UTC).isoformat(timespec="seconds")
        )
        self.targets: list[Target] = []
        self.memory: Memory | None = None
        self.fact_vectors: dict[str, list[float]] = {}
        self.query_vectors: dict[str, list[float]] = {}
        self.repo = FactRepository(conn_str, self.config)
        self.postmaster = find_postmaster(self.conn)

    def store_memory(self) -> Memory:
        """The Memory that writes facts (store pipeline with lookup embedders over this run's synthetic vectors)."""
        if self.memory is None:
            self.memory = Memory(
                self.config,
                document_embedder=LookupDocumentEmbedder(self.fact_vectors),
                text_embedder=LookupTextEmbedder(self.query_vectors),
                init_schema=False,
            )
            self.memory.warm_up()
        return self.memory

    def q(self, text: str, **extra: sql.Composable) -> sql.Composed:
        """``text`` with the schema, table and index names (and ``extra``) filled in."""
        return sql.SQL(text).format(**self.names, **extra)

    def sample_memory(self, phase: str) -> None:
        mem = postgres_memory(self.postmaster) if self.postmaster is not None else None
        if mem is not None:
            self.report.memory[phase] = mem

    # ------------------------------------------------------------------------------------- build

    def build(self) -> None:
        """Schema, customer chunks (COPY), every assignment's facts (the product's writer), ANALYZE."""
        self.prepare()
        with progress() as bar:
            self.load_customers(bar)
            self.write_bulk_facts(bar)
        t0 = time.perf_counter()
        self.conn.execute(self.q("ANALYZE {schema}.{gov}"))
        self.conn.execute(self.q("ANALYZE {schema}.{chunk}"))
        self.report.build["analyze_s"] = round(time.perf_counter() - t0, 2)
        self.sample_memory("after bulk load")

    def prepare(self) -> None:
        """Create the schema (the product's migrations) and note the server's settings."""
        ensure_schema(self.conn_str, self.config)
        register_vector(self.conn)
        server: dict[str, Any] = {}
        for key, statement in (
            ("version", "SHOW server_version"),
            ("pgvector", "SELECT extversion FROM pg_extension WHERE extname = 'vector'"),
            ("shared_buffers", "SHOW shared_buffers"),
            ("work_mem", "SHOW work_mem"),
            ("max_parallel_workers_per_gather", "SHOW max_parallel_workers_per_gather"),
        ):
            row = self.conn.execute(statement).fetchone()
            server[key] = row[0] if row else None
        self.report.server = server
        self.sample_memory("idle")

    def load_customers(self, bar: Progress) -> None:
        """``--chunks`` customer chunks (governing rows + chunks), bulk-loaded with COPY."""
        p = self.p
        copy_gov = self.q(
            "COPY {schema}.{gov} (id, org_id, specialist_id, dataset, source, audience, status, content_hash, "
            "title, metadata) FROM STDIN"
        )
        copy_chunks = self.q("COPY {schema}.{chunk} (id, embedding, content, meta) FROM STDIN (FORMAT BINARY)")
        gen_s = copy_s = 0.0
        rows = chunks = 0
        task = bar.add_task("customer chunks (generate + COPY)", total=p.chunks)
        batches = self.corpus.customer_batches(lambda d: ORGS[0] if d % 3 else ORGS[1 + d % len(ORGS[1:])])
        while True:
            t0 = time.perf_counter()
            batch = next(batches, None)
            gen_s += time.perf_counter() - t0
            if batch is None:
                break
            gov, chunk_rows = batch
            t0 = time.perf_counter()
            with self.conn.transaction(), self.conn.cursor() as cur:
                with cur.copy(copy_gov) as copy:
                    for row in gov:
                        copy.write_row(row)
                with cur.copy(copy_chunks) as copy:
                    copy.set_types(["text", "vector", "text", "jsonb"])
                    for row in chunk_rows:
                        copy.write_row(row)
            copy_s += time.perf_counter() - t0
            rows += len(gov) + len(chunk_rows)
            chunks += len(chunk_rows)
            bar.advance(task, len(chunk_rows))
        self.report.build |= {
            "chunks": chunks,
            "rows_copied": rows,
            "generate_s": round(gen_s, 2),
            "copy_s": round(copy_s, 2),
            "copy_rows_per_s": round(rows / copy_s) if copy_s else None,
            "copy_chunks_per_s": round(chunks / copy_s) if copy_s else None,
        }

    def write_bulk_facts(self, bar: Progress) -> None:
        """Facts of every assignment (the targets are stored later through Memory.store), written through the
        product's writer so that each gets its recall row in osa_fact_terms, as in production: the rows the store
        pipeline makes (`ScopeMarkerWriter`), written by `GovernedFactWriter` (`FactRepository.write`, one
        transaction and one pipelined statement per batch of `IMPORT_BATCH`, with audit rows), with the synthetic
        vectors as embeddings. Design (b) filters on ``assignment_id`` in the chunk meta, which the product does not
        write there: it is added to each marked chunk before the write (an UPDATE afterwards would leave dead row
        versions that change the comparison designs' plans). Texts, vectors and topics are drawn in the same order
        as when these facts were COPY-loaded, so the corpus is the same as in earlier runs."""
        p = self.p
        callers = [
            Caller(org_id=ORGS[a % len(ORGS)], assignment_id=f"asg-{a:05d}", specialist_id=f"spec-{a % 9}")
            for a in range(p.assignments)
        ]
        self.targets = self.corpus.targets([callers[i % p.assignments] for i in range(p.queries)])
        bulk_per_assignment = [p.facts_per_assignment] * p.assignments
        for i in range(p.queries):
            bulk_per_assignment[i % p.assignments] -= 1
        specs = [
            (c, int(self.corpus.rng.integers(p.topics)))
            for c, n in zip(callers, bulk_per_assignment, strict=True)
            for _ in range(max(n, 0))
        ]
        marker = ScopeMarkerWriter(dataset=self.config.dataset, status=self.config.admitted_statuses[0])
        writer = GovernedFactWriter(store=MemoryStore.from_config(self.config, Secret.from_token(self.conn_str)))
        writer.warm_up()
        written, gen_s, write_s = 0, 0.0, 0.0
        task = bar.add_task("facts (GovernedFactWriter)", total=len(specs))
        for start in range(0, len(specs), p.batch):
            t0 = time.perf_counter()
            batch = specs[start : start + p.batch]
            facts = self.corpus.fact_items([topic for _, topic in batch])
            by_caller: dict[str, tuple[Caller, list[Document]]] = {}
            for (caller, _), (text, vector) in zip(batch, facts, strict=True):
                doc = Document(content=text, embedding=vector.tolist(), meta={"kind": "fact"})
                by_caller.setdefault(caller.assignment_id, (caller, []))[1].append(doc)
            gen_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            for caller, docs in by_caller.values():
                for at in range(0, len(docs), IMPORT_BATCH):
                    marked = marker.run(
                        documents=docs[at : at + IMPORT_BATCH],
                        org_id=caller.org_id,
                        assignment_id=caller.assignment_id,
                        specialist_id=caller.specialist_id,
                    )
                    chunks = [
                        replace(d, meta={**d.meta, "assignment_id": caller.assignment_id}) for d in marked["documents"]
                    ]
                    ids = writer.run(
                        documents=chunks, governing_rows=marked["governing_rows"], actor="bench", action="import"
                    )["document_ids"]
                    written += len(ids)
                    bar.advance(task, len(ids))
            write_s += time.perf_counter() - t0
        self.report.build |= {
            "facts_written": written,
            "facts_generate_s": round(gen_s, 2),
            "facts_write_s": round(write_s, 2),
            "facts_per_s": round(written / write_s) if write_s else None,
        }

    def store_targets(self) -> None:
        """Write the targets through the real Memory.store pipeline (hybrid, lookup embedders)."""
        self.fact_vectors |= {t.text: t.vector.tolist() for t in self.targets}
        self.query_vectors |= {t.text: t.vector.tolist() for t in self.targets}
        self.query_vectors |= {t.paraphrase: t.paraphrase_vector.tolist() for t in self.targets}
        self.store_memory()
        assert self.memory is not None
        seconds, stored = [], []
        with progress() as bar:
            for t in bar.track(self.targets, description="Memory.store (targets)"):
                t0 = time.perf_counter()
                answer = self.memory.store(
                    t.text, topic=" ".join(self.corpus.topics[t.topic].words.values()), caller=t.caller
                )
                seconds.append(time.perf_counter() - t0)
                stored.append(replace(t, document_id=answer["document_id"]))
        self.targets = stored
        self.report.store_latency_ms["no HNSW index"] = percentiles(seconds)
        # Design (b) filters on chunk meta (pgvector-haystack filters), which Memory.store does not write.
        self.conn.execute(
            self.q(
                "UPDATE {schema}.{chunk} c SET meta = c.meta || jsonb_build_object('assignment_id', "
                "g.metadata->>'assignment_id') FROM {schema}.{gov} g "
                "WHERE g.id = c.meta->>'document_id' AND g.id = ANY(%s)"
            ),
            ([t.document_id for t in self.targets],),
        )

    def store_more(self, label: str) -> None:
        """Store latency again after the queries (new facts in the targets' scopes), usually with the HNSW index."""
        assert self.memory is not None
        seconds = []
        extra = []
        for t in self.targets:
            text, _ = self.corpus.fact_text(int(self.corpus.rng.integers(self.p.topics)))
            extra.append((t.caller, text))
        self.fact_vectors |= {text: unit(self.corpus.rng.standard_normal(DIM)).tolist() for _, text in extra}
        with progress() as bar:
            for caller, text in bar.track(extra, description="Memory.store (with HNSW index)"):
                t0 = time.perf_counter()
                self.memory.store(text, caller=caller)
                seconds.append(time.perf_counter() - t0)
        self.report.store_latency_ms[label] = percentiles(seconds)

    def create_hnsw(self) -> None:
        self.conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(self.p.maintenance_work_mem)))
        console.print(
            f"[dim]building the HNSW index (m={self.p.hnsw_m}, ef_construction={self.p.hnsw_ef_construction})…"
        )
        t0 = time.perf_counter()
        self.conn.execute(
            self.q(
                "CREATE INDEX {hnsw} ON {schema}.{chunk} USING hnsw (embedding vector_cosine_ops) "
                "WITH (m = {m}, ef_construction = {ef})",
                m=sql.Literal(self.p.hnsw_m),
                ef=sql.Literal(self.p.hnsw_ef_construction),
            )
        )
        self.report.build["hnsw_build_s"] = round(time.perf_counter() - t0, 2)
        self.conn.execute("RESET maintenance_work_mem")
        self.conn.execute(self.q("ANALYZE {schema}.{chunk}"))
        self.sample_memory("after HNSW build")

    # ------------------------------------------------------------------------------------- designs

    def _post_filter(self, ids: list[str], target: Target) -> Hit:
        """The old design's second step: keep only the caller's facts among the top k."""
        kept = self.conn.execute(
            self.q(
                "SELECT id FROM {schema}.{gov} WHERE id = ANY(%s) AND org_id = %s AND audience = %s "
                "AND status = 'approved' AND metadata->>'assignment_id' = %s"
            ),
            (ids, target.caller.org_id, FACT_AUDIENCE, target.caller.assignment_id),
        ).fetchall()
        return Hit(target.document_id in {r[0] for r in kept}, len(kept))

    def post_filter_vector(self, target: Target, kind: QueryKind) -> dict[str, Hit]:
        _, vector = target.query(kind)
        rows = self.conn.execute(
            self.q("SELECT meta->>'document_id' FROM {schema}.{chunk} ORDER BY embedding <=> %s::vector LIMIT %s"),
            (vector_literal(vector.tolist()), self.p.k),
        ).fetchall()
        return {"vector": self._post_filter([r[0] for r in rows], target)}

    def post_filter_lexical(self, target: Target, kind: QueryKind) -> dict[str, Hit]:
        text, _ = target.query(kind)
        rows = self.conn.execute(
            self.q(
                "SELECT meta->>'document_id' FROM {schema}.{chunk} "
                "WHERE to_tsvector('english', content) @@ plainto_tsquery('english', %(q)s) "
                "ORDER BY ts_rank_cd(to_tsvector('english', content), plainto_tsquery('english', %(q)s)) DESC "
                "LIMIT %(k)s"
            ),
            {"q": text, "k": self.p.k},
        ).fetchall()
        return {"lexical": self._post_filter([r[0] for r in rows], target)}

    WHERE_HNSW = (
        "WITH r AS MATERIALIZED (SELECT meta->>'document_id' AS id, embedding <=> %(v)s::vector AS d "
        "FROM {schema}.{chunk} WHERE meta->>'assignment_id' = %(asg)s ORDER BY d LIMIT %(k)s) "
        "SELECT id FROM r ORDER BY d"
    )

    def where_hnsw(self, target: Target, kind: QueryKind) -> dict[str, Hit]:
        _, vector = target.query(kind)
        params = {"v": vector_literal(vector.tolist()), "asg": target.caller.assignment_id, "k": self.p.k}
        ids = [r[0] for r in self.conn.execute(self.q(self.WHERE_HNSW), params).fetchall()]
        return {"vector": Hit(target.document_id in ids, len(ids))}

    def scoped(self, target: Target, kind: QueryKind, *, with_vector: bool) -> dict[str, Hit]:
        text, vector = target.query(kind)
        candidates = self.repo.scoped_candidates(
            org_id=target.caller.org_id,
            assignment_id=target.caller.assignment_id,
            query=text,
            embedding=vector.tolist() if with_vector else None,
            ranking=RankingParams(k=self.p.k),
        )
        lexical = {c.document_id for c in candidates if c.lex_rank is not None}
        vector_side = {c.document_id for c in candidates if c.vec_rank is not None}
        hits = {"lexical": Hit(target.document_id in lexical, len(lexical))}
        if with_vector:
            hits["vector"] = Hit(target.document_id in vector_side, len(vector_side))
        return hits

    def recall(self, target: Target, kind: QueryKind) -> dict[str, Hit]:
        assert self.memory is not None
        return {"fused": self._recall_hit(self.memory, target, kind)}

    def measure(self, design: str, fn: Callable[[Target, QueryKind], dict[str, Hit]], note: str = "") -> None:
        """Run ``fn`` for every target and query kind (3 unmeasured warm-up runs first)."""
        for t in self.targets[:3]:
            fn(t, "para")
        seconds: list[float] = []
        found: dict[str, dict[QueryKind, int]] = {}
        returned: dict[str, int] = {}
        with progress() as bar:
            task = bar.add_task(design, total=len(self.targets) * len(KINDS))
            for kind in KINDS:
                for t in self.targets:
                    t0 = time.perf_counter()
                    hits = fn(t, kind)
                    seconds.append(time.perf_counter() - t0)
                    for side, hit in hits.items():
                        found.setdefault(side, dict.fromkeys(KINDS, 0))[kind] += hit.found
                        returned[side] = returned.get(side, 0) + hit.returned
                    bar.advance(task)
        self.record(design, seconds, found, returned, note)

    def record(
        self,
        design: str,
        seconds: list[float],
        found: dict[str, dict[QueryKind, int]],
        returned: dict[str, int],
        note: str = "",
    ) -> None:
        """One result row per side: completeness per query kind, mean rows returned, latency percentiles."""
        latency = percentiles(seconds)
        for side, counts in found.items():
            share: dict[str, float] = {kind: round(100 * counts[kind] / len(self.targets), 1) for kind in KINDS}
            mean_returned = round(returned[side] / len(seconds), 2)
            self.report.results.append(MethodResult(design, side, share, mean_returned, latency, len(seconds), note))

    def run_designs(self, phase: Literal["exact", "hnsw"]) -> None:
        """Phase ``exact``: no HNSW index yet. Phase ``hnsw``: after the index is built."""
        if phase == "exact":
            self.measure("(a) post-filter, exact scan", self.post_filter_vector)
            self.measure("(a) post-filter, ts_rank_cd", self.post_filter_lexical)
            self.measure("(c) ours, scoped SQL (text)", lambda t, kind: self.scoped(t, kind, with_vector=False))
            self.measure(
                "(c) ours, scoped SQL (text+vector)",
                lambda t, kind: self.scoped(t, kind, with_vector=True),
                note="scope read once, both sides",
            )
            self.measure(
                "(c) ours, Memory.recall (hybrid)",
                self.recall,
                note="pipeline: embed+SQL+ACL+strip",
            )
            return
        ef = self.p.ef_search
        self.conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(ef)))
        self.measure("(a) post-filter, HNSW", self.post_filter_vector)
        self.measure(f"(b) WHERE + HNSW (ef_search={ef})", self.where_hnsw)
        self.conn.execute("SET hnsw.iterative_scan = relaxed_order")
        self.measure("(b) WHERE + HNSW, relaxed_order", self.where_hnsw, note="hnsw.max_scan_tuples 20000")
        self.conn.execute("RESET hnsw.iterative_scan")
        self.measure(
            "(c) ours, scoped SQL (HNSW exists)",
            lambda t, kind: self.scoped(t, kind, with_vector=True),
        )
        self.sample_memory("after queries")

    def run_mcp(self) -> None:
        """Recall through the real MCP server (lexical), next to the same recall in process.

        The server (``osa-memory serve``, its own process) reads this run's schema with this run's settings;
        ``OSA_MEMORY_EMBEDDER=none`` because the in-process embedders here are lookup tables it cannot have, and
        a real embedder's query vectors would not match the synthetic stored ones. The in-process lexical
        ``Memory.recall`` is measured first, so the difference of the two rows is the cost of MCP.
        """
        lexical = Memory(self.config, use_default_embedders=False, init_schema=False)
        lexical.warm_up()
        self.measure(
            "(c) ours, Memory.recall (lexical)",
            lambda t, kind: {"lexical": self._recall_hit(lexical, t, kind)},
            note="in process, baseline of MCP row",
        )
        tokens = issue_tokens(self.conn_str, self.config, [t.caller for t in self.targets])
        with running_server(self.config, self.conn_str) as server:
            pid = server.proc.pid if server.proc else None
            console.print(f"[dim]osa-memory serve (pid {pid}) on {server.url}, {len(tokens)} tokens…")
            try:
                run = anyio.run(measure_mcp, server.url, tokens, self.targets, self.p.k)
            except Exception as e:
                msg = f"recall through MCP failed: {describe(e)}\nserver log (tail):\n{server.log_tail()}"
                raise RuntimeError(msg) from e
        self.record(
            f"(c) ours, MCP {MCP_TOOL} (lexical)",
            run.call_seconds,
            {"lexical": run.found},
            {"lexical": run.returned},
            note="HTTP+MCP+auth+JSON, no embed",
        )
        self.report.mcp = {
            "tool": MCP_TOOL,
            "server": "osa-memory serve in its own process, 127.0.0.1, OSA_MEMORY_EMBEDDER=none (lexical recall)",
            "client": f"official mcp client {version('mcp')}, streamable HTTP, one session per token",
            "timed": MCP_TIMED,
            "tokens": len(tokens),
            "sessions": len(run.session_open_seconds),
            "calls_timed": len(run.call_seconds),
            "warm_up_calls": min(MCP_WARM_UP_CALLS, len(self.targets)),
            "call_ms": percentiles(run.call_seconds),
            "session_open_ms": percentiles(run.session_open_seconds),
            "server_pid": pid,
        }

    def _recall_hit(self, memory: Memory, target: Target, kind: QueryKind) -> Hit:
        text, _ = target.query(kind)
        facts = memory.recall(text, limit=self.p.k, caller=target.caller)["facts"]
        return Hit(target.document_id in {f["document_id"] for f in facts}, len(facts))

    def explain(self) -> None:
        """EXPLAIN ANALYZE of our statement and of design (b), for the first target's paraphrase."""
        t = self.targets[0]
        text, vector = t.query("para")
        ours = self.repo.scope_rows_statement
        params = {
            "org_id": t.caller.org_id,
            "assignment_id": t.caller.assignment_id,
            "audiences": [FACT_AUDIENCE],
            "statuses": list(self.config.admitted_statuses),
            "language": self.config.language,
            "query": text,
            "embedding": vector_literal(vector.tolist()),
            "lexemes": self.repo.query_terms(text).lexemes,
        }
        where = {"v": vector_literal(vector.tolist()), "asg": t.caller.assignment_id, "k": self.p.k}
        for name, statement, args in (
            ("ours", ours, params),
            ("where_hnsw", self.q(self.WHERE_HNSW), where),
        ):
            rows = self.conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + statement, args).fetchall()
            plan = "\n".join(r[0] for r in rows)
            self.report.plans[name] = VECTOR_LITERAL.sub(f"'[{DIM} floats]'", plan)

    def sizes(self) -> None:
        for label, rel in (
            ("chunk table (total)", "{schema}.{chunk}"),
            ("governing table (total)", "{schema}.{gov}"),
            ("HNSW index", "{schema}.{hnsw}"),
        ):
            regclass = self.q(rel).as_string(self.conn)
            row = self.conn.execute("SELECT pg_total_relation_size(to_regclass(%s))", (regclass,)).fetchone()
            if row and row[0] is not None:
                self.report.sizes_mib[label] = round(row[0] / 2**20, 1)

    def drop(self) -> None:
        close_pools()
        self.conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(self.names["schema"]))
        self.conn.close()


# --------------------------------------------------------------------------------------------- big scopes

#: Scope sizes of the big-scope sweep when neither ``--scope-sizes`` nor ``--facts-per-assignment`` is given.
BIG_DEFAULT_SIZES = (1_000, 10_000, 100_000)
#: ``FactRepository.exact_scope_max`` that makes every scope take the exact path.
FORCE_EXACT = 10**9
#: The scope held in memory (big path when it does not fit), the big path with the cache off, the exact path.
BIG_SIDES = ("held", "big", "exact")
#: Targets of the big-scope run.
BIG_P95_MS_AT_100K = 50.0
BIG_OWN_TEXT_MIN = 0.99
#: Paraphrases of a big-scope fact: its identifying details (person, ticket code, system and aspect) in other words.
BIG_PARAPHRASES = (
    "who in {team} signs off the {system} {aspect} for ticket {code}?",
    "{first} and ticket {code}: anything about the {system} {aspect} {common}?",
    "remind me what {code} says about the {system} {aspect} and {first}",
    "which {common} does {first} from {team} want for the {system} {aspect} ({code})?",
)


@dataclass(frozen=True)
class BigFact:
    """One fact of the big assignment: its text, a paraphrase with the same details, its topic."""

    index: int
    text: str
    paraphrase: str
    topic: int

    def query(self, kind: QueryKind) -> str:
        return self.text if kind == "own" else self.paraphrase


def big_facts(corpus: Corpus, start: int, count: int, codes: set[str]) -> list[BigFact]:
    """``count`` facts numbered from ``start``: template facts on Zipf-popular topics, each with distinct details
    (a ticket code never used before, a person, a team, a place, a day, a month, an hour)."""
    rnd = corpus.rnd
    topics = corpus.rng.choice(corpus.params.topics, size=count, p=corpus.popularity)
    out = []
    for n, topic in enumerate(topics):
        code = _draw("code", rnd)
        while code in codes:
            code = _draw("code", rnd)
        codes.add(code)
        first = rnd.choice(FIRST)
        slots = {
            **corpus.topics[int(topic)].words,
            "person": f"{first} {rnd.choice(LAST)}",
            "first": first,
            "code": code,
            **{slot: _draw(slot, rnd) for slot in ("team", "place", "day", "month", "hour")},
        }
        text = fill(rnd.choice(FACT_TEMPLATES), rnd, **slots)
        paraphrase = fill(rnd.choice(BIG_PARAPHRASES), rnd, **slots)
        out.append(BigFact(start + n, text, paraphrase, int(topic)))
    return out


@component
class CachingDocumentEmbedder:
    """A real document embedder, each distinct text embedded once: the other assignments of a big-scope run store
    the measured assignment's texts, which need no second embedding. Times the real embedding."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self.cache: dict[str, np.ndarray] = {}
        self.embedded = 0
        self.seconds = 0.0

    def warm_up(self) -> None:
        self.embedder.warm_up()

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, list[Document]]:
        missing = list({d.content or "": d for d in documents if (d.content or "") not in self.cache}.values())
        if missing:
            t0 = time.perf_counter()
            embedded = self.embedder.run(documents=missing)["documents"]
            self.seconds += time.perf_counter() - t0
            self.embedded += len(embedded)
            for doc in embedded:
                self.cache[doc.content or ""] = np.asarray(doc.embedding, dtype=np.float32)
        return {"documents": [replace(d, embedding=self.cache[d.content or ""].tolist()) for d in documents]}


class ProgressLog:
    """A rich progress bar on a terminal; otherwise a line every tenth of the way (background runs, logs)."""

    def __init__(self, description: str, total: int) -> None:
        self.description, self.total, self.done = description, total, 0
        self.started = time.perf_counter()
        self.next_line = total / 10
        self.bar = progress()
        self.task = self.bar.add_task(description, total=total)

    def __enter__(self) -> ProgressLog:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)

    def advance(self, n: int) -> None:
        self.done += n
        self.bar.advance(self.task, n)
        if not console.is_terminal and (self.done >= self.next_line or self.done == self.total):
            self.next_line += self.total / 10
            elapsed = time.perf_counter() - self.started
            console.print(
                f"[dim]{self.description}: {self.done:,}/{self.total:,} in {elapsed:.0f} s "
                f"({self.done / elapsed if elapsed else 0:.0f}/s)",
                highlight=False,
            )


@dataclass
class SideRun:
    """What one path (big or exact) gave on one scope size."""

    seconds: list[float] = field(default_factory=list)
    hits: dict[QueryKind, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    top: list[list[str]] = field(default_factory=list)
    degraded: int = 0


class BigScopeBench(Bench):
    """``--big-scope``: one assignment grown through ``--scope-sizes`` facts (real MiniLM vectors, the product's
    writer), recalled through ``Memory.recall`` on the big-scope path and on the exact path, query by query."""

    def __init__(self, conn_str: str, params: Params) -> None:
        super().__init__(conn_str, params, embedder="minilm")
        from haystack_osa_memory.components.minilm_embedders import (
            BUNDLED_MODEL,
            MiniLMDocumentEmbedder,
            MiniLMTextEmbedder,
        )

        # Same org, other assignment ids: only the assignment tells the scopes apart.
        self.callers = [
            Caller(org_id=ORGS[0], assignment_id=f"big-{a:02d}", specialist_id=f"spec-{a}")
            for a in range(params.assignments)
        ]

        def pair() -> tuple[Any, Any]:
            # New components for every Memory (a component belongs to one pipeline); the model is loaded once.
            text = MiniLMTextEmbedder(model=BUNDLED_MODEL, precision=self.config.query_precision)
            return MiniLMDocumentEmbedder(model=BUNDLED_MODEL, precision=self.config.document_precision), text

        self.embedders = pair
        self.document_embedder = CachingDocumentEmbedder(
            MiniLMDocumentEmbedder(model=BUNDLED_MODEL, precision=self.config.document_precision)
        )
        self.text_embedder = pair()[1]  # the query embedding timed alone
        self.facts: list[BigFact] = []
        self.document_ids: list[str] = []
        self.codes: set[str] = set()
        self.report.big_scope = {"sizes": [], "targets": []}

    def new_memory(self, *, writer: bool = False) -> Memory:
        """A Memory with the real MiniLM pair (its own `FactRepository`, so no scope size is cached yet); the
        writer's document embedder embeds each distinct text once (`CachingDocumentEmbedder`)."""
        document, text = self.embedders()
        memory = Memory(
            self.config,
            document_embedder=self.document_embedder if writer else document,
            text_embedder=text,
            init_schema=False,
        )
        memory.warm_up()
        return memory

    def build(self) -> None:
        self.prepare()
        with progress() as bar:
            self.load_customers(bar)
        self.conn.execute(self.q("ANALYZE {schema}.{gov}"))
        self.conn.execute(self.q("ANALYZE {schema}.{chunk}"))
        self.memory = self.new_memory(writer=True)
        self.text_embedder.warm_up()
        self.report.big_scope["query_precision"] = self.config.query_precision
        self.report.big_scope["torch_threads"] = _torch_threads(self.p.torch_threads)
        self.report.big_scope["code"] = code_fingerprint()

    def grow(self, size: int) -> dict[str, Any]:
        """Store facts until the measured assignment holds ``size``; every other assignment stores the same texts
        (their own scope), batch by batch in turn, through `Memory.import_items` (store pipeline: redaction,
        MiniLM float32 document embedding, scope marker, `FactRepository.write` with the recall row)."""
        assert self.memory is not None
        fresh = big_facts(self.corpus, len(self.facts), size - len(self.facts), self.codes)
        measured = self.callers[0]
        embedded_before, embed_s_before = self.document_embedder.embedded, self.document_embedder.seconds
        t0 = time.perf_counter()
        description = f"store {len(fresh):,} facts x {len(self.callers)} assignments"
        with ProgressLog(description, len(fresh) * len(self.callers)) as bar:
            for start in range(0, len(fresh), IMPORT_BATCH):
                batch = fresh[start : start + IMPORT_BATCH]
                items = [ImportItem(fact=f.text, origin=f"fact-{f.index}") for f in batch]
                for caller in self.callers:
                    imported = self.memory.import_items(items, caller=caller, batch_size=IMPORT_BATCH)
                    if imported.stored != len(batch) or imported.redactions:
                        msg = f"import into {caller.assignment_id} stored {imported.as_dict()} of {len(batch)} facts"
                        raise RuntimeError(msg)
                    bar.advance(len(batch))
                self.document_embedder.cache.clear()
        seconds = time.perf_counter() - t0
        self.facts += fresh
        self.document_ids += [
            marked_fact(f.text, measured.org_id, measured.assignment_id, self.config.dataset)[2] for f in fresh
        ]
        # VACUUM too: autovacuum would soon after an import this size, and until then every index-only scan
        # of the new rows (the held scope's check, the scope's size) also reads the table's pages.
        for table in ("{schema}.osa_fact_terms", "{schema}.{gov}", "{schema}.{chunk}"):
            self.conn.execute(self.q("VACUUM (ANALYZE) " + table))
        embedded = self.document_embedder.embedded - embedded_before
        embed_s = self.document_embedder.seconds - embed_s_before
        written = len(fresh) * len(self.callers)
        return {
            "facts_written": written,
            "facts_embedded": embedded,
            "write_s": round(seconds, 1),
            "embed_s": round(embed_s, 1),
            "facts_per_s": round(written / seconds, 1) if seconds else None,
            "embedded_per_s": round(embedded / embed_s, 1) if embed_s else None,
        }

    def recall_rows(self) -> dict[str, int]:
        """The measured scope's recall rows (all of them, and those the big path can use) and the table's."""
        caller = self.callers[0]
        row = self.conn.execute(
            self.q(
                "SELECT count(*) FILTER (WHERE org_id = %(o)s AND assignment_id = %(a)s), "
                "count(*) FILTER (WHERE org_id = %(o)s AND assignment_id = %(a)s AND seq IS NOT NULL "
                "AND term_keys IS NOT NULL AND terms IS NOT NULL), count(*) FROM {schema}.osa_fact_terms"
            ),
            {"o": caller.org_id, "a": caller.assignment_id},
        ).fetchone()
        assert row is not None
        return {"scope": int(row[0]), "scope_indexed": int(row[1]), "table": int(row[2])}

    def relation_sizes(self) -> dict[str, float]:
        rows = self.conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = "
            "c.relnamespace WHERE n.nspname = %s AND c.relname LIKE 'osa_fact_terms%%'",
            (self.config.kb_schema,),
        ).fetchall()
        return {name: round(size / 2**20, 1) for name, size in rows}

    def measure_size(self, size: int) -> dict[str, Any]:
        """``--queries`` sampled facts, each by its own text and by its paraphrase, through ``Memory.recall`` on both
        paths in turn (which goes first alternates): latency with the query embedding, top-k hits, agreement."""
        p = self.p
        memory = self.new_memory()
        assert memory.kb is not None
        repo = memory.kb.facts
        configured = repo.exact_scope_max = p.exact_scope_max
        rows = self.recall_rows()
        with repo.reading() as conn:
            seen = repo.scope_size(self.callers[0].org_id, self.callers[0].assignment_id, conn=conn).facts
        cache = repo.scope_cache
        fits = cache is not None and seen <= cache.max_facts
        product_path = ("held" if fits else "big") if seen > configured else "exact"
        big_threshold = configured if seen > configured else 0
        thresholds = {"held": big_threshold, "big": big_threshold, "exact": FORCE_EXACT}
        caches = {"held": cache, "big": None, "exact": cache}
        caller = self.callers[0]
        sample = random.Random(p.seed * 1_000_003 + size).sample(range(size), min(p.queries, size))
        queries = [(self.facts[i], kind) for kind in KINDS for i in sample]
        runs = {side: SideRun() for side in BIG_SIDES}
        embed_seconds = []
        for fact, kind in queries[: min(3, len(queries))]:  # warm-up, unmeasured
            for side in BIG_SIDES:
                repo.exact_scope_max, repo.scope_cache = thresholds[side], caches[side]
                memory.recall(fact.query(kind), limit=p.k, caller=caller)
        try:
            with ProgressLog(f"recall at {size:,} facts (big and exact)", len(queries)) as bar:
                for n, (fact, kind) in enumerate(queries):
                    text = fact.query(kind)
                    for side in BIG_SIDES if n % 2 == 0 else BIG_SIDES[::-1]:
                        repo.exact_scope_max, repo.scope_cache = thresholds[side], caches[side]
                        t0 = time.perf_counter()
                        answer = memory.recall(text, limit=p.k, caller=caller)
                        elapsed = time.perf_counter() - t0
                        run = runs[side]
                        run.seconds.append(elapsed)
                        ids = [f["document_id"] for f in answer["facts"]]
                        run.top.append(ids)
                        run.hits[kind] += self.document_ids[fact.index] in ids
                        run.degraded += "degraded" in answer
                    t0 = time.perf_counter()
                    self.text_embedder.run(text=text)
                    embed_seconds.append(time.perf_counter() - t0)
                    bar.advance(1)
        finally:
            repo.exact_scope_max, repo.scope_cache = configured, cache
        per_kind = len(sample)
        paths = {
            side: {
                "exact_scope_max": thresholds[side],
                "forced": (side == "exact") != (product_path == "exact") or (side == "big" and fits),
                "held": side == "held" and fits and thresholds[side] < seen,
                "latency_ms": percentiles(run.seconds),
                "own_hit": round(run.hits["own"] / per_kind, 4),
                "para_hit": round(run.hits["para"] / per_kind, 4),
                "degraded": run.degraded,
                "mean_returned": round(float(np.mean([len(t) for t in run.top])), 2),
            }
            for side, run in runs.items()
        }
        big, exact = runs["big"].top, runs["exact"].top
        overlap = [len(set(b) & set(e)) / max(len(b), len(e), 1) for b, e in zip(big, exact, strict=True)]
        same = [set(b) == set(e) for b, e in zip(big, exact, strict=True)]
        agreement = {
            "identical_top_k_share": round(float(np.mean(same)), 4),
            "identical_order_share": round(float(np.mean([b == e for b, e in zip(big, exact, strict=True)])), 4),
            "mean_overlap": round(float(np.mean(overlap)), 4),
            "min_overlap": round(float(np.min(overlap)), 4),
            "by_kind": {
                kind: {
                    "identical_top_k_share": round(float(np.mean(same[i * per_kind : (i + 1) * per_kind])), 4),
                    "mean_overlap": round(float(np.mean(overlap[i * per_kind : (i + 1) * per_kind])), 4),
                }
                for i, kind in enumerate(KINDS)
            },
        }
        held_top = runs["held"].top
        held_same = [set(h) == set(e) for h, e in zip(held_top, exact, strict=True)]
        held_agreement = {
            "identical_top_k_share": round(float(np.mean(held_same)), 4),
            "identical_order_share": round(float(np.mean([h == e for h, e in zip(held_top, exact, strict=True)])), 4),
        }
        lat_big, lat_exact = paths["big"]["latency_ms"], paths["exact"]["latency_ms"]
        return {
            "facts": size,
            "recall_rows": rows,
            "scope_size_seen_by_recall": seen,
            "exact_scope_max": configured,
            "product_path": product_path,
            "queries": len(queries),
            "sampled_facts": per_kind,
            "paths": paths,
            "agreement": agreement,
            "held_agreement": held_agreement,
            "scope_cache_facts": cache.max_facts if cache is not None else 0,
            "speedup": {q: round(lat_exact[q] / lat_big[q], 2) for q in ("p50", "p95")},
            "query_embedding_ms": percentiles(embed_seconds),
            "relation_sizes_mib": self.relation_sizes(),
        }

    def run(self, checkpoint: Callable[[], None] | None = None) -> None:
        """Grow and measure every size; ``checkpoint`` after each (writes the JSON so far)."""
        for size in self.p.scope_sizes:
            entry: dict[str, Any] = {"facts": size, "write": self.grow(size), "load_avg": _load_avg()}
            rows = self.recall_rows()
            if rows["scope"] != size or rows["scope_indexed"] != size:
                msg = f"the measured scope holds {size} facts but {rows} recall rows: the writer left facts without one"
                raise RuntimeError(msg)
            entry |= self.measure_size(size)
            self.report.big_scope["sizes"].append(entry)
            print_big_size(entry, self.p.k)
            self.sample_memory(f"after {size:,} facts")
            if checkpoint is not None:
                checkpoint()
        self.report.big_scope["targets"] = big_targets(self.report.big_scope["sizes"], self.p.k)


def code_fingerprint() -> dict[str, str]:
    """sha256 (first 12 hex digits) and modification time of the modules that rank a scope: the figures belong
    to that code."""
    import haystack_osa_memory.store.big_scope as big_scope_module
    import haystack_osa_memory.store.candidates as candidates_module
    import haystack_osa_memory.store.facts as facts_module
    import haystack_osa_memory.store.ranking as ranking_module
    import haystack_osa_memory.store.recall_rows as recall_rows_module

    out = {}
    for module in (facts_module, candidates_module, big_scope_module, recall_rows_module, ranking_module):
        path = Path(module.__file__ or "")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        modified = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
        out[path.name] = f"{digest} (modified {modified})"
    return out


def _torch_threads(threads: int) -> int | None:
    """Set torch's intra-op threads (0: leave torch's default, one per core) and return the number in use.

    On a machine whose cores other work shares, torch's default spins its threads against that work: on this
    project's 2-core VM, with one core busy, MiniLM embedded 15 documents/s on 2 threads and 198 on 1."""
    try:
        import torch
    except ImportError:
        return None
    if threads > 0:
        torch.set_num_threads(threads)
    return int(torch.get_num_threads())


def _load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def big_targets(sizes: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The big-scope targets: measured (``met`` True/False) or not measured in this run (``met`` None)."""
    by_size = {s["facts"]: s for s in sizes}
    out: list[dict[str, Any]] = []
    at_100k = by_size.get(100_000)
    p95 = at_100k["paths"]["big"]["latency_ms"]["p95"] if at_100k else None
    out.append(
        {
            "target": f"big path recall p95 <= {BIG_P95_MS_AT_100K:g} ms at 100,000 facts (query embedding included)",
            "value": f"{p95:.1f} ms" if p95 is not None else "not measured (no 100,000 size)",
            "met": None if p95 is None else p95 <= BIG_P95_MS_AT_100K,
        }
    )
    at_10k, at_1k = by_size.get(10_000), by_size.get(1_000)
    if at_10k and at_1k:
        product = at_10k["paths"][at_10k["product_path"]]["latency_ms"]
        exact = at_1k["paths"]["exact"]["latency_ms"]
        value = (
            f"{at_10k['product_path']} path at 10k p50 {product['p50']:.1f} / p95 {product['p95']:.1f} ms vs exact at "
            f"1k p50 {exact['p50']:.1f} / p95 {exact['p95']:.1f} ms"
        )
        met: bool | None = product["p50"] <= exact["p50"] and product["p95"] <= exact["p95"]
    else:
        value, met = "not measured (needs sizes 1,000 and 10,000)", None
    out.append(
        {
            "target": "recall at 10,000 facts (product path) no slower than the exact path at 1,000",
            "value": value,
            "met": met,
        }
    )
    lowest = min(sizes, key=lambda s: s["paths"]["big"]["own_hit"]) if sizes else None
    out.append(
        {
            "target": f"own text in top {k} >= {BIG_OWN_TEXT_MIN:.0%} (big path, every size)",
            "value": (
                f"lowest {lowest['paths']['big']['own_hit']:.1%} at {lowest['facts']:,} facts" if lowest else "no sizes"
            ),
            "met": None if lowest is None else lowest["paths"]["big"]["own_hit"] >= BIG_OWN_TEXT_MIN,
        }
    )
    return out


def print_big_size(s: dict[str, Any], k: int) -> None:
    """One size of the big-scope run (printed as soon as it is measured)."""
    w, a = s["write"], s["agreement"]
    table = Table(
        title=(
            f"{s['facts']:,} facts in one assignment ({s['recall_rows']['table']:,} recall rows in the table); product "
            f"path: {s['product_path']} (exact_scope_max {s['exact_scope_max']:,}); {s['sampled_facts']} facts x 2 "
            f"query kinds; top {k}"
        )
    )
    for col in ("path", "p50 ms", "p95 ms", "p99 ms", "own text in top k", "paraphrase in top k", "degraded", "note"):
        table.add_column(col, justify="left" if col in ("path", "note") else "right")
    for side in BIG_SIDES:
        path = s["paths"][side]
        lat = path["latency_ms"]
        table.add_row(
            side,
            f"{lat['p50']:.2f}",
            f"{lat['p95']:.2f}",
            f"{lat['p99']:.2f}",
            f"{path['own_hit']:.1%}",
            f"{path['para_hit']:.1%}",
            str(path["degraded"]),
            ("forced" if path["forced"] else "product default")
            + f", exact_scope_max {path['exact_scope_max']:,}"
            + (", held in memory" if side == "held" and path.get("held") else "")
            + (", not held (bigger than the cache): the big path" if side == "held" and not path.get("held") else ""),
        )
    console.print(table)
    q = s["query_embedding_ms"]
    console.print(
        f"speed-up exact/big: p50 {s['speedup']['p50']:.2f}x, p95 {s['speedup']['p95']:.2f}x  |  same top-{k} set as "
        f"exact: {a['identical_top_k_share']:.1%} of queries (own {a['by_kind']['own']['identical_top_k_share']:.1%}, "
        f"paraphrase {a['by_kind']['para']['identical_top_k_share']:.1%}); "
        f"same order {a['identical_order_share']:.1%}; "
        f"mean overlap {a['mean_overlap']:.3f} (min {a['min_overlap']:.3f})  |  query embedding alone p50 "
        f"{q['p50']:.2f} / p95 {q['p95']:.2f} ms  |  stored {w['facts_written']:,} facts in {w['write_s']} s = "
        f"{w['facts_per_s']} facts/s ({w['facts_embedded']:,} embedded in {w['embed_s']} s = {w['embedded_per_s']}/s); "
        f"load {s['load_avg']}",
        highlight=False,
    )


def print_big_report(r: Report) -> None:
    m, p, b = r.machine, r.params, r.big_scope
    console.rule("[bold]haystack-osa-memory scale benchmark: big scopes")
    console.print(
        f"date {r.started_at}  |  {m['cpu_model']}, {m['cores']} cores, {m['ram_gib']} GiB RAM  |  {m['os']}, "
        f"Python {m['python']}  |  torch threads {b.get('torch_threads')}, query precision {b.get('query_precision')}"
    )
    console.print(
        f"load average (1/5/15 min) at start {m['load_avg_at_start']}, at end {r.load_avg_at_end}; PostgreSQL "
        f"{r.server.get('version')}, pgvector {r.server.get('pgvector')}, "
        f"shared_buffers {r.server.get('shared_buffers')}"
    )
    console.print(
        f"{p['chunks']:,} customer chunks (COPY); {p['assignments']} assignments of one org grown to "
        f"{', '.join(f'{n:,}' for n in p['scope_sizes'])} facts each through Memory.import_items (MiniLM float32, "
        f"batches of {IMPORT_BATCH}); the first is measured; seed {p['seed']}",
        highlight=False,
    )
    console.print(
        "ranking code: " + ", ".join(f"{name} {value}" for name, value in b.get("code", {}).items()), highlight=False
    )
    table = Table(
        title=f"Big-scope path vs exact path, Memory.recall in process (query embedding included), top {p['k']}"
    )
    for col in (
        "facts",
        "product path",
        "big p50 / p95 ms",
        "held p50 / p95 ms",
        f"held: same top {p['k']}",
        "exact p50 / p95 ms",
        "speed-up p50 / p95",
        f"same top {p['k']}",
        "mean overlap",
        "own text big / exact",
        "paraphrase big / exact",
    ):
        table.add_column(col, justify="right")
    for s in b["sizes"]:
        big, held, exact = s["paths"]["big"], s["paths"]["held"], s["paths"]["exact"]
        table.add_row(
            f"{s['facts']:,}",
            s["product_path"],
            f"{big['latency_ms']['p50']:.1f} / {big['latency_ms']['p95']:.1f}" + (" (forced)" if big["forced"] else ""),
            f"{held['latency_ms']['p50']:.1f} / {held['latency_ms']['p95']:.1f}"
            + ("" if held.get("held") else " (big)"),
            f"{s['held_agreement']['identical_top_k_share']:.1%}",
            f"{exact['latency_ms']['p50']:.1f} / {exact['latency_ms']['p95']:.1f}",
            f"{s['speedup']['p50']:.2f}x / {s['speedup']['p95']:.2f}x",
            f"{s['agreement']['identical_top_k_share']:.1%}",
            f"{s['agreement']['mean_overlap']:.3f}",
            f"{big['own_hit']:.1%} / {exact['own_hit']:.1%}",
            f"{big['para_hit']:.1%} / {exact['para_hit']:.1%}",
        )
    console.print(table)
    for t in b["targets"]:
        verdict = {True: "[green]met[/] (", False: "[red]NOT met[/] (", None: "[yellow]"}[t["met"]]
        close = "" if t["met"] is None else ")"
        console.print(f"target: {t['target']}: {verdict}{t['value']}{close}", highlight=False)
    console.print(f"total run time {r.total_seconds:.1f} s")


# --------------------------------------------------------------------------------------------- output


def print_report(r: Report) -> None:
    m, p = r.machine, r.params
    console.rule("[bold]haystack-osa-memory scale benchmark")
    console.print(
        f"date {r.started_at}  |  {m['cpu_model']}, {m['cores']} cores, {m['ram_gib']} GiB RAM  |  {m['os']}, "
        f"Python {m['python']}"
    )
    console.print(
        f"load average (1/5/15 min) at start {m['load_avg_at_start']}, at end {r.load_avg_at_end}: other processes on "
        "this machine share its cores"
    )
    console.print(
        f"PostgreSQL {r.server.get('version')}, pgvector {r.server.get('pgvector')}, shared_buffers "
        f"{r.server.get('shared_buffers')}, work_mem {r.server.get('work_mem')}"
    )
    console.print(
        f"chunks {p['chunks']:,} customer + {p['assignments']} assignments x {p['facts_per_assignment']} facts; "
        f"{p['queries']} target facts x 2 query kinds; {p['topics']} topics; top k = {p['k']}; seed {p['seed']}; "
        f"HNSW m={p['hnsw_m']} ef_construction={p['hnsw_ef_construction']} ef_search={p['ef_search']}"
    )
    b = r.build
    console.print(
        f"customer chunks: {b['rows_copied']:,} rows ({b['chunks']:,} chunks) by COPY in {b['copy_s']} s = "
        f"{b['copy_rows_per_s']:,} rows/s ({b['copy_chunks_per_s']:,} chunks/s; text generation "
        f"{b['generate_s']} s apart); facts: {b['facts_written']:,} through the product's writer "
        f"(GovernedFactWriter, batches of {IMPORT_BATCH}, synthetic vectors) in {b['facts_write_s']} s = "
        f"{b['facts_per_s']:,} facts/s; ANALYZE {b['analyze_s']} s; HNSW build "
        + (f"{b['hnsw_build_s']} s" if "hnsw_build_s" in b else "skipped")
    )

    table = Table(title=f"Completeness (target in top {p['k']}) and recall latency", show_lines=False)
    for col, kw in (
        ("design", {}),
        ("side", {}),
        ("own text %", {"justify": "right"}),
        ("paraphrase %", {"justify": "right"}),
        ("rows/k", {"justify": "right"}),
        ("p50 ms", {"justify": "right"}),
        ("p95 ms", {"justify": "right"}),
        ("p99 ms", {"justify": "right"}),
        ("note", {"style": "dim"}),
    ):
        table.add_column(col, **kw)  # type: ignore[arg-type]
    for res in r.results:
        lat = res.latency_ms
        table.add_row(
            res.design,
            res.side,
            f"{res.completeness['own']:.1f}",
            f"{res.completeness['para']:.1f}",
            f"{res.returned:.1f}/{r.params['k']}",
            f"{lat['p50']:.2f}",
            f"{lat['p95']:.2f}",
            f"{lat['p99']:.2f}",
            res.note,
        )
    console.print(table)
    if r.mcp:
        print_mcp(r.mcp)

    other = Table(title="Store latency, memory, sizes")
    other.add_column("measure")
    other.add_column("value", justify="right")
    for phase, lat in r.store_latency_ms.items():
        other.add_row(
            f"Memory.store ({phase})", f"p50 {lat['p50']:.2f} / p95 {lat['p95']:.2f} / p99 {lat['p99']:.2f} ms"
        )
    for phase, mem in r.memory.items():
        other.add_row(
            f"postgres RSS / PSS ({phase})",
            f"{mem['rss_mib']:,.0f} / {mem['pss_mib']:,.0f} MiB ({mem['processes']} processes)",
        )
    if not r.memory:
        other.add_row("postgres memory", "not measured (server not on this machine)")
    for label, mib in r.sizes_mib.items():
        other.add_row(label, f"{mib:,.1f} MiB")
    other.add_row("total run time", f"{r.total_seconds:.1f} s")
    console.print(other)
    for name, plan in r.plans.items():
        console.rule(f"EXPLAIN ANALYZE: {name}")
        console.print(plan, highlight=False, markup=False)


def print_mcp(mcp: dict[str, Any]) -> None:
    call, opened = mcp["call_ms"], mcp["session_open_ms"]
    console.print(
        f"MCP row: {mcp['server']}; {mcp['client']} ({mcp['sessions']} sessions, {mcp['tokens']} tokens, "
        f"{mcp['warm_up_calls']} warm-up calls). Recall latency through MCP p50 {call['p50']:.2f} / p95 "
        f"{call['p95']:.2f} / p99 {call['p99']:.2f} ms over {mcp['calls_timed']} calls. Timed: {mcp['timed']} "
        f"Session open: p50 {opened['p50']:.2f} / p95 {opened['p95']:.2f} / p99 {opened['p99']:.2f} ms.",
        highlight=False,
    )


def write_plot(r: Report, path: Path) -> None:
    try:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print(f"[yellow]matplotlib is not installed: no plot written to {path} (the JSON has the data)")
        return
    labels = [f"{res.design}\n[{res.side}]" for res in r.results]
    y = np.arange(len(labels))
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 0.5 * len(labels) + 2), sharey=True)
    left.barh(y - 0.2, [res.completeness["own"] for res in r.results], height=0.4, label="own text")
    left.barh(y + 0.2, [res.completeness["para"] for res in r.results], height=0.4, label="paraphrase")
    left.set_xlabel(f"target in top {r.params['k']} (%)")
    left.set_yticks(y, labels, fontsize=8)
    left.invert_yaxis()
    left.legend(loc="lower left")
    right.barh(y, [res.latency_ms["p50"] for res in r.results], label="p50")
    right.scatter([res.latency_ms["p99"] for res in r.results], y, color="black", marker="|", label="p99")
    right.set_xscale("log")
    right.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    right.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    right.set_xlabel("latency (ms, log)")
    right.legend()
    fig.suptitle(f"{r.params['chunks']:,} customer chunks, {r.machine['cores']} cores ({r.started_at})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    console.print(f"plot written to {path}")


# --------------------------------------------------------------------------------------------- main


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        msg = f"expected comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not sizes or min(sizes) < 1 or list(sizes) != sorted(set(sizes)):
        msg = f"expected increasing positive sizes, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return sizes


def parse_args(argv: list[str] | None = None) -> tuple[Params, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--chunks", type=int, required=True, help="customer chunks in the knowledge base")
    parser.add_argument(
        "--assignments", type=int, help="assignments with facts (default 200; with --big-scope: assignments grown, 2)"
    )
    parser.add_argument(
        "--facts-per-assignment",
        type=int,
        help="facts per assignment (default 20; with --big-scope: the largest scope size, default 100,000)",
    )
    parser.add_argument(
        "--queries", type=int, help="target facts queried (default 100; with --big-scope: per size, 200)"
    )
    parser.add_argument("--topics", type=int, default=1000, help="topics of the synthetic corpus (default 1000)")
    parser.add_argument("--k", type=int, help="top k (1-20; default 10, with --big-scope 8 as Memory.recall)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--batch", type=int, default=20000, help="rows per COPY batch")
    parser.add_argument("--hnsw-m", type=int, default=16)
    parser.add_argument("--hnsw-ef-construction", type=int, default=64)
    parser.add_argument("--ef-search", type=int, default=40, help="hnsw.ef_search (pgvector default 40)")
    parser.add_argument("--maintenance-work-mem", default="1GB", help="for the HNSW build (default 1GB)")
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument("--plot", type=Path, help="write a PNG plot (needs matplotlib)")
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of ours and of (b)")
    parser.add_argument(
        "--skip-hnsw", action="store_true", help="no HNSW index and no (b) designs (the build dominates at 1M chunks)"
    )
    parser.add_argument(
        "--no-mcp", action="store_true", help="skip recall through the MCP server (and its in-process baseline)"
    )
    big = parser.add_argument_group(
        "big scopes",
        "--big-scope measures recall on one big assignment instead of the design comparison: the big-scope path "
        "against the exact path, with the real MiniLM embedders",
    )
    big.add_argument("--big-scope", action="store_true", help="run the big-scope measurement")
    big.add_argument(
        "--scope-sizes",
        type=_sizes,
        help="sizes the measured assignment grows through, measured at each (default 1000,10000,100000 up to "
        "--facts-per-assignment)",
    )
    big.add_argument(
        "--exact-scope-max",
        type=int,
        help=f"FactRepository.exact_scope_max of the product path (default {EXACT_SCOPE_MAX}); a small value takes "
        "the big-scope path on small scopes (smoke runs)",
    )
    big.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads for MiniLM (default 1; 0 keeps torch's default, one per core)",
    )
    args = parser.parse_args(argv)
    big_scope: bool = args.big_scope
    if not big_scope and (args.scope_sizes is not None or args.exact_scope_max is not None):
        parser.error("--scope-sizes and --exact-scope-max go with --big-scope")
    assignments = args.assignments if args.assignments is not None else (2 if big_scope else 200)
    queries = args.queries if args.queries is not None else (200 if big_scope else 100)
    k = args.k if args.k is not None else (8 if big_scope else 10)
    sizes: tuple[int, ...] = ()
    if big_scope:
        if args.scope_sizes is not None:
            sizes = args.scope_sizes
            if args.facts_per_assignment is not None and args.facts_per_assignment != sizes[-1]:
                parser.error("--facts-per-assignment must be the largest of --scope-sizes (or leave it out)")
        elif args.facts_per_assignment is not None:
            top = args.facts_per_assignment
            sizes = (*(n for n in BIG_DEFAULT_SIZES if n < top), top) if top >= 1 else ()
        else:
            sizes = BIG_DEFAULT_SIZES
        facts_per_assignment = sizes[-1] if sizes else 0
        if args.chunks < 0 or assignments < 1 or facts_per_assignment < 1:
            parser.error("--chunks must be >= 0, --assignments and --facts-per-assignment positive")
        if queries < 1:
            parser.error("--queries must be positive")
        exact_scope_max = args.exact_scope_max if args.exact_scope_max is not None else EXACT_SCOPE_MAX
        if exact_scope_max < 0 or args.torch_threads < 0:
            parser.error("--exact-scope-max and --torch-threads must be >= 0")
    else:
        facts_per_assignment = args.facts_per_assignment if args.facts_per_assignment is not None else 20
        exact_scope_max = EXACT_SCOPE_MAX
        if args.chunks < 1 or assignments < 1 or facts_per_assignment < 1:
            parser.error("--chunks, --assignments and --facts-per-assignment must be positive")
        if not 1 <= queries <= min(args.topics, assignments * facts_per_assignment):
            parser.error("--queries must be from 1 to min(--topics, assignments x facts)")
    if not 1 <= k <= 20:
        parser.error("--k must be from 1 to 20 (Memory.recall's limit)")
    params = Params(
        chunks=args.chunks,
        assignments=assignments,
        facts_per_assignment=facts_per_assignment,
        queries=queries,
        topics=args.topics,
        k=k,
        seed=args.seed,
        batch=args.batch,
        hnsw_m=args.hnsw_m,
        hnsw_ef_construction=args.hnsw_ef_construction,
        ef_search=args.ef_search,
        maintenance_work_mem=args.maintenance_work_mem,
        big_scope=big_scope,
        scope_sizes=sizes,
        exact_scope_max=exact_scope_max,
        torch_threads=args.torch_threads,
    )
    return params, args


def run_big_scope(params: Params, args: argparse.Namespace) -> int:
    """``--big-scope``: build, grow and measure (`BigScopeBench`), print, write the JSON."""
    started = time.perf_counter()

    def write_json(report: Report) -> None:
        if args.json:
            args.json.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n", encoding="utf-8")

    with database("osa-bench-") as conn_str:
        bench = BigScopeBench(conn_str, params)
        try:
            bench.build()
            bench.run(checkpoint=lambda: write_json(bench.report))
        finally:
            bench.drop()
    report = bench.report
    report.total_seconds = round(time.perf_counter() - started, 1)
    report.load_avg_at_end = _load_avg()
    print_big_report(report)
    if args.json:
        write_json(report)
        console.print(f"JSON written to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    params, args = parse_args(argv)
    if params.big_scope:
        return run_big_scope(params, args)
    started = time.perf_counter()
    with database("osa-bench-") as conn_str:
        bench = Bench(conn_str, params)
        sampler = MemorySampler(bench.postmaster) if bench.postmaster is not None else None
        if sampler is not None:
            sampler.start()
        try:
            bench.build()
            bench.store_targets()
            bench.run_designs("exact")
            if not args.no_mcp:
                bench.run_mcp()
            if not args.skip_hnsw:
                bench.create_hnsw()
                bench.run_designs("hnsw")
            if args.explain:
                bench.explain()
            bench.store_more("with HNSW index" if not args.skip_hnsw else "second batch")
            bench.sizes()
        finally:
            if sampler is not None:
                bench.report.memory["peak, 1 s samples"] = sampler.stop()
            bench.drop()
    report = bench.report
    report.total_seconds = round(time.perf_counter() - started, 1)
    report.load_avg_at_end = [round(x, 2) for x in os.getloadavg()]
    if not args.explain:
        report.plans = {}
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n", encoding="utf-8")
        console.print(f"JSON written to {args.json}")
    if args.plot:
        write_plot(report, args.plot)
    return 0


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    """Turn SIGTERM into SystemExit, so the cleanup (server process, schema, embedded database) runs."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(main())
