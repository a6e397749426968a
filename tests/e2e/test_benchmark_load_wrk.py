"""The wrk driver of the load benchmark (benchmarks/load.py --driver wrk).

Its answer checks are tested against a small local HTTP server that answers what we tell it (a clean
answer, another assignment's fact, a tool error, an HTTP error), so a driver that stopped seeing leaks or
errors fails here; then a real `serve --workers 2`, lexical, is driven at 1 and 4 connections and every
figure the benchmark prints must be there and plausible.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from benchmarks.wrk_driver import run_wrk
from tests.conftest import REPO, run_benchmark

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

HARNESS = REPO / "benchmarks" / "load.py"


class Answers(BaseHTTPRequestHandler):
    mode = "clean"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tool_args = body["params"]["arguments"]
        own = (tool_args.get("query") or tool_args["fact"]).split()[0].rstrip(":")
        fact = {"clean": own, "leak": "zq999tag"}.get(self.mode, own)
        result = {"content": [{"type": "text", "text": f"{fact} fact"}], "isError": self.mode == "tool-error"}
        status = 500 if self.mode == "http-error" else 200
        payload = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}, separators=(",", ":"))
        data = f"event: message\r\ndata: {payload}\r\n\r\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def answers() -> Iterator[tuple[str, type[Answers]]]:
    handler = type("Handler", (Answers,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp", handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("mode", "errors", "cross"),
    [("clean", False, False), ("leak", False, True), ("tool-error", True, False), ("http-error", True, False)],
)
def test_wrk_driver_sees_leaks_and_errors(
    answers: tuple[str, type[Answers]], mode: str, errors: bool, cross: bool
) -> None:
    url, handler = answers
    handler.mode = mode
    tags = ["zq000tag", "zq001tag"]
    result = run_wrk(url, ["token-a", "token-b"], tags, "recall", 2, 1)
    assert result.requests > 0
    assert (result.errors > 0) is errors, result
    assert (result.cross_scope > 0) is cross, result
    if mode == "leak":
        assert result.cross_scope == result.requests


@pytest.mark.parametrize(("connections", "calls"), [(1, 57), (4, 100), (32, 301)])
def test_wrk_driver_stops_after_a_number_of_calls(
    answers: tuple[str, type[Answers]], connections: int, calls: int
) -> None:
    url, handler = answers
    seen: list[int] = []
    served = handler.do_POST

    def counting(self: Answers) -> None:
        seen.append(1)
        with contextlib.suppress(OSError):  # wrk hangs up on the calls still in flight when it stops
            served(self)

    handler.do_POST = counting  # type: ignore[method-assign]
    started = time.monotonic()
    result = run_wrk(url, ["token-a", "token-b"], ["zq000tag", "zq001tag"], "store", connections, 60, calls)
    assert time.monotonic() - started < 30  # ended by the count, not by the 60 s
    threads = min(2, connections)
    assert result.requests == -(-calls // threads) * threads  # each wrk thread answered its share
    assert result.errors == result.cross_scope == 0
    time.sleep(0.5)
    assert result.requests <= len(seen) <= result.requests + connections  # and at most one more per connection
    assert result.sent >= len(seen)


def test_two_runs_in_one_second_store_different_facts(answers: tuple[str, type[Answers]]) -> None:
    """wrk seeds its random numbers with the time in seconds: two store phases started within one second must
    still send different facts (a fact sent again is stored in place, and a count of stored facts misses it)."""
    url, handler = answers
    facts: list[str] = []
    served = handler.do_POST

    def recording(self: Answers) -> None:
        length = int(self.headers["Content-Length"])
        body = self.rfile.read(length)
        facts.append(json.loads(body)["params"]["arguments"]["fact"])
        self.rfile = io.BytesIO(body)  # type: ignore[assignment]
        with contextlib.suppress(OSError):
            served(self)

    handler.do_POST = recording  # type: ignore[method-assign]
    for _ in range(2):
        run_wrk(url, ["token-a", "token-b"], ["zq000tag", "zq001tag"], "store", 1, 10, 20)
    assert len(facts) >= 40
    assert len(set(facts)) == len(facts)


def test_load_benchmark_wrk_smoke(pg_conn_str: str, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    args = [
        "--driver", "wrk",
        "--connections", "1,4",
        "--assignments", "3",
        "--facts", "20",
        "--duration", "3",
        "--workers", "2",
        "--embedder", "none",
        "--store-calls", "40",
        "--json", str(out),
    ]  # fmt: skip
    done = run_benchmark(HARNESS, args, pg_conn_str)
    rows = json.loads(out.read_text())["wrk"]
    assert [(r["phase"], r["connections"]) for r in rows] == [
        ("recall", 1),
        ("recall", 4),
        ("store", 1),
        ("store", 4),
    ]
    for r in rows:
        result = r["result"]
        assert result["requests"] > 0, r
        assert result["errors"] == 0, r
        assert result["cross_scope"] == 0, r
        assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["p90"] <= result["latency_ms"]["p99"], r
        assert r["server_cpu_ms"] > 0, r
        assert r["postgres_cpu_ms"] > 0, r
        # serve, its two workers (and uvicorn's small helper process), each measured
        assert len(r["pss_mib"]) >= 3, r
        assert sum(v > 100 for v in r["pss_mib"].values()) >= 2, r
        assert r["rss_mib"].keys() == r["pss_mib"].keys(), r
        assert all(r["rss_mib"][k] >= r["pss_mib"][k] > 0 for k in r["pss_mib"]), r
        start, end = r["scope_facts"]
        if r["phase"] == "store":
            # 40 stores (or 3 s, whichever first), each one a fact counted in the database, the answered ones
            # and those in flight when wrk stopped
            assert result["requests"] <= 40 or result["seconds"] >= 2.5, r
            assert result["requests"] <= r["stored"] <= result["requests"] + r["connections"], r
            # the scopes grew by the facts stored, spread over the 3 assignments
            assert end - start == pytest.approx(r["stored"] / 3, abs=0.1), r
        else:
            assert r["stored"] == 0, r
            assert start == end == 20, r  # recalls write nothing: the seeded 20 facts per scope
    stores = [r for r in rows if r["phase"] == "store"]
    assert stores[1]["scope_facts"][0] == stores[0]["scope_facts"][1]  # the second store phase goes on from the first
    assert "PSS MiB per process" in done.stdout
    assert "RSS: {" in done.stdout
    assert "calls/s" in done.stdout


def test_load_benchmark_wrk_profile(pg_conn_str: str, tmp_path: Path) -> None:
    """`--profile`: py-spy records the served workers during the phase; the shares of the parts of a call
    are printed and written, and the raw file is kept."""
    out, raw = tmp_path / "load.json", tmp_path / "profiles"
    args = [
        "--driver", "wrk",
        "--phases", "recall",
        "--connections", "4",
        "--assignments", "3",
        "--facts", "20",
        "--duration", "4",
        "--workers", "2",
        "--embedder", "none",
        "--profile", str(raw),
        "--json", str(out),
    ]  # fmt: skip
    done = run_benchmark(HARNESS, args, pg_conn_str)
    [row] = json.loads(out.read_text())["wrk"]
    assert row["result"]["requests"] > 0
    assert row["profile_samples"] > 0
    assert row["profile_ms_per_call"] > 0
    profile = row["profile"]
    assert sum(profile.values()) == pytest.approx(1.0)
    # the forked workers were recorded (a recall's own work), not only serve's idle parent
    assert profile["retriever (scope's rows, facts' text, ranking)"] > 0.05, profile
    assert profile["thread hand-off"] > 0, profile
    assert profile["other"] < 0.2, profile
    assert (raw / "current_recall_4.txt").stat().st_size > 0
    assert "Where the server's Python time went" in done.stdout
    assert "retriever (scope's rows, facts' text, ranking)" in done.stdout
    assert "sampled ms per call" in done.stdout


def test_profile_needs_the_wrk_driver() -> None:
    done = run_benchmark(HARNESS, ["--driver", "mcp", "--profile", "x"], succeeds=False)
    assert done.returncode == 2
    assert "--profile needs --driver wrk" in done.stderr


def test_load_benchmark_wrk_rounds_take_turns(pg_conn_str: str, tmp_path: Path) -> None:
    """`--compare REV --rounds 2`: each phase runs twice per server, the baseline first in round 1 and second
    in round 2, and the ratios pool both rounds."""
    out = tmp_path / "load.json"
    args = [
        "--driver", "wrk",
        "--phases", "recall",
        "--connections", "2",
        "--assignments", "2",
        "--facts", "10",
        "--duration", "2",
        "--workers", "1",
        "--embedder", "none",
        "--compare", "HEAD",
        "--rounds", "2",
        "--json", str(out),
    ]  # fmt: skip
    done = run_benchmark(HARNESS, args, pg_conn_str)
    rows = json.loads(out.read_text())["wrk"]
    assert [(r["server"], r["round"]) for r in rows] == [("HEAD", 0), ("current", 0), ("current", 1), ("HEAD", 1)]
    for r in rows:
        assert r["calls"] == r["result"]["requests"] > 0, r
        assert r["result"]["errors"] == r["result"]["cross_scope"] == 0, r
    assert "2 rounds pooled, servers taking turns first" in done.stdout
    assert "CPU ratio per round" in done.stdout


def test_rounds_must_be_positive() -> None:
    done = run_benchmark(HARNESS, ["--driver", "wrk", "--rounds", "0"], succeeds=False)
    assert done.returncode == 2
    assert "--rounds must be 1 or more" in done.stderr
