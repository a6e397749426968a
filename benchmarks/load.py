"""Many agents at once: a real ``osa-memory serve`` driven by N concurrent official MCP clients.

Usage::

    python benchmarks/load.py --clients 32 --assignments 16 --facts 200
    python benchmarks/load.py --sweep 1,4,16,32,64 --assignments 16 --facts 200 --plot load.png --json load.json
    python benchmarks/load.py --driver wrk --connections 1,32 [--compare REV [--rounds N]] [--profile DIR]
        [--store-calls N]

``--driver wrk`` drives the server with wrk instead (benchmarks/README.md); ``--profile DIR`` records the
server with py-spy during each phase and prints where its Python time went (`benchmarks.profile_shares`);
``--store-calls N`` ends each store phase after N stores, so that two servers compared side by side store the
same facts (a store's search reads its whole scope, one fact bigger after every store: a faster server would
otherwise be measured on bigger scopes); ``--rounds N`` runs each phase N times per server, the two servers taking
turns going first, and compares the pooled figures (one phase per server does not resolve a 10% difference).

What it does, in one run:

1. a database (``PG_CONN_STR``, else a throwaway embedded PostgreSQL), a fresh schema (``init``);
2. ``--facts`` facts per assignment for ``--assignments`` assignments, through the product's import
   path (each fact names its assignment's tag word, so an answer from another scope is recognised);
3. ``osa-memory serve`` in its own process (``--workers`` passed on; default configuration otherwise:
   hybrid recall with the bundled MiniLM unless ``--embedder none``);
4. for each client count: ``--clients`` official MCP client sessions (streamable HTTP, one bearer
   token per assignment, client ``i`` on assignment ``i % assignments``), opened before the clock
   starts and spread over ``--client-processes`` processes; each calls ``kb_memory_recall`` in a loop
   for ``--duration`` seconds, then ``kb_memory_store`` (a new fact per call) for as long.

Printed per phase: calls/s, latency p50/p95/p99 (client side, per call), errors, cross-scope results
(a recalled fact that does not carry the caller's tag word, or carries another's) and the server's
memory (RSS summed over the ``serve`` process and its workers, peak of 2 samples/s; PostgreSQL apart),
and where the CPU went: CPU milliseconds per call of the ``serve`` processes, of PostgreSQL (every
``postgres`` process of the machine) and of the clients, over the measured window. The clients run on
the same machine as the server, so on a 2-core machine their CPU is taken from the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import database, machine_info, percentiles, postmaster_pid
from benchmarks.profile_shares import RATE, file_shares, format_table, start_recording
from benchmarks.workload import cpu_spent, fact_text, query_text, tag
from benchmarks.wrk_driver import WrkResult, remove_worktree, run_wrk, worktree
from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.store.sizing import count_facts
from haystack_osa_memory.store.tokens import TokenStore
from haystack_osa_memory.transfer import ImportItem

console = Console(width=None if sys.stdout.isatty() else 150)  # the whole table in logs and pipes
# `-P`: no working directory (nor script folder) at the front of `sys.path`. Without it a baseline served from
# a checkout (`--compare`, PYTHONPATH naming the checkout) imported this work tree's package instead whenever
# the benchmark ran from the repository's root, so old and new were the same code.
PYTHON = [sys.executable, "-P"]
OSA_MEMORY = [*PYTHON, "-m", "haystack_osa_memory.cli"]
START_TIMEOUT_S = 180.0
#: Seconds the client processes may take to start and open their sessions before a phase.
READY_TIMEOUT_S = 300.0


@dataclass
class PhaseResult:
    phase: str
    clients: int
    seconds: float
    calls: int
    per_second: float
    latency_ms: dict[str, float]
    errors: int
    error_kinds: dict[str, int]
    cross_scope: int
    server_rss_mib: float
    client_cpu_s: float
    server_cpu_s: float = 0.0
    postgres_cpu_s: float = 0.0


@dataclass
class Report:
    machine: dict[str, Any]
    params: dict[str, Any]
    started_at: str
    results: list[PhaseResult] = field(default_factory=list)


# -- the clients (run in their own processes) ----------------------------------------------------


async def _starting_time(start: Any) -> float:
    """The common start, once the parent has set it (every session is open by then)."""
    while not start.value:
        await asyncio.sleep(0.01)
    return float(start.value)


async def _client(
    url: str,
    token: str,
    assignment: int,
    assignments: int,
    phase: str,
    start: Any,
    ready: Any,
    duration: float,
    seed: int,
) -> dict[str, Any]:
    rnd = random.Random(seed)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    cross = 0
    own = tag(assignment)
    others = {tag(a) for a in range(assignments)} - {own}
    async with (
        httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        try:
            await session.initialize()
            await session.list_tools()  # call_tool would list them on the first call: untimed here
        finally:
            ready.put(1)  # also when it failed: the parent does not wait for a session that will never open
        start_at = await _starting_time(start)
        stop_at = start_at + duration
        await asyncio.sleep(max(0.0, start_at - time.time()))
        n = 0
        while time.time() < stop_at:
            n += 1
            if phase == "recall":
                tool, arguments = "kb_memory_recall", {"query": query_text(assignment, rnd), "limit": 8}
            else:
                tool, arguments = "kb_memory_store", {"fact": fact_text(assignment, seed * 10**6 + n, rnd)}
            began = time.perf_counter()
            try:
                result = await session.call_tool(tool, arguments)
            except Exception as e:  # a broken session counts, and the client goes on
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                continue
            latencies.append(time.perf_counter() - began)
            if result.isError:
                text = "".join(getattr(c, "text", "") for c in result.content)[:60]
                errors[text] = errors.get(text, 0) + 1
                continue
            if phase == "recall":
                data = result.structuredContent or {}
                for fact in data.get("facts", []):
                    content = fact.get("content", "")
                    if own not in content or any(t in content for t in others):
                        cross += 1
    return {"latencies": latencies, "errors": errors, "cross": cross}


def _client_process(
    jobs: list[tuple[str, str, int]], assignments: int, phase: str, start: Any, ready: Any, duration: float, out: Any
) -> None:
    cpu_at_start: list[float] = []

    async def main() -> list[Any]:
        async def clock() -> None:  # the processes' CPU from the common start on (imports and session set-up apart)
            start_at = await _starting_time(start)
            await asyncio.sleep(max(0.0, start_at - time.time()))
            usage = psutil.Process().cpu_times()
            cpu_at_start.append(usage.user + usage.system)

        return await asyncio.gather(
            clock(),
            *(
                _client(url, token, assignment, assignments, phase, start, ready, duration, seed)
                for seed, (url, token, assignment) in enumerate(jobs, start=os.getpid() * 1000)
            ),
            return_exceptions=True,
        )

    results = asyncio.run(main())
    merged: dict[str, Any] = {"latencies": [], "errors": {}, "cross": 0}
    for r in results[1:]:
        if isinstance(r, BaseException):
            merged["errors"][type(r).__name__] = merged["errors"].get(type(r).__name__, 0) + 1
            continue
        merged["latencies"] += r["latencies"]
        merged["cross"] += r["cross"]
        for k, v in r["errors"].items():
            merged["errors"][k] = merged["errors"].get(k, 0) + v
    usage = psutil.Process().cpu_times()
    merged["cpu_s"] = usage.user + usage.system - cpu_at_start[0]
    out.put(merged)


# -- the server ----------------------------------------------------------------------------------


class RssSampler(threading.Thread):
    """Peak RSS of the ``serve`` process and its children that are not PostgreSQL."""

    def __init__(self, pid: int, postmaster: int | None = None) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.postmaster = postmaster  # count only this cluster's processes (else every postgres of the machine)
        self.peak = 0.0
        self._stop_event = threading.Event()

    def sample(self) -> float:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0.0
        total = 0
        for p in procs:
            with suppress(psutil.Error):
                if "postgres" not in p.name():
                    total += p.memory_info().rss
        return total / 2**20

    def cpu(self) -> dict[tuple[str, int], float]:
        """CPU seconds so far of each process of the serve tree and each PostgreSQL process of the machine."""
        totals: dict[tuple[str, int], float] = {}
        try:
            root = psutil.Process(self.pid)
            serve = {root.pid, *(p.pid for p in root.children(recursive=True))}
        except psutil.Error:
            serve = set()
        cluster: set[int] | None = None
        if self.postmaster is not None:
            with suppress(psutil.Error):
                root_pg = psutil.Process(self.postmaster)
                cluster = {root_pg.pid, *(c.pid for c in root_pg.children(recursive=True))}
        for p in psutil.process_iter(["name"]):
            with suppress(psutil.Error):
                is_pg = p.pid in cluster if cluster is not None else "postgres" in (p.info["name"] or "")
                kind = "postgres" if is_pg else "server" if p.pid in serve else None
                if kind:
                    t = p.cpu_times()
                    totals[(kind, p.pid)] = t.user + t.system
        return totals

    @staticmethod
    def spent(before: dict[tuple[str, int], float], after: dict[tuple[str, int], float], kind: str) -> float:
        """CPU seconds of ``kind`` between two samples (`cpu_spent`)."""
        return cpu_spent(before, {k: v for k, v in after.items() if k[0] == kind})

    def run(self) -> None:
        while not self._stop_event.wait(0.5):
            self.peak = max(self.peak, self.sample())

    def stop(self) -> float:
        self._stop_event.set()
        self.join()
        return round(max(self.peak, self.sample()), 1)


def revision_env(revision_path: Path | None) -> dict[str, str]:
    """The environment of a subprocess that runs the package of the checkout ``revision_path`` (else the
    installed one, this work tree's), started with `PYTHON` (`-P`) so that nothing but PYTHONPATH decides."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if revision_path is not None:
        env["PYTHONPATH"] = str(revision_path)
    return env


@contextmanager
def serve(
    config: MemoryConfig, conn_str: str, workers: int | None, embedder: str, revision_path: Path | None = None
) -> Iterator[tuple[str, int]]:
    """``osa-memory serve`` on a free loopback port: yields (MCP URL, pid). ``revision_path``: serve the package
    of that checkout of another revision (`revision_env`)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = revision_env(revision_path) | {
        "PG_CONN_STR": conn_str,
        "OSA_MEMORY_KB_SCHEMA": config.kb_schema,
        "OSA_MEMORY_SCHEMA": config.memory_schema,
        "OSA_MEMORY_EMBEDDER": embedder,
        "PYTHONUNBUFFERED": "1",
    }
    command = [*OSA_MEMORY, "serve", "--port", str(port), "--log-level", "warning"]
    if workers is not None:
        command += ["--workers", str(workers)]
    with tempfile.TemporaryDirectory(prefix="osa-load-") as tmp:
        log = Path(tmp) / "server.log"
        with log.open("ab") as f:
            proc = subprocess.Popen(command, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=revision_path or REPO)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"osa-memory serve exited with {proc.returncode}:\n{log.read_text()}")
                with suppress(httpx.HTTPError):
                    if httpx.get(f"http://127.0.0.1:{port}/status", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"osa-memory serve did not start:\n{log.read_text()}")
                time.sleep(0.3)
            yield f"http://127.0.0.1:{port}/mcp", proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            tail = log.read_text(errors="replace").splitlines()[-15:]
            if any("Traceback" in line or "ERROR" in line for line in tail):
                console.print("[yellow]server log tail:[/]\n" + "\n".join(tail))


def run_phase(
    url: str, pid: int, tokens: list[str], assignments: int, clients: int, phase: str, duration: float, processes: int
) -> PhaseResult:
    jobs = [(url, tokens[i % assignments], i % assignments) for i in range(clients)]
    shares = [jobs[p::processes] for p in range(min(processes, clients))]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ready = ctx.Queue()
    start = ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=_client_process, args=(share, assignments, phase, start, ready, duration, out))
        for share in shares
    ]
    for p in procs:
        p.start()
    # Every client starts calling at the same instant, once every session is open (on a busy machine, starting
    # the client processes and opening the sessions can take longer than any fixed lead time).
    for _ in jobs:
        ready.get(timeout=READY_TIMEOUT_S)
    start_at = time.time() + 0.5
    stop_at = start_at + duration
    start.value = start_at
    sampler = RssSampler(pid)
    sampler.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu_before = sampler.cpu()
    time.sleep(max(0.0, stop_at - time.time()))
    cpu_after = sampler.cpu()
    merged: list[dict[str, Any]] = [out.get(timeout=duration + 300) for _ in procs]
    for p in procs:
        p.join(30)
    rss = sampler.stop()
    latencies = [x for m in merged for x in m["latencies"]]
    kinds: dict[str, int] = {}
    for m in merged:
        for k, v in m["errors"].items():
            kinds[k] = kinds.get(k, 0) + v
    return PhaseResult(
        phase=phase,
        clients=clients,
        seconds=duration,
        calls=len(latencies),
        per_second=round(len(latencies) / duration, 1),
        latency_ms=percentiles(latencies, digits=1) or dict.fromkeys(("p50", "p95", "p99", "mean"), 0.0),
        errors=sum(kinds.values()),
        error_kinds=kinds,
        cross_scope=sum(m["cross"] for m in merged),
        server_rss_mib=rss,
        client_cpu_s=round(sum(m["cpu_s"] for m in merged), 1),
        server_cpu_s=round(RssSampler.spent(cpu_before, cpu_after, "server"), 1),
        postgres_cpu_s=round(RssSampler.spent(cpu_before, cpu_after, "postgres"), 1),
    )


def seed(config: MemoryConfig, assignments: int, facts: int, embedder: str) -> list[str]:
    """Facts through the import path; returns one bearer token per assignment."""
    memory = Memory(config, use_default_embedders=embedder != "none")
    tokens = TokenStore(memory.config.pg_conn_str or os.environ["PG_CONN_STR"], config)
    rnd = random.Random(7)
    issued = []
    with Progress(
        TextColumn("{task.description:<30}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task("storing facts", total=assignments * facts)
        for a in range(assignments):
            caller = Caller(org_id="load-org", assignment_id=f"asg-{a:03d}")
            items = [ImportItem(fact_text(a, n, rnd), f"seed:{n}", topic="load") for n in range(facts)]
            memory.import_items(items, caller=caller, on_batch=lambda n: bar.advance(task, n))
            issued.append(tokens.create(org_id="load-org", assignment_id=f"asg-{a:03d}").token)
    return issued


def print_results(report: Report) -> None:
    table = Table(title="osa-memory serve under concurrent MCP clients")
    for col in (
        "phase",
        "clients",
        "calls/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "errors",
        "cross-scope",
        "server RSS MiB",
        "CPU ms/call: server",
        "postgres",
        "clients",
    ):
        table.add_column(col, justify="right")
    for r in report.results:
        table.add_row(
            r.phase,
            str(r.clients),
            f"{r.per_second:.1f}",
            f"{r.latency_ms['p50']:.1f}",
            f"{r.latency_ms['p95']:.1f}",
            f"{r.latency_ms['p99']:.1f}",
            str(r.errors),
            str(r.cross_scope),
            f"{r.server_rss_mib:.0f}",
            *(f"{1000 * cpu / max(r.calls, 1):.1f}" for cpu in (r.server_cpu_s, r.postgres_cpu_s, r.client_cpu_s)),
        )
    console.print(table)
    for r in report.results:
        if r.error_kinds:
            console.print(f"{r.phase} x{r.clients} errors: {r.error_kinds}")


def plot(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for phase, style in (("recall", "o-"), ("store", "s--")):
        rows = [r for r in report.results if r.phase == phase]
        left.plot([r.clients for r in rows], [r.per_second for r in rows], style, label=phase)
        right.plot([r.clients for r in rows], [r.latency_ms["p95"] for r in rows], style, label=phase)
    for ax, label in ((left, "calls/s"), (right, "p95 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent MCP clients")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    workers = report.params.get("workers")
    fig.suptitle(
        f"osa-memory serve (workers={workers or 'default'}, {report.params['embedder']}), "
        f"{report.machine['cores']} cores"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- the wrk driver (--driver wrk) -----------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]

# Seeds a schema with the package found first on sys.path (a baseline checkout's, under --compare), through
# the API both revisions share; prints one token per assignment as JSON.
SEED_SCRIPT = """
import json, sys
import haystack_osa_memory
from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.store.tokens import TokenStore
from haystack_osa_memory.transfer import ImportItem
job = json.load(sys.stdin)
config = MemoryConfig(
    pg_conn_str=job["conn"], kb_schema=job["kb"], memory_schema=job["mem"], embedder=job["embedder"]
)
ensure_schema(job["conn"], config)
memory = Memory(config, use_default_embedders=job["embedder"] != "none")
tokens = TokenStore(job["conn"], config)
out = []
for org, assignment, texts in job["scopes"]:
    items = [ImportItem(text, f"seed:{n}", topic="load") for n, text in enumerate(texts)]
    memory.import_items(items, caller=Caller(org_id=org, assignment_id=assignment))
    out.append(tokens.create(org_id=org, assignment_id=assignment).token)
print("PACKAGE " + haystack_osa_memory.__file__)
print("TOKENS " + json.dumps(out))
"""


def fresh_config(conn_str: str, embedder: str) -> MemoryConfig:
    """A configuration naming schemas of its own (one knowledge base per server under test)."""
    suffix = uuid.uuid4().hex[:8]
    return MemoryConfig(
        pg_conn_str=conn_str, kb_schema=f"load_kb_{suffix}", memory_schema=f"load_mem_{suffix}", embedder=embedder
    )


def stored_facts(conn_str: str, config: MemoryConfig) -> int:
    """Facts in the knowledge base of ``config`` (every store of the load's phases writes a new one)."""
    return count_facts(conn_str, config)["facts"]


def settled(sampler: RssSampler, idle_ms: float = 2.0, step_s: float = 0.1, timeout_s: float = 30.0) -> None:
    """Return once the server has spent under ``idle_ms`` of CPU in ``step_s`` twice in a row: the calls in
    flight when wrk stopped have been served (nothing is asked of the database meanwhile)."""
    last, quiet, deadline = sampler.cpu(), 0, time.monotonic() + timeout_s
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(step_s)
        now = sampler.cpu()
        quiet = quiet + 1 if 1000 * RssSampler.spent(last, now, "server") < idle_ms else 0
        last = now


@dataclass
class WrkPhase:
    server: str
    phase: str
    connections: int
    result: WrkResult
    server_cpu_ms: float
    postgres_cpu_ms: float
    pss_mib: dict[str, float]
    rss_mib: dict[str, float]
    #: Share of the server's GIL samples per part of a call (`profile_shares.PARTS`), with ``--profile``.
    profile: dict[str, float] | None = None
    profile_samples: int = 0
    #: Milliseconds of GIL samples per call (all processes): what the shares of `profile` divide.
    profile_ms_per_call: float = 0.0
    #: With ``--store-calls``: the facts the server stored in the phase (what its CPU per call divides).
    stored: int = 0
    #: Facts per assignment in the server's knowledge base when the phase began and when it ended (a store's search
    #: reads its whole scope, so what a store costs grows with it; (0, 0) without the server's configuration).
    scope_facts: tuple[float, float] = (0.0, 0.0)
    #: The round this phase ran in (``--rounds``: the servers take turns going first) and the calls its CPU
    #: per call divides (the answered calls, or with ``--store-calls`` the facts stored).
    round: int = 0
    calls: int = 0


def seed_with(
    revision_path: Path | None, conn_str: str, config: MemoryConfig, assignments: int, facts: int
) -> list[str]:
    """Seed ``config``'s schema in a subprocess that runs the package at ``revision_path`` (else ours); the facts
    are made here, so both revisions get the same ones. Fails if the subprocess imported another package."""
    rnd = random.Random(7)
    scopes = [
        (f"load-org-{a % 2}", f"asg-{a:03d}", [fact_text(a, n, rnd) for n in range(facts)]) for a in range(assignments)
    ]
    job = {"conn": conn_str, "kb": config.kb_schema, "mem": config.memory_schema, "embedder": config.embedder}
    env = revision_env(revision_path) | {"PG_CONN_STR": conn_str}
    done = subprocess.run(
        [*PYTHON, "-c", SEED_SCRIPT],
        input=json.dumps(job | {"scopes": scopes}),
        env=env,
        cwd=revision_path or REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = dict(x.split(" ", 1) for x in done.stdout.splitlines() if x.startswith(("TOKENS ", "PACKAGE ")))
    if done.returncode != 0 or "TOKENS" not in lines:
        raise RuntimeError(f"seeding failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    if revision_path is not None and not Path(lines["PACKAGE"]).resolve().is_relative_to(revision_path.resolve()):
        raise RuntimeError(f"seeding {revision_path} imported the package at {lines['PACKAGE']}")
    return list(json.loads(lines["TOKENS"]))


def memory_by_process(pid: int) -> tuple[dict[str, float], dict[str, float]]:
    """PSS and RSS (MiB) of the serve process and each of its children that is not PostgreSQL. RSS counts
    the pages a forked worker shares with `serve` (the models) in full in each process; PSS divides each
    page among the processes that map it, so PSS sums to what the server holds."""
    pss: dict[str, float] = {}
    rss: dict[str, float] = {}
    with suppress(psutil.Error):
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with suppress(psutil.Error):
                if "postgres" not in p.name():
                    label = "serve" if p.pid == pid else f"worker {p.pid}"
                    info = p.memory_full_info()
                    pss[label] = round(info.pss / 2**20, 1)
                    rss[label] = round(info.rss / 2**20, 1)
    return pss, rss


def run_wrk_phase(
    server: str,
    url: str,
    pid: int,
    tokens: list[str],
    phase: str,
    connections: int,
    duration: float,
    conn_str: str,
    profile_dir: Path | None = None,
    config: MemoryConfig | None = None,
    calls: int = 0,
    round_: int = 0,
) -> WrkPhase:
    """One wrk phase against one server. With ``calls`` (stores only, ``config`` naming the server's knowledge
    base), it ends after that many stores, and its CPU per call divides by the facts the server stored: those
    answered and those still in flight when wrk stopped (served before the CPU is read again, counted in the
    database after)."""
    sampler = RssSampler(pid, postmaster_pid(conn_str))
    # Shorter than the phase by a second, so that it ends while wrk still drives the server.
    recorded_s = max(int(duration) - 1, 1)
    raw = (
        None
        if profile_dir is None
        else profile_dir / f"{server.replace('/', '_')}_{phase}_{connections}{f'_r{round_ + 1}' if round_ else ''}.txt"
    )
    recording = None if raw is None else start_recording(pid, recorded_s, raw)
    counted = calls > 0 and phase == "store" and config is not None
    facts_before = stored_facts(conn_str, config) if config is not None else 0
    before = sampler.cpu()
    result = run_wrk(
        url, tokens, [tag(a) for a in range(len(tokens))], phase, connections, duration, calls if counted else 0
    )
    if counted:
        settled(sampler)
    after = sampler.cpu()
    facts_after = stored_facts(conn_str, config) if config is not None and phase == "store" else facts_before
    stored = facts_after - facts_before if counted else 0
    shares, samples = None, 0
    if recording is not None and raw is not None:
        _, err = recording.communicate(timeout=60)
        if recording.returncode != 0 or not raw.exists():
            raise RuntimeError(f"py-spy failed ({recording.returncode}): {err.decode(errors='replace')[-2000:]}")
        shares, samples = file_shares(raw)
    done_calls = max(stored if counted else result.requests, 1)
    pss, rss = memory_by_process(pid)
    return WrkPhase(
        server=server,
        phase=phase,
        connections=connections,
        result=result,
        server_cpu_ms=round(1000 * RssSampler.spent(before, after, "server") / done_calls, 2),
        postgres_cpu_ms=round(1000 * RssSampler.spent(before, after, "postgres") / done_calls, 2),
        pss_mib=pss,
        rss_mib=rss,
        profile=shares,
        profile_samples=samples,
        # each process is sampled `RATE` times a second while it holds its interpreter lock
        profile_ms_per_call=round(samples / RATE * 1000 / max(result.per_second * recorded_s, 1e-9), 3),
        stored=stored,
        scope_facts=(round(facts_before / len(tokens), 1), round(facts_after / len(tokens), 1)),
        round=round_,
        calls=done_calls,
    )


def _scope_facts(span: tuple[float, float]) -> str:
    """Facts per scope during a phase: ``60`` when it did not change, ``60-135`` when it grew."""
    start, end = span
    return f"{start:g}" if start == end else f"{start:g}-{end:g}"


def _pooled(rows: list[WrkPhase]) -> tuple[float, float, float]:
    """Over the rounds of one server's phase: calls per second (all calls over all seconds), server + PostgreSQL
    CPU milliseconds per call (all CPU over all calls), and the median p99."""
    calls = sum(max(r.calls, 1) for r in rows)
    per_second = sum(r.result.requests for r in rows) / max(sum(r.result.seconds for r in rows), 1e-9)
    cpu = sum((r.server_cpu_ms + r.postgres_cpu_ms) * max(r.calls, 1) for r in rows) / calls
    return per_second, cpu, statistics.median(r.result.latency_ms["p99"] for r in rows)


def print_wrk(rows: list[WrkPhase], baseline: str | None) -> None:
    rounds = max((r.round for r in rows), default=0) + 1
    table = Table(title="osa-memory serve driven by wrk (raw JSON-RPC tools/call, stateless)")
    for col in (
        "server",
        "phase",
        "conns",
        *(["round"] if rounds > 1 else []),
        "calls/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "errors",
        "cross-scope",
        "CPU ms/call: server",
        "postgres",
        "PSS MiB (sum)",
        "facts/scope",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r.server,
            r.phase,
            str(r.connections),
            *([str(r.round + 1)] if rounds > 1 else []),
            f"{r.result.per_second:.1f}",
            *(f"{r.result.latency_ms[q]:.1f}" for q in ("p50", "p90", "p99")),
            str(r.result.errors),
            str(r.result.cross_scope),
            f"{r.server_cpu_ms:.2f}",
            f"{r.postgres_cpu_ms:.2f}",
            f"{sum(r.pss_mib.values()):.0f}",
            _scope_facts(r.scope_facts),
        )
    console.print(table)
    if baseline is None:
        return
    title = f"current / {baseline} (same run" + (
        f", {rounds} rounds pooled, servers taking turns first)" if rounds > 1 else ")"
    )
    ratios = Table(title=title)
    columns = ["phase", "conns", "calls/s", "p99 ms", "CPU ms/call (server + postgres)"]
    for col in columns + (["CPU ratio per round (min-max)"] if rounds > 1 else []):
        ratios.add_column(col, justify="right")
    for phase, conns in dict.fromkeys((r.phase, r.connections) for r in rows):
        ours = [r for r in rows if r.server == "current" and (r.phase, r.connections) == (phase, conns)]
        theirs = [r for r in rows if r.server == baseline and (r.phase, r.connections) == (phase, conns)]
        if not ours or not theirs:
            continue
        (rate, cpu, p99), (old_rate, old_cpu, old_p99) = _pooled(ours), _pooled(theirs)
        cells = [phase, str(conns), f"{rate / max(old_rate, 1e-9):.2f}x", f"{p99 / max(old_p99, 1e-9):.2f}x"]
        cells.append(f"{cpu / max(old_cpu, 1e-9):.2f}x")
        if rounds > 1:
            each = [_pooled([o])[1] / max(_pooled([t])[1], 1e-9) for o, t in zip(ours, theirs, strict=False)]
            cells.append(f"{min(each):.2f}-{max(each):.2f}x")
        ratios.add_row(*cells)
    console.print(ratios)


def main_wrk(args: argparse.Namespace, report: Report) -> list[WrkPhase]:
    connections = [int(c) for c in args.connections.split(",") if c]
    phases = [p for p in args.phases.split(",") if p]
    rows: list[WrkPhase] = []
    checkout = worktree(args.compare, REPO) if args.compare else None
    try:
        with database("osa-load-") as conn_str:
            servers: list[tuple[str, Path | None]] = [("current", None)]
            if checkout is not None:
                servers.insert(0, (args.compare, checkout))
            seeded = []
            for label, path in servers:
                config = fresh_config(conn_str, args.embedder)
                console.print(f"seeding {label}: {args.assignments} assignments x {args.facts} facts ...")
                tokens = seed_with(path, conn_str, config, args.assignments, args.facts)
                seeded.append((label, path, config, tokens))
            with ExitStack() as stack:
                running = []
                for label, path, config, tokens in seeded:
                    url, pid = stack.enter_context(serve(config, conn_str, args.workers, args.embedder, path))
                    running.append((label, url, pid, tokens, config))
                for phase in phases:
                    for conns in connections:
                        for round_ in range(args.rounds):
                            # Side by side: one server, then the other; in every other round the other goes first
                            # (the same code served twice measured 0.87-1.11x the CPU per call between back-to-back
                            # phases: benchmarks/README.md, "The same code served twice").
                            turns = running if round_ % 2 == 0 else running[::-1]
                            for label, url, pid, tokens, config in turns:
                                counted = phase == "store" and args.store_calls > 0
                                until = f"{args.store_calls} stores or " if counted else ""
                                console.print(
                                    f"{label}: {phase}, {conns} connections for {until}{args.duration:.0f} s"
                                    + (f" (round {round_ + 1} of {args.rounds})" if args.rounds > 1 else "")
                                    + " ..."
                                )
                                rows.append(
                                    run_wrk_phase(
                                        label,
                                        url,
                                        pid,
                                        tokens,
                                        phase,
                                        conns,
                                        args.duration,
                                        conn_str,
                                        args.profile,
                                        config=config,
                                        calls=args.store_calls,
                                        round_=round_,
                                    )
                                )
    finally:
        if checkout is not None:
            remove_worktree(checkout, REPO)
    print_wrk(rows, args.compare)
    for r in rows:
        console.print(f"{r.server} {r.phase} x{r.connections} PSS MiB per process: {r.pss_mib}; RSS: {r.rss_mib}")
    profiled = [r for r in rows if r.profile]
    if profiled:
        print(f"\nWhere the server's Python time went (py-spy --gil samples, raw files in {args.profile}; py-spy")
        print("pauses the server for each sample: this run's CPU figures do not compare with an unprofiled run's).")
        print("Share of the samples, and the milliseconds per call it stands for (samples / rate / calls):")
        columns = [
            (
                f"{r.server[:8]} {r.phase} x{r.connections}" + (f" r{r.round + 1}" if r.round else ""),
                r.profile or {},
                r.profile_samples,
            )
            for r in profiled
        ]
        print(format_table(columns, [r.profile_ms_per_call for r in profiled]))
    report.results = []  # the wrk rows are written instead
    if args.json:
        payload = asdict(report) | {"wrk": [asdict(r) for r in rows]}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return rows


def main(argv: list[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--sweep", type=str, default=None, help="Client counts, e.g. 1,4,16,32,64 (overrides --clients)."
    )
    parser.add_argument("--assignments", type=int, default=16)
    parser.add_argument("--facts", type=int, default=200, help="Facts stored per assignment before the run.")
    parser.add_argument("--duration", type=float, default=20.0, help="Seconds per phase.")
    parser.add_argument("--workers", type=int, default=None, help="serve --workers (default: serve's default).")
    parser.add_argument("--embedder", default="minilm", choices=["minilm", "none"], help="none: lexical recall.")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--phases", default="recall,store")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument(
        "--driver",
        choices=["mcp", "wrk"],
        default="mcp",
        help="mcp: official MCP client sessions; wrk: raw JSON-RPC posts from wrk (near-free client).",
    )
    parser.add_argument("--connections", default="1,32", help="wrk connection counts, e.g. 1,32 (--driver wrk).")
    parser.add_argument(
        "--compare", default=None, metavar="REV", help="Also serve a checkout of REV, side by side (--driver wrk)."
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="Record the server with py-spy during each phase (raw files in DIR) and print where its time went "
        "(--driver wrk).",
    )
    parser.add_argument(
        "--store-calls",
        type=int,
        default=0,
        metavar="N",
        help="Each store phase ends after N stores (or --duration seconds, whichever comes first), so that "
        "servers compared side by side store the same facts: a store's search reads its scope, which each "
        "store makes one fact bigger (--driver wrk; default 0: --duration alone).",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="Run each phase N times per server, the servers taking turns going first, and compare the pooled "
        "figures (--driver wrk with --compare; default 1).",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    if args.store_calls < 0:
        parser.error("--store-calls must be 0 (off) or a number of stores")
    if min(args.clients, args.assignments, args.client_processes) < 1 or args.facts < 0 or args.duration <= 0:
        parser.error("--clients, --assignments and --client-processes must be >= 1, --facts >= 0, --duration > 0")
    counts = [int(c) for c in args.sweep.split(",")] if args.sweep else [args.clients]
    phases = [p for p in args.phases.split(",") if p]
    if any(p not in ("recall", "store") for p in phases):
        parser.error("--phases takes recall and/or store")
    report = Report(
        machine_info(),
        {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "client_counts": counts},
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    if args.profile is not None and args.driver != "wrk":
        parser.error("--profile needs --driver wrk")
    if args.driver == "wrk":
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
        main_wrk(args, report)
        return report
    with database("osa-load-") as conn_str:
        config = fresh_config(conn_str, args.embedder)
        ensure_schema(conn_str, config)
        console.print(f"seeding {args.assignments} assignments x {args.facts} facts ...")
        tokens = seed(config, args.assignments, args.facts, args.embedder)
        with serve(config, conn_str, args.workers, args.embedder) as (url, pid):
            for clients in counts:
                for phase in phases:
                    console.print(f"{phase}: {clients} clients for {args.duration:.0f} s ...")
                    report.results.append(
                        run_phase(
                            url, pid, tokens, args.assignments, clients, phase, args.duration, args.client_processes
                        )
                    )
    print_results(report)
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    if args.plot:
        plot(report, args.plot)
    return report


if __name__ == "__main__":
    main()
