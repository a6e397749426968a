"""What row-level security costs: our recall under the runtime role, and a team's own retrievers.

One knowledge base (``--customers`` customer documents with 384-d vectors in the chunk table, plus
``--facts`` facts in each of ``--scopes`` assignments), three roles (owner, runtime, team reader). The
same queries run in alternating rounds with RLS off and on (`osa-memory init --row-level-security`
and back), so both sides see the same machine state; p50/p95 and the on/off ratio are printed.

    python benchmarks/rls.py --customers 20000 --facts 600 --rounds 6

Recall is lexical (no query embedder): RLS adds work in SQL only, and the embedder's time would
only dilute the ratio. The team's queries are `PgvectorKeywordRetriever` and
`PgvectorEmbeddingRetriever` (HNSW) over their table, unchanged, through a role of their own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from haystack.utils import Secret
from haystack_integrations.components.retrievers.pgvector import PgvectorEmbeddingRetriever, PgvectorKeywordRetriever
from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore
from psycopg import sql
from psycopg.conninfo import make_conninfo

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as a file: the repository root holds the package

from benchmarks.harness import database, drop_schema, machine_info, percentile
from haystack_osa_memory import Caller, Memory, MemoryConfig
from haystack_osa_memory.store.database import close_pools
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.transfer import ImportItem

WORDS = [
    "invoice",
    "refund",
    "ledger",
    "billing",
    "portal",
    "export",
    "bucket",
    "deploy",
    "staging",
    "vpn",
    "profile",
    "token",
    "audit",
    "report",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--customers", type=int, default=20000)
    parser.add_argument("--facts", type=int, default=600, help="facts per assignment")
    parser.add_argument("--scopes", type=int, default=4)
    parser.add_argument("--queries", type=int, default=40, help="queries per round and side")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with database("osa-rls-") as admin:
        suffix = uuid.uuid4().hex[:8]
        roles = {"owner": f"own_{suffix}", "runtime": f"rt_{suffix}", "team": f"team_{suffix}"}
        uri = {k: make_conninfo(admin, user=v) for k, v in roles.items()}
        schema = f"kb_{suffix}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            for name in roles.values():
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
            conn.execute(
                sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                    sql.Identifier(schema), sql.Identifier(roles["owner"])
                )
            )
        config = MemoryConfig(pg_conn_str=uri["owner"], kb_schema=schema, memory_schema=schema, embedder="none")
        ensure_schema(uri["owner"], config, runtime_role=roles["runtime"])
        names = {**config.sql_names(), "team": sql.Identifier(roles["team"])}
        t0 = time.perf_counter()
        with psycopg.connect(uri["owner"], autocommit=True) as conn, conn.cursor() as cur:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {schema} TO {team}").format(**names))
            conn.execute(sql.SQL("GRANT SELECT ON {schema}.{chunk}, {schema}.{gov} TO {team}").format(**names))
            rows = []
            for i in range(args.customers):
                v = rng.standard_normal(384).astype(np.float32)
                words = " ".join(rng.choice(WORDS, 8))
                rows.append(
                    (f"c{i}", "[" + ",".join(f"{x:.5f}" for x in v / np.linalg.norm(v)) + "]", f"Doc {i}: {words}")
                )
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {schema}.{chunk} (id, embedding, content, meta) "
                    "VALUES (%s, %s::vector, %s, jsonb_build_object('document_id', %s::text))"
                ).format(**names),
                [(r[0], r[1], r[2], r[0]) for r in rows],
            )
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {schema}.{gov} (id, org_id, dataset, source, audience) "
                    "VALUES (%s, 'acme', 'kb', 'upload', 'customer')"
                ).format(**names),
                [(r[0],) for r in rows],
            )
            conn.execute(
                sql.SQL(
                    "CREATE INDEX haystack_hnsw_index ON {schema}.{chunk} "
                    "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
                ).format(**names)
            )
        runtime = config.model_copy(update={"pg_conn_str": uri["runtime"]})
        memory = Memory(runtime, use_default_embedders=False)
        callers = [Caller(org_id="acme", assignment_id=f"asg-{s}") for s in range(args.scopes)]
        for caller in callers:
            memory.import_items(
                [
                    ImportItem(
                        fact=f"Fact {i} of {caller.assignment_id}: " + " ".join(rng.choice(WORDS, 10)), origin=str(i)
                    )
                    for i in range(args.facts)
                ],
                caller=caller,
            )
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("ANALYZE {schema}.{chunk}").format(**names))
            conn.execute(sql.SQL("ANALYZE {schema}.{gov}").format(**names))
            facts = conn.execute(
                sql.SQL("SELECT count(*) FROM {schema}.{gov} WHERE source = 'agent_fact'").format(**names)
            ).fetchone()
        build_s = time.perf_counter() - t0
        store = PgvectorDocumentStore(
            connection_string=Secret.from_token(uri["team"]),
            schema_name=schema,
            table_name=config.chunk_table,
            embedding_dimension=384,
            search_strategy="hnsw",
            keyword_index_name=f"{config.chunk_table}_keyword_index",  # the index `init` made
            create_extension=False,
        )
        keyword = PgvectorKeywordRetriever(document_store=store, top_k=10)
        embedding = PgvectorEmbeddingRetriever(document_store=store, top_k=10)
        queries = [" ".join(rng.choice(WORDS, 2)) for _ in range(args.queries)]
        vectors = [
            (v / np.linalg.norm(v)).tolist() for v in rng.standard_normal((args.queries, 384)).astype(np.float32)
        ]
        timings: dict[str, dict[str, list[float]]] = {
            side: {"off": [], "on": []} for side in ("recall", "team_keyword", "team_embedding")
        }
        leaks = {"off": 0, "on": 0}
        for round_ in range(args.rounds * 2):
            mode = "on" if round_ % 2 else "off"
            ensure_schema(uri["owner"], config, row_level_security=(mode == "on"))
            close_pools()
            memory = Memory(runtime, use_default_embedders=False)
            memory.warm_up()
            memory.recall("warm up", caller=callers[0])
            for n, q in enumerate(queries):
                caller = callers[n % len(callers)]
                t = time.perf_counter()
                memory.recall(q, limit=8, caller=caller)
                timings["recall"][mode].append(time.perf_counter() - t)
                t = time.perf_counter()
                docs = keyword.run(query=q)["documents"]
                timings["team_keyword"][mode].append(time.perf_counter() - t)
                leaks[mode] += sum("osa-memory:scope" in (d.content or "") for d in docs)
                t = time.perf_counter()
                docs = embedding.run(query_embedding=vectors[n])["documents"]
                timings["team_embedding"][mode].append(time.perf_counter() - t)
                leaks[mode] += sum("osa-memory:scope" in (d.content or "") for d in docs)
        result: dict[str, Any] = {
            "machine": machine_info(admin),
            "customers": args.customers,
            "facts": facts[0] if facts else None,
            "build_seconds": round(build_s, 1),
            "fact_hits_in_team_results": leaks,
        }
        print(
            f"{args.customers} customer chunks, {result['facts']} facts in {args.scopes} assignments "
            f"(built in {build_s:.0f} s)"
        )
        print(f"{'query':<16}{'off p50':>9}{'off p95':>9}{'on p50':>9}{'on p95':>9}{'on/off p50':>12}")
        for side, t in timings.items():
            off50, off95, on50, on95 = (percentile(t[m], q) * 1000 for m in ("off", "on") for q in (50, 95))
            result[side] = {
                "off_p50_ms": off50,
                "off_p95_ms": off95,
                "on_p50_ms": on50,
                "on_p95_ms": on95,
                "ratio_p50": on50 / off50,
            }
            print(f"{side:<16}{off50:>9.2f}{off95:>9.2f}{on50:>9.2f}{on95:>9.2f}{on50 / off50:>12.2f}")
        print(f"fact chunks in the team's results: RLS off {leaks['off']}, on {leaks['on']}")
        print(json.dumps(result, default=float))
        drop_schema(admin, schema)
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in roles.values():
                conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(sql.Identifier(name)))


if __name__ == "__main__":
    main()
