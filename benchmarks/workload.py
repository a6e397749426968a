"""The load benchmarks' workload: the facts and queries of `load.py`, `parameters.py`, `call_parts.py` and
`scope_memo.py`, their callers, and the database cluster's CPU time; for the in-process scripts, a seeded
knowledge base and the blocks of calls they measure two ways of, alternating (`two_ways`, `two_ways_main`).

Every assignment's facts carry a tag word no other assignment's do (`tag`), so a recall that answered with
another assignment's fact would show it. `wrk_driver.LUA` draws its queries from the same words.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.harness import database, fresh_schema, machine_info, postmaster_pid
from haystack_osa_memory import (
    Caller,
    Memory,
    MemoryConfig,
    use_lean_component_spans,
    use_lean_input_copies,
    use_lean_scheduling,
)
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


def embedding_texts(data: Path | None, queries: int, facts: int) -> tuple[list[str], list[str]]:
    """``queries`` questions and ``facts`` turns of LoCoMo-format ``data`` for the embedder benchmarks, spread over it
    (all of them when it has fewer), or synthetic ones (`query_text`, `fact_text`)."""
    rnd = random.Random(11)
    if data is None:
        return [query_text(n % 16, rnd) for n in range(queries)], [fact_text(n % 16, n, rnd) for n in range(facts)]
    from benchmarks.locomo_data import load_locomo, spread, texts_from

    turns, questions = texts_from(load_locomo(data))
    return spread(questions, queries), spread(turns, facts)


def one_thread_texts(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """One intra-op thread for the embedders (as `osa-memory serve` runs them), and the benchmark's questions and
    turns (`embedding_texts` of ``args.data``, ``args.queries``, ``args.facts``)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    return embedding_texts(args.data, args.queries, args.facts)


def embedding_run(args: argparse.Namespace, questions: list[str], turns: list[str]) -> dict[str, Any]:
    """What an embedder benchmark's result says of its run: the machine, the texts and how many, the rounds."""
    return {
        "machine": machine_info(),
        "texts": "locomo" if args.data else "synthetic",
        "queries": len(questions),
        "facts": len(turns),
        "rounds": args.rounds,
    }


def embedding_texts_main(
    argv: list[str] | None,
    doc: str | None,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    report: Callable[[dict[str, Any]], object],
    *,
    rounds: int,
    more: Callable[[argparse.ArgumentParser], object] | None = None,
) -> dict[str, Any]:
    """The command line of an embedder benchmark over `embedding_texts`: ``--data``, ``--queries``, ``--facts``,
    ``--rounds`` (default ``rounds``), what ``more`` adds and ``--json``; then ``run``, its result printed by
    ``report`` and written to ``--json``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None, help="LoCoMo-format JSON (default: synthetic texts)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--facts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=rounds)
    if more is not None:
        more(parser)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if min(args.queries, args.facts, args.rounds) < 1:
        parser.error("--queries, --facts and --rounds must be at least 1")
    result = run(args)
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def caller_of(assignment: int) -> Caller:
    """The caller working on assignment ``assignment`` (two orgs, assignments alternating between them)."""
    return Caller(org_id=f"load-org-{assignment % 2}", assignment_id=f"asg-{assignment:03d}", specialist_id="s")


def cluster_cpu(postmaster: int | None) -> dict[int, float]:
    """CPU seconds so far of each process of the database cluster, by pid: its postmaster and that process's
    children (/proc); empty without one."""
    if postmaster is None:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    spent: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(entry) == postmaster or int(fields[1]) == postmaster:
            spent[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    return spent


#: A sample's key: a pid (`cluster_cpu`), or whatever else names a process.
K = TypeVar("K")


def cpu_spent(before: Mapping[K, float], after: Mapping[K, float]) -> float:
    """CPU seconds spent between two samples of processes' CPU so far (`cluster_cpu`'s, or keyed otherwise). A
    process started meanwhile counts whole; one that ended meanwhile (a closed connection, an autovacuum worker)
    is missed: subtracting the totals would take its whole life's CPU off, and a short block then came out
    negative."""
    return sum(seconds - before.get(key, 0.0) for key, seconds in after.items())


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
    use_lean_component_spans()
    use_lean_scheduling()
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
        db, cpu = cluster_cpu(postmaster), time.process_time()
        for _ in range(calls):
            call(way)
        return (time.process_time() - cpu) / max(calls, 1) * 1000, cpu_spent(db, cluster_cpu(postmaster)) / max(
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


@contextmanager
def seeded_calls(args: argparse.Namespace, prefix: str) -> Iterator[tuple[Memory, int | None, Callable[[int], None]]]:
    """A fresh knowledge base (`knowledge_base`) seeded with ``args.facts`` facts in each of ``args.assignments``
    assignments and warmed up: its memory, its cluster's postmaster, and ``call(n)``, the ``n``-th call of
    ``args.phase`` (a recall, or a store of a new fact), round robin over the assignments."""
    rnd = random.Random(5)
    with knowledge_base(prefix, args.embedder) as (config, postmaster):
        memory = Memory(config, use_default_embedders=args.embedder != "none")
        callers = [caller_of(a) for a in range(args.assignments)]
        seed(memory, callers, args.facts, rnd)
        memory.warm_up()

        def call(n: int) -> None:
            a = n % len(callers)
            if args.phase == "recall":
                memory.recall(query_text(a, rnd), limit=8, caller=callers[a])
            else:
                memory.store(fact_text(a, 5 * 10**6 + n + 1, rnd), caller=callers[a])

        yield memory, postmaster, call


def two_ways(
    args: argparse.Namespace, prefix: str, ways: tuple[str, str], switch: Callable[[Memory], Callable[[bool], object]]
) -> dict[str, Any]:
    """Seed a fresh knowledge base (``args``: `add_block_arguments` and ``--phase``), then recall or store in
    alternating blocks, way False (named ``ways[0]``) and way True (``ways[1]``), ``switch(memory)(way)`` before
    each block and ``switch(memory)(True)`` (the way the package ships) after the last: the medians per part
    (`paired_medians`) as ``{part: {"<way>_ms": ..., "ratio": ..., "paired_difference_ms": ...}}``."""
    with seeded_calls(args, prefix) as (memory, postmaster, one_call):
        to = switch(memory)
        count = 0

        def call(_way: bool) -> None:  # the way is switched per block
            nonlocal count
            one_call(count)
            count += 1

        try:
            samples = alternating_blocks(
                call, postmaster, warmup=args.warmup, block=args.block, rounds=args.rounds, switch=to
            )
        finally:
            to(True)
    return ways_result(args, samples, ways)


def ways_result(args: argparse.Namespace, samples: dict[bool, list[BlockCpu]], ways: tuple[str, str]) -> dict[str, Any]:
    """`alternating_blocks`' samples of way False (``ways[0]``) and True (``ways[1]``) as `two_ways` returns them."""
    result: dict[str, Any] = {"embedder": args.embedder, "phase": args.phase, "block": args.block}
    result["rounds"] = args.rounds
    off_name, on_name = ways
    for part, (off, on, paired) in paired_medians(samples).items():
        result[part] = {
            f"{off_name}_ms": off,
            f"{on_name}_ms": on,
            "ratio": on / off if off else None,
            "paired_difference_ms": paired,
        }
    return result


def print_two_ways(args: argparse.Namespace, result: dict[str, Any], ways: tuple[str, str]) -> None:
    """`two_ways`' result as the benchmarks print it."""
    off_name, on_name = ways
    print(f"{args.embedder} {args.phase}, {args.rounds} pairs of {args.block}-call blocks, CPU ms per call:")
    for part in ("server", "postgres", "total"):
        r = result[part]
        ratio = f"{r['ratio']:.3f}x" if r["ratio"] is not None else "n/a"
        print(
            f"  {part:8} {off_name} {r[f'{off_name}_ms']:.3f}  {on_name} {r[f'{on_name}_ms']:.3f}  ratio {ratio}"
            f"  median paired difference {r['paired_difference_ms']:+.3f}"
        )


def two_ways_main(
    argv: list[str] | None,
    doc: str | None,
    ways: tuple[str, str],
    run: Callable[[argparse.Namespace], dict[str, Any]],
    *,
    defaults: dict[str, int],
    report: Callable[[dict[str, Any]], object] | None = None,
    more: Callable[[argparse.ArgumentParser], object] | None = None,
) -> int:
    """The command line of a two-ways benchmark: `add_block_arguments` (``defaults``: assignments, block,
    rounds, warmup), ``--phase`` and what ``more`` adds, then ``run``, its result printed (`print_two_ways`, then
    ``report``) and written to ``--json`` with the machine's description."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_block_arguments(parser, **defaults)
    parser.add_argument("--phase", choices=["recall", "store"], default="recall")
    if more is not None:
        more(parser)
    args = parser.parse_args(argv)
    check_block_arguments(parser, args)
    result = run(args)
    print_two_ways(args, result, ways)
    if report is not None:
        report(result)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "result": result}, indent=2), encoding="utf-8")
    return 0
