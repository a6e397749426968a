"""The first recall right after a bulk import, before autovacuum has analyzed anything.

For each size and mode: a fresh knowledge base whose statistics predate the import (40 facts of another
assignment of the same org, then ANALYZE, as after `init` and some use), autovacuum held off on its tables
(so that only what the product does refreshes them), then `Memory.import_items` of N facts into one
assignment (what `osa-memory import` runs), then a fresh `Memory` (new process state: no held scope, no
cached sizes), warmed up, and recalls: the first one, then 20 more (p50). Nothing runs ANALYZE or VACUUM
but the import itself.

Hybrid mode stores deterministic 384-d vectors (Haystack's `MockDocumentEmbedder`: embedding 100,000 facts
with MiniLM would take most of an hour on 2 cores) and embeds queries with the default MiniLM embedder;
the recall path (vector side included) is the same as with MiniLM vectors, the ranking is not meaningful.

    python benchmarks/first_recall.py --facts 10000 100000 --modes lexical hybrid [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from haystack.components.embedders import MockDocumentEmbedder
from psycopg import sql

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import database, drop_schema, machine_info, percentile
from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.embedders import build_embedders
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.transfer import ImportItem

SERVICES = ("billing", "search", "ingest", "vpn", "queue", "broker", "cache", "proxy")
# Each names a port that one fact holds: a big scope's lexical candidates come from its rarer words.
QUERIES = (
    "which service uses port 10007 for lane l7",
    "billing service of rack r12 on port 10496",
    "proxy port 17777 for lane l40",
    "what does the cache service of rack r3 use on port 12003",
)


def fact(n: int) -> str:
    return f"The {SERVICES[n % 8]} service of rack r{n % 97} uses port {10_000 + n} for lane l{n % 89}"


def memory_for(config: MemoryConfig, mode: str) -> Memory:
    if mode == "lexical":
        return Memory(config, use_default_embedders=False)
    _, text_embedder = build_embedders(config.model_copy(update={"embedder": "minilm"}))
    return Memory(config, document_embedder=MockDocumentEmbedder(dimension=384), text_embedder=text_embedder)


def run(uri: str, facts: int, mode: str) -> dict[str, Any]:
    schema = f"fr_{mode}_{facts}"
    config = MemoryConfig(pg_conn_str=uri, kb_schema=schema, memory_schema=schema, embedder="none")
    ensure_schema(uri, config)
    names = config.sql_names()
    loader = memory_for(config, mode)
    for n in range(40):
        loader.store(f"Earlier fact {n} about the pager rota", caller=Caller(org_id="acme", assignment_id="earlier"))
    with psycopg.connect(uri, autocommit=True) as conn:
        for table in (names["gov"], names["chunk"], sql.Identifier("osa_fact_terms")):
            conn.execute(sql.SQL("ALTER TABLE {}.{} SET (autovacuum_enabled = false)").format(names["schema"], table))
        conn.execute(sql.SQL("ANALYZE {schema}.{gov}, {schema}.{chunk}, {schema}.osa_fact_terms").format(**names))
    caller = Caller(org_id="acme", assignment_id="imported")
    t0 = time.perf_counter()
    report = loader.import_items(
        [ImportItem(fact=fact(n), origin=str(n)) for n in range(facts)], caller=caller, batch_size=500
    )
    import_s = time.perf_counter() - t0
    fresh = memory_for(config, mode)
    fresh.warm_up()
    fresh.recall("warm the query embedder", caller=Caller(org_id="acme", assignment_id="earlier"))
    times = []
    found = []
    for i in range(21):
        t = time.perf_counter()
        answer = fresh.recall(QUERIES[i % len(QUERIES)], caller=caller)
        times.append(time.perf_counter() - t)
        found.append(len(answer["facts"]))
    drop_schema(uri, schema)
    return {
        "facts": facts,
        "mode": mode,
        "import_s": round(import_s, 1),
        "stored": report.stored,
        "analyzed": report.analyzed,
        "first_recall_ms": round(times[0] * 1000, 1),
        "later_recalls_p50_ms": round(percentile(times[1:], 50) * 1000, 1),
        "later_recalls_max_ms": round(max(times[1:]) * 1000, 1),
        "facts_returned": found[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, nargs="+", default=[10_000])
    parser.add_argument("--modes", nargs="+", choices=("lexical", "hybrid"), default=["lexical"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    machine = machine_info()
    print(json.dumps(machine), flush=True)
    results = []
    with database("osa-first-recall-") as uri:
        for facts in args.facts:
            for mode in args.modes:
                result = run(uri, facts, mode)
                results.append(result)
                print(json.dumps(result), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine, "results": results}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
