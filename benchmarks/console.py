"""Server time of the review console's pages on a big org: one assignment of 100,000 facts and 10,000
proposals waiting in the org.

    .venv/bin/python benchmarks/console.py [--facts 100000] [--proposals 10000] [--repeat 30]

Facts are written straight into the governing and chunk tables (the pages read those tables only; how
they are written does not change what the pages read). Each page is requested in-process through the
console's ASGI app; the time is measured around the app (server time, no network).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import database, percentile
from haystack_osa_memory import MemoryConfig
from haystack_osa_memory.console import ConsoleSettings, create_console_app
from haystack_osa_memory.markers import MARKER_PREFIX, MARKER_SUFFIX
from haystack_osa_memory.store.facts import FACT_SOURCE
from haystack_osa_memory.store.schema import ensure_schema
from haystack_osa_memory.store.tokens import TokenStore

ORG = "acme"
BIG = "asg-big"
SEED_GOV = sql.SQL(
    """INSERT INTO {schema}.{gov} (id, org_id, dataset, source, status, title, metadata, created_at, updated_at)
    SELECT encode(sha256((%(tag)s || i)::bytea), 'hex'), %(org)s, 'facts', %(source)s, %(status)s, 'Fact ' || i,
      jsonb_build_object('assignment_id', %(assignment)s::text || CASE WHEN %(spread)s THEN (i %% 10)::text ELSE '' END,
                         'kind', (ARRAY['fact','procedure','pitfall','preference','reference'])[1 + i %% 5]),
      now() - make_interval(secs => (%(n)s - i) * 30), now() - make_interval(secs => (%(n)s - i) * 30)
    FROM generate_series(1, %(n)s) AS i"""
)
SEED_CHUNK = sql.SQL(
    """INSERT INTO {schema}.{chunk} (id, content, meta)
    SELECT encode(sha256((%(tag)s || i)::bytea), 'hex'),
      %(marker)s::text || %(assignment)s::text || CASE WHEN %(spread)s THEN (i %% 10)::text ELSE '' END
        || %(suffix)s::text
        || E'\\n' || 'Service ' || i || ' of the fleet runs in zone ' || (i %% 17) || ' behind gateway g' || i,
      jsonb_build_object('document_id', encode(sha256((%(tag)s || i)::bytea), 'hex'), 'org_id', %(org)s::text)
    FROM generate_series(1, %(n)s) AS i"""
)


class Timed:
    """ASGI wrapper: the seconds each request spent inside the app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seconds: list[float] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        start = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http":
                self.seconds.append(time.perf_counter() - start)


def seed(conn_str: str, config: MemoryConfig, facts: int, proposals: int) -> None:
    names = config.sql_names()
    with psycopg.connect(conn_str, autocommit=True) as conn:
        for tag, status, assignment, spread, n in (
            ("big", "approved", BIG, False, facts),
            ("prop", "proposed", "asg-q", True, proposals),
        ):
            params = {
                "tag": tag,
                "org": ORG,
                "source": FACT_SOURCE,
                "status": status,
                "assignment": assignment,
                "spread": spread,
                "n": n,
                "marker": MARKER_PREFIX,
                "suffix": MARKER_SUFFIX,
            }
            conn.execute(SEED_GOV.format(**names), params)
            conn.execute(SEED_CHUNK.format(**names), params)
        for table in ("gov", "chunk"):
            conn.execute(sql.SQL("ANALYZE {schema}.{t}").format(schema=names["schema"], t=names[table]))


def measure(client: TestClient, timed: Timed, path: str, repeat: int) -> dict[str, float]:
    client.get(path)  # warm: plans and pool
    timed.seconds.clear()
    for _ in range(repeat):
        answer = client.get(path, follow_redirects=False)
        assert answer.status_code == 200, (path, answer.status_code)
    ms = [s * 1000 for s in timed.seconds]
    return {
        "p50_ms": round(percentile(ms, 50), 1),
        "p95_ms": round(percentile(ms, 95), 1),
        "max_ms": round(max(ms), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=100_000)
    parser.add_argument("--proposals", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with database("osa-console-bench-") as conn_str:
        config = MemoryConfig(pg_conn_str=conn_str, kb_schema="bench", memory_schema="bench", embedder="none")
        ensure_schema(conn_str, config)
        started = time.perf_counter()
        seed(conn_str, config, args.facts, args.proposals)
        seeded = time.perf_counter() - started
        timed = Timed(create_console_app(conn_str, config, ConsoleSettings()))
        person = TokenStore(conn_str, config).create_person(org_id=ORG, role="reviewer", name="Bench")
        with TestClient(timed, base_url="http://testserver") as client:
            signed = client.post(
                "/signin", data={"token": person.token}, headers={"origin": "http://testserver"}, follow_redirects=False
            )
            assert signed.status_code == 303
            page = client.get("/queue").text
            deep = "/queue"
            for _ in range(100):  # 100 pages in: rows 5,001-5,050 of the queue
                found = re.search(r'href="(/queue\?[^"]+)" rel="next"', client.get(deep).text)
                assert found, "the queue ended early"
                deep = found.group(1).replace("&amp;", "&")
            fact_id = re.findall(r'href="/facts/([0-9a-f]+)"', page)[0]
            listing = client.get(f"/assignments/{BIG}").text
            cursor = re.search(r'href="(/assignments/[^"]+)" rel="next"', listing)
            assert cursor
            pages = {
                "queue (org, 10,000 waiting)": "/queue",
                "queue page 101 (keyset)": deep,
                "queue filtered by assignment": "/queue?assignment=asg-q3",
                "queue filtered by kind and age": "/queue?kind=pitfall&older_than_days=1",
                "fact": f"/facts/{fact_id}",
                f"assignment browser ({args.facts:,} facts)": f"/assignments/{BIG}",
                "assignment browser page 2": cursor.group(1).replace("&amp;", "&"),
            }
            results = {name: measure(client, timed, path, args.repeat) for name, path in pages.items()}
    report = {"facts": args.facts, "proposals": args.proposals, "repeat": args.repeat, "seed_s": round(seeded, 1)}
    report["pages"] = results
    for name, r in results.items():
        print(f"{name:45s} p50 {r['p50_ms']:7.1f} ms   p95 {r['p95_ms']:7.1f} ms   max {r['max_ms']:7.1f} ms")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
