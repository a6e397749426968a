"""The query embedder's cost by torch thread count and by how many threads have run it, in fresh processes.

A process that runs torch with more than one CPU thread from more than one of its own threads (a server's
calls in flight, the query embedder's budget threads, a notebook's main thread and that pool) gets one
OpenMP team per calling thread; once the teams' threads outnumber the CPUs, each forward pass waits on
them (docs/traps.md). OpenMP's state lasts as long as the process, so each way runs in a process of its
own: the int8 query embedder (`MiniLMTextEmbedder`, warmed up in the main thread as `Memory` does), then
``--calls`` of `load.py`'s seven-word questions back to back, from the main thread only or from a second
thread (a one-thread pool, as `GuardedTextEmbedder` hands them over), with torch on one thread or on one
per CPU. It prints CPU and wall milliseconds per query and each way's ratio to one thread called from one
thread.

    python benchmarks/torch_threads.py [--calls 400] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import machine_info
from benchmarks.workload import query_text

#: (label, torch threads: 0 for one per CPU, calling threads)
WAYS = (
    ("1 thread, 1 caller", 1, 1),
    ("1 thread, 2 callers", 1, 2),
    ("per CPU, 1 caller", 0, 1),
    ("per CPU, 2 callers", 0, 2),
)


def measure(threads: int, callers: int, calls: int) -> dict[str, float]:
    """In this process: the embedder warmed up in this thread, then ``calls`` queries from it (``callers``
    1) or from a second thread (2); CPU and wall ms per query."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from concurrent.futures import ThreadPoolExecutor

    from haystack_osa_memory.components.minilm_embedders import BUNDLED_MODEL, MiniLMTextEmbedder

    embedder = MiniLMTextEmbedder(model=BUNDLED_MODEL, precision="int8")
    embedder.warm_up()
    rnd = random.Random(7)
    queries = [query_text(n % 16, rnd) for n in range(calls + 30)]
    pool = ThreadPoolExecutor(max_workers=1)

    def embed(text: str) -> object:
        return embedder.run(text=text) if callers == 1 else pool.submit(embedder.run, text=text).result()

    for text in queries[:30]:
        embed(text)
    cpu, wall = time.process_time(), time.perf_counter()
    for text in queries[30:]:
        embed(text)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    pool.shutdown()
    return {"torch_threads": torch.get_num_threads(), "cpu_ms": cpu / calls * 1e3, "wall_ms": wall / calls * 1e3}


def run(calls: int) -> dict[str, Any]:
    """Each way in a fresh process (`--child`), one after the other."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    ways = []
    for label, threads, callers in WAYS:
        out = subprocess.run(
            [sys.executable, __file__, "--child", f"{threads},{callers}", "--calls", str(calls)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        ways.append({"way": label, **json.loads(out.stdout.strip().splitlines()[-1])})
    base = ways[0]
    for way in ways:
        way["cpu_ratio"] = way["cpu_ms"] / base["cpu_ms"]
        way["wall_ratio"] = way["wall_ms"] / base["wall_ms"]
    return {"machine": machine_info(), "calls": calls, "ways": ways}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400, help="queries measured per way")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    if args.child:
        threads, callers = (int(x) for x in args.child.split(","))
        print(json.dumps(measure(threads, callers, args.calls)))
        return None
    result = run(args.calls)
    machine = result["machine"]
    print(f"{machine['cpu_model']}, {machine['cores']} CPUs; {args.calls} int8 questions per way, fresh process each")
    print(f"{'way':22s} {'torch threads':>13s} {'CPU ms':>8s} {'wall ms':>8s} {'CPU ratio':>9s} {'wall ratio':>10s}")
    for way in result["ways"]:
        print(
            f"{way['way']:22s} {way['torch_threads']:13d} {way['cpu_ms']:8.3f} {way['wall_ms']:8.3f}"
            f" {way['cpu_ratio']:8.2f}x {way['wall_ratio']:9.2f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
