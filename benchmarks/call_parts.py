"""Where a call's CPU goes, part by part, in one process on one seeded knowledge base.

Parts of a call that the served figures (`load.py --driver wrk`) cannot tell apart:

- ``--part search``: a store with the search for the facts it may replace (``possibly_supersedes``) against
  the same store without it (`MemoryConfig.suggest_supersedes` off). Blocks of ``--block`` stores, one way then
  the other, the order swapped each round, ``--rounds`` times; it prints the median CPU per store of this
  process and of the database cluster, each way, and what the search adds.
- ``--part exact``: the exact path (a store's search for the facts it may replace, or a recall of a scope
  neither held nor kept in memory: ``--phase``) reading the scope's rows and the query's terms in one statement
  (`candidates.SCOPE_RECALL_ROWS`, the package's way) against the two read apart (`recall_rows.QUERY_TERMS`, then
  `candidates.SCOPE_ROWS`, the way before it). Blocks alternating as for ``search``; recalls run with the scopes'
  rows not kept in memory (`scope_memo` off), as a recall after a store reads them; ``--phase read`` times the
  read alone (`FactRepository.scope_hits` on the seeded scopes, a new fact's text as the query, as a store's search
  reads, nothing written: the scopes keep their size, lexical only).
- ``--part join``: stores whose fact joins its scope's rows kept in memory (`ScopeMemo.written`, the package's
  way: the store's search is answered from them) against stores whose fact does not (the way before it: the
  search finds the scope changed and reads it). Blocks alternating as for ``search``; the rows kept are dropped
  before each block, so that each way starts from a scope read once.
- ``--part since``: stores by two memories (as two serving workers: each scope's stores go to one, then the other,
  by turns), so that a store's search finds its scope's rows kept changed by the other's facts: caught up with the
  facts stored since (`ScopeMemo.caught_up`, the package's way) against the way before it (the exact path, then
  skipping the print for the next 1, 2, 4, ... stores of the scope). Both memories' CPU is counted. Blocks
  alternating as for ``join``, each starting from scopes read once.
- ``--part plans``: PostgreSQL's planning and execution time of each read statement a recall and a store run,
  medians over ``--calls`` recalls and stores. Right before a statement runs, the same text runs once more
  under ``EXPLAIN (ANALYZE, SUMMARY)`` on the same connection with the same parameters (psycopg's
  ``Cursor.execute`` is wrapped for the measured calls only). Statements that write are never explained (an
  ``EXPLAIN ANALYZE`` executes them): their planning is not in the table.

    python benchmarks/call_parts.py --part search [--embedder minilm] [--block 40 --rounds 10] [--json out.json]
    python benchmarks/call_parts.py --part exact [--phase recall|read] [--embedder minilm] [--block 200 --rounds 8]
    python benchmarks/call_parts.py --part join [--embedder minilm] [--block 200 --rounds 8]
    python benchmarks/call_parts.py --part since [--embedder minilm] [--block 200 --rounds 8]
    python benchmarks/call_parts.py --part plans [--calls 200]

One torch thread, as each `serve` worker of a 2-CPU machine has (``OMP_NUM_THREADS``, when not set).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads

import psycopg
from psycopg import sql

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import machine_info
from benchmarks.workload import (
    add_block_arguments,
    alternating_blocks,
    caller_of,
    check_block_arguments,
    fact_text,
    knowledge_base,
    paired_medians,
    print_two_ways,
    query_text,
    seed,
    seeded_calls,
    two_ways,
    ways_result,
)
from haystack_osa_memory import Memory
from haystack_osa_memory.store.candidates import ScopeHit, exact_hits
from haystack_osa_memory.store.facts import FactRepository
from haystack_osa_memory.store.parameters import text_array
from haystack_osa_memory.store.ranking import RankingParams
from haystack_osa_memory.store.recall_rows import QueryTerms, with_boost
from haystack_osa_memory.store.scope_query import ScopeQuery
from haystack_osa_memory.supersession_suggestions import SUGGESTIONS_SEARCHED

#: A statement that changes data: `EXPLAIN ANALYZE` would run it, so it is never explained.
WRITES = re.compile(rb"\b(INSERT|UPDATE|DELETE|MERGE|TRUNCATE|CREATE|ALTER|DROP|LOCK|SET|ANALYZE|VACUUM)\b", re.I)
EXPLAIN = b"EXPLAIN (ANALYZE, SUMMARY ON, FORMAT JSON) "
#: Audit rows of stores: one per store (an explained write would have added a second).
STORE_AUDITS = sql.SQL("SELECT count(*) FROM {mem}.audit WHERE action = 'store'")


def search_part(args: argparse.Namespace) -> dict[str, Any]:
    """Stores with and without the search for the facts they may replace, blocks alternating."""
    rnd = random.Random(5)
    with knowledge_base("parts", args.embedder) as (config, postmaster):
        embedders = args.embedder != "none"
        ways = {
            True: Memory(config, use_default_embedders=embedders),
            False: Memory(config.model_copy(update={"suggest_supersedes": False}), use_default_embedders=embedders),
        }
        callers = [caller_of(a) for a in range(args.assignments)]
        seed(ways[True], callers, args.facts, rnd)
        count = 0
        answered: dict[bool, int] = {True: 0, False: 0}

        def store(search: bool) -> None:
            nonlocal count
            a, count = count % len(callers), count + 1
            answer = ways[search].store(fact_text(a, 5 * 10**6 + count, rnd), caller=callers[a])
            answered[search] += "possibly_supersedes" in answer

        samples = alternating_blocks(store, postmaster, warmup=args.warmup, block=args.block, rounds=args.rounds)
    result: dict[str, Any] = {"embedder": args.embedder, "block": args.block, "rounds": args.rounds}
    result["answers_with_suggestions"] = {"with_search": answered[True], "without_search": answered[False]}
    for part, (without, with_search, paired) in paired_medians(samples).items():
        result[part] = {"without_ms": without, "with_ms": with_search, "search_ms": paired}
        result[part]["search_share"] = paired / with_search if with_search else None
    return result


def exact_apart(
    repo: FactRepository,
    cur: psycopg.Cursor[Any],
    params: dict[str, Any],
    query: str,
    ranking: RankingParams,
    boost: QueryTerms | None,
) -> list[ScopeHit]:
    """The exact path as it ran before `SCOPE_RECALL_ROWS`: the query's terms, then `SCOPE_ROWS`."""
    lexemes, query_terms = repo.query_terms(query, conn=cur.connection)
    lexemes, boost_terms = with_boost(lexemes, boost, ranking.time_boost)
    params["lexemes"] = text_array(lexemes)
    return exact_hits(cur.execute(repo.scope_rows_statement, params).fetchall(), query_terms, ranking, boost_terms)


def exact_part(args: argparse.Namespace) -> dict[str, Any]:
    """The exact path in one statement (way True) or two (way False), blocks alternating."""
    in_one = FactRepository.__dict__["_exact_hits"]

    def to(one: bool) -> None:
        FactRepository._exact_hits = in_one if one else exact_apart  # type: ignore[method-assign]

    def switch(memory: Memory) -> Any:
        if args.phase == "recall":
            # Recalls would otherwise be answered from the rows kept in memory (a store's search never is).
            assert memory.kb is not None
            memory.kb.facts.scope_memo = None
        return to

    try:
        result = exact_reads(args, to) if args.phase == "read" else two_ways(args, "exact", EXACT_WAYS, switch)
    finally:
        to(True)
    result["part"] = "exact"
    return result


#: The exact path's two ways (`exact_part`): the query's terms and `SCOPE_ROWS` apart, or in one statement.
EXACT_WAYS = ("apart", "one")


#: A store's two ways (`join_part`): its fact left out of the rows kept, or joining them.
JOIN_WAYS = ("apart", "joined")


def join_part(args: argparse.Namespace) -> dict[str, Any]:
    """Stores whose fact joins the rows kept (way True) or not (way False), blocks alternating; ``joins``: the
    facts that joined the rows kept during each way's blocks."""
    joins = {False: 0, True: 0}
    since: list[tuple[bool, int]] = []  # the way of the block running, and the memo's joins at its start

    def switch(memory: Memory) -> Any:
        assert memory.kb is not None
        repo = memory.kb.facts
        memo = repo.scope_memo
        assert memo is not None

        def to(joined: bool) -> None:
            if since:
                way, at = since.pop()
                joins[way] += memo.joined - at
            if joined:
                repo.__dict__.pop("_written", None)
            else:
                repo._written = lambda params, chunk_meta, row: None  # type: ignore[method-assign]
            memo.clear()  # each way starts from scopes read again (a store's search reads them once)
            since.append((joined, memo.joined))

        return to

    result = two_ways(args, "join", JOIN_WAYS, switch)
    result["part"] = "join"
    result["joins"] = {JOIN_WAYS[0]: joins[False], JOIN_WAYS[1]: joins[True]}
    return result


#: A store's two ways (`since_part`) when its scope changed unseen: the exact path, or caught up with.
SINCE_WAYS = ("exact", "caught_up")


def since_part(args: argparse.Namespace) -> dict[str, Any]:
    """Stores by two memories taking turns at each scope, their rows kept caught up with the facts the other
    stored (way True) or not (way False), blocks alternating; ``caught``: the catch-ups during each way's blocks,
    ``routes``: how the stores' searches read their scopes each way (`ScopeMemo.route`)."""
    caught = {False: 0, True: 0}
    routes: dict[bool, dict[str, int]] = {False: defaultdict(int), True: defaultdict(int)}
    running = [True]  # the way of the block running

    def switch(memory: Memory) -> Any:
        other = Memory(memory.config, use_default_embedders=args.embedder != "none")
        other.warm_up()
        stores = [memory.store, other.store]
        count = [0]

        def by_turns(*a: Any, **kw: Any) -> Any:  # scope n % assignments: one memory's, then the other's
            count[0] += 1
            return stores[(count[0] // args.assignments) % 2](*a, **kw)

        memory.store = by_turns  # type: ignore[method-assign]
        memos = []
        for m in (memory, other):
            assert m.kb is not None
            memo = m.kb.facts.scope_memo
            assert memo is not None
            memos.append(memo)
            route = memo.route

            def recorded(key: tuple[str, str], route: Any = route) -> Any:
                way = route(key)
                routes[running[0]][way] += 1
                return way

            memo.route = recorded  # type: ignore[method-assign]

        def not_caught_up(memo: Any, key: tuple[str, str], now: Any, at: float) -> Any:  # the way before
            way = type(memo).current(memo, key, now, at)
            if way != "since":
                return way
            with memo._lock:
                return memo._skip(memo._entries[key], now)

        def to(caught_up: bool) -> None:
            caught[running[0]] += sum(m.caught for m in memos)
            for memo in memos:
                memo.caught = 0
                if caught_up:
                    memo.__dict__.pop("current", None)
                else:
                    memo.current = lambda key, now, at, memo=memo: not_caught_up(memo, key, now, at)
                memo.clear()
            running[0] = caught_up

        return to

    result = two_ways(args, "since", SINCE_WAYS, switch)
    result["part"] = "since"
    result["caught"] = {SINCE_WAYS[0]: caught[False], SINCE_WAYS[1]: caught[True]}
    result["routes"] = {SINCE_WAYS[0]: dict(routes[False]), SINCE_WAYS[1]: dict(routes[True])}
    return result


def exact_reads(args: argparse.Namespace, to: Any) -> dict[str, Any]:
    """The exact path's read alone (`FactRepository.scope_hits`, nothing written, so the scopes keep their size),
    with a new fact's text as the query, as a store's search for the facts it may replace reads its scope."""
    rnd = random.Random(7)
    with seeded_calls(args, "exact_reads") as (memory, postmaster, _store):
        assert memory.kb is not None
        repo = memory.kb.facts
        repo.scope_memo = None  # every read takes the exact path
        scopes = [ScopeQuery.of(c.org_id, c.assignment_id) for c in map(caller_of, range(args.assignments))]
        queries = [fact_text(i % len(scopes), 9 * 10**6 + i, rnd) for i in range(400)]
        ranking = RankingParams(k=SUGGESTIONS_SEARCHED)
        count = 0

        def read(_way: bool) -> None:
            nonlocal count
            with repo.reading() as conn:
                repo.scope_hits(
                    scopes[count % len(scopes)],
                    query=queries[count % len(queries)],
                    embedding=None,
                    ranking=ranking,
                    conn=conn,
                )
            count += 1

        samples = alternating_blocks(
            read, postmaster, warmup=args.warmup, block=args.block, rounds=args.rounds, switch=to
        )
    return ways_result(args, samples, EXACT_WAYS)


def statement_text(query: Any, conn: psycopg.Connection[Any]) -> bytes:
    if isinstance(query, bytes):
        return query
    if isinstance(query, str):
        return query.encode()
    if isinstance(query, sql.Composable):
        return query.as_bytes(conn)
    return bytes(query)


def label(text: bytes, schemas: set[str]) -> str:
    """The statement's first words, its schema names left out (the same label on every connection)."""
    words = " ".join(text.decode(errors="replace").split())
    for schema in schemas:
        words = words.replace(f'"{schema}".', "").replace(f"{schema}.", "")
    return words[:90]


def plans_part(args: argparse.Namespace) -> dict[str, Any]:
    """Planning and execution time of the read statements of ``--calls`` recalls and stores."""
    rnd = random.Random(7)
    timings: dict[str, list[tuple[float, float]]] = defaultdict(list)
    skipped: dict[str, int] = defaultdict(int)
    with knowledge_base("parts", args.embedder) as (config, _):
        memory = Memory(config, use_default_embedders=args.embedder != "none")
        callers = [caller_of(a) for a in range(args.assignments)]
        seed(memory, callers, args.facts, rnd)
        schemas = {config.kb_schema, config.memory_schema}

        def call(i: int) -> None:
            a = i % len(callers)
            memory.recall(query_text(a, rnd), limit=8, caller=callers[a])
            memory.store(fact_text(a, 10**6 + i, rnd), caller=callers[a])

        for i in range(args.warmup):
            call(i)
        original = psycopg.Cursor.execute

        def explained(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kwargs: Any) -> Any:
            text = statement_text(query, self.connection)
            if WRITES.search(text):
                skipped[label(text, schemas)] += 1
            elif params is not None:
                with self.connection.cursor() as cur:  # text results: the plan as JSON
                    plan = original(cur, EXPLAIN + text, params).fetchone()
                assert plan is not None
                summary = plan[0][0]
                timings[label(text, schemas)].append((summary["Planning Time"], summary["Execution Time"]))
            return original(self, query, params, **kwargs)

        psycopg.Cursor.execute = explained  # type: ignore[method-assign,assignment]
        try:
            for i in range(args.calls):
                call(args.warmup + i)
        finally:
            psycopg.Cursor.execute = original  # type: ignore[method-assign]
        with psycopg.connect(config.pg_conn_str) as conn:  # each store written once (no write was explained)
            row = conn.execute(STORE_AUDITS.format(**config.sql_names())).fetchone()
        store_audits = int(row[0]) if row else 0
    statements = [
        {
            "statement": key,
            "runs": len(runs),
            "planning_ms": statistics.median(p for p, _ in runs),
            "execution_ms": statistics.median(e for _, e in runs),
        }
        for key, runs in timings.items()
    ]
    return {
        "embedder": args.embedder,
        "calls": args.calls,
        "statements": statements,
        "not_explained": dict(skipped),
        "store_audit_rows": store_audits,
        "stores": args.warmup + args.calls,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["search", "exact", "join", "since", "plans"], default="search")
    add_block_arguments(parser, assignments=16, block=40, rounds=10, warmup=20)
    parser.add_argument("--calls", type=int, default=200, help="recalls and stores explained (--part plans)")
    parser.add_argument(
        "--phase", choices=["store", "recall", "read"], default="store", help="the calls measured (--part exact)"
    )
    args = parser.parse_args(argv)
    check_block_arguments(parser, args, "calls")
    if args.part == "exact" and args.phase == "read" and args.embedder != "none":
        parser.error("--phase read ranks lexically (no query vector): leave --embedder out")
    if args.part == "exact":
        result = exact_part(args)
        print_two_ways(args, result, EXACT_WAYS)
    elif args.part == "join":
        result = join_part(args)
        print_two_ways(args, result, JOIN_WAYS)
    elif args.part == "since":
        result = since_part(args)
        print_two_ways(args, result, SINCE_WAYS)
        print(f"  catch-ups: {result['caught']}; routes: {result['routes']}")
    elif args.part == "search":
        result = search_part(args)
        print(f"{args.embedder} store, {args.rounds} pairs of {args.block}-store blocks, CPU ms per store:")
        for part in ("server", "postgres", "total"):
            r = result[part]
            share = f"{r['search_share']:.0%}" if r["search_share"] is not None else "n/a"
            print(
                f"  {part:8} without the search {r['without_ms']:.3f}  with it {r['with_ms']:.3f}"
                f"  the search (median paired difference) {r['search_ms']:+.3f} ({share})"
            )
    else:
        result = plans_part(args)
        print(f"{args.embedder}: read statements of {args.calls} recalls and stores, medians, ms:")
        for s in sorted(result["statements"], key=lambda s: -s["planning_ms"] - s["execution_ms"]):
            print(f"  plan {s['planning_ms']:.3f}  exec {s['execution_ms']:.3f}  x{s['runs']:<5} {s['statement']}")
        for key, runs in result["not_explained"].items():
            print(f"  (writes, not explained) x{runs:<5} {key}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "result": result}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
