"""A near-free load generator for ``load.py --driver wrk``: wrk (C, one Lua state per thread) posts raw
JSON-RPC ``tools/call`` requests to ``osa-memory serve`` in stateless streamable HTTP (no session, no
``initialize``), so almost all the CPU a run spends is the server's and PostgreSQL's.

The Lua script picks an assignment per request, sends its token and a query naming the assignment's tag
word, and puts the assignment in the JSON-RPC ``id`` (the answer echoes it): an answer holding another
assignment's tag word is a cross-scope answer. Tool errors (``isError``), HTTP errors and socket errors
count as errors. wrk's own percentiles (``--latency``) give p50/p90/p99. A run may stop after a number of calls
(``run_wrk(..., calls=N)``): each wrk thread stops after its share and wrk is told to end (SIGINT) once all have.

Side by side: ``--compare REV`` serves a checkout of REV (a git worktree; ``PYTHONPATH`` puts its package
first) beside the current code, seeded alike, and each phase runs on one server then the other.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WRK = "wrk"
THREADS = 2

# Words the queries are drawn from (the seeded facts use the same vocabulary, workload.fact_text).
LUA = r"""
local tokens = {TOKENS}
local tags = {TAGS}
local phase = "{PHASE}"
local subjects = {"staging", "billing", "search", "ingest", "auth", "reports", "mobile", "gateway", "scheduler",
                  "ledger"}
local things = {"VPN profile", "cache bucket", "deploy window", "feature flag", "runbook", "on-call rota", "db replica"}
local verbs = {"uses", "needs", "moved to", "depends on", "is pinned to", "was switched to"}
local limit = {LIMIT}  -- calls per thread, then it stops (0: until the duration ends)
local threads = {}
thread_id = 0  -- set per thread by setup() (a global: thread:set writes globals)
calls, errors, cross, http_errors = 0, 0, 0, 0
sent = 0  -- requests sent (a stopped thread leaves those in flight unanswered)

function setup(thread)
  thread:set("thread_id", #threads + 1)
  table.insert(threads, thread)
end

local run = "{RUN}"  -- one per run_wrk call: two runs within a second store different facts

function init(args)
  math.randomseed(os.time() + thread_id * 7919 + {RUN_SEED})
end

local function pick(list) return list[math.random(#list)] end

function request()
  sent = sent + 1
  local counter = sent
  local a = math.random(#tokens)
  local id = a * 100000000 + thread_id * 1000000 + counter
  local arguments
  if phase == "recall" then
    arguments = string.format('{"query": "%s which %s does %s use?", "limit": 8}', tags[a], pick(things),
      pick(subjects))
  else
    arguments = string.format('{"fact": "%s: %s %s %s value-%d (wrk %s-%d-%d)"}', tags[a], pick(subjects),
      pick(things), pick(verbs), math.random(1000000), run, thread_id, counter)
  end
  local tool = phase == "recall" and "kb_memory_recall" or "kb_memory_store"
  local body = string.format(
    '{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": {"name": "%s", "arguments": %s}}',
    id, tool, arguments)
  return wrk.format("POST", nil, {
    ["Authorization"] = "Bearer " .. tokens[a],
    ["Content-Type"] = "application/json",
    ["Accept"] = "application/json, text/event-stream",
  }, body)
end

function response(status, headers, body)
  if limit > 0 and calls >= limit then
    return  -- in flight when the thread stopped, answered in the same turn of its loop: not counted
  end
  calls = calls + 1
  if limit > 0 and calls == limit then
    wrk.thread:stop()  -- this thread sends nothing more; wrk itself runs on until told to stop (SIGINT)
    io.write("WRK_THREAD_DONE\n")
    io.flush()
  end
  if status ~= 200 then
    http_errors = http_errors + 1
    return
  end
  if string.find(body, '"isError":true', 1, true) or string.find(body, '"error":', 1, true) then
    errors = errors + 1
    return
  end
  local id = tonumber(string.match(body, '"id":(%d+)'))
  if id == nil then
    errors = errors + 1
    return
  end
  local own = tags[math.floor(id / 100000000)]
  for word in string.gmatch(body, "zq%d%d%dtag") do
    if word ~= own then
      cross = cross + 1
      return
    end
  end
end

function done(summary, latency, requests)
  local c, e, x, h, s = 0, 0, 0, 0, 0
  for _, t in ipairs(threads) do
    c = c + t:get("calls")
    s = s + t:get("sent")
    e = e + t:get("errors")
    x = x + t:get("cross")
    h = h + t:get("http_errors")
  end
  io.write("WRK_JSON ")
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "socket_errors": %d, "calls": %d, "tool_errors": %d, "cross_scope": %d, ' ..
    '"http_errors": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, "mean_us": %d, "sent": %d}\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    c, e, x, h, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, s))
end
"""


def ensure_wrk() -> str:
    """The wrk binary, installed from Debian's packages when missing (the benchmark's set-up)."""
    found = shutil.which(WRK)
    if found:
        return found
    if os.geteuid() != 0:
        raise SystemExit("wrk is not installed: run `apt-get install -y wrk` (Debian) and try again")
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "wrk"], check=True, env=os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    )
    found = shutil.which(WRK)
    if not found:
        raise SystemExit("wrk could not be installed")
    return found


def lua_script(tokens: list[str], tags: list[str], phase: str, limit: int = 0) -> str:
    """The script for ``phase``; with ``limit``, each wrk thread stops after that many answers."""

    def lua_list(values: list[str]) -> str:
        return "{" + ", ".join(json.dumps(v) for v in values) + "}"

    script = LUA.replace("{TOKENS}", lua_list(tokens)).replace("{TAGS}", lua_list(tags)).replace("{PHASE}", phase)
    run = secrets.randbelow(2**24)
    return script.replace("{LIMIT}", str(int(limit))).replace("{RUN}", f"{run:06x}").replace("{RUN_SEED}", str(run))


@dataclass
class WrkResult:
    requests: int
    seconds: float
    per_second: float
    latency_ms: dict[str, float]
    errors: int
    cross_scope: int
    detail: dict[str, Any] = field(default_factory=dict)
    #: Requests sent: the answered ones and, when the run stopped at a number of calls, those still in flight.
    sent: int = 0


def run_wrk(
    url: str, tokens: list[str], tags: list[str], phase: str, connections: int, duration: float, calls: int = 0
) -> WrkResult:
    """One wrk run; the answer counts come from the script's ``done`` (every thread's counters). With
    ``calls``, it stops once that many are answered (each wrk thread its share), or after ``duration``
    seconds, whichever comes first."""
    binary = ensure_wrk()
    threads = max(1, min(THREADS, connections))
    with tempfile.TemporaryDirectory(prefix="osa-wrk-") as tmp:
        script = Path(tmp) / "load.lua"
        script.write_text(lua_script(tokens, tags, phase, -(-calls // threads) if calls else 0))
        command = [binary, f"-t{threads}", f"-c{connections}", f"-d{duration:.0f}s", "--timeout", "30s"]
        command += ["--latency", "-s", str(script), url]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as wrk:
            watchdog = threading.Timer(duration + 120, wrk.kill)
            watchdog.start()
            try:
                lines, finished = [], 0
                assert wrk.stdout is not None
                assert wrk.stderr is not None
                for line in wrk.stdout:
                    lines.append(line)
                    finished += line.strip() == "WRK_THREAD_DONE"
                    if calls and finished == threads:
                        # wrk sleeps out its duration even when every thread has stopped; SIGINT ends the run
                        # there, and it prints its summary (the duration it reports ends here too).
                        wrk.send_signal(signal.SIGINT)
                        finished = -1
                stdout, stderr = "".join(lines), wrk.stderr.read()
                returncode = wrk.wait()
            finally:
                watchdog.cancel()
    match = re.search(r"^WRK_JSON (\{.*\})$", stdout, re.MULTILINE)
    if returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({returncode}):\n{stdout}\n{stderr}")
    data = json.loads(match.group(1))
    seconds = data["duration_us"] / 1e6
    errors = data["socket_errors"] + data["tool_errors"] + data["http_errors"]
    return WrkResult(
        requests=data["calls"],
        seconds=round(seconds, 2),
        per_second=round(data["calls"] / seconds, 1) if seconds else 0.0,
        latency_ms={q: round(data[f"{q}_us"] / 1000, 1) for q in ("p50", "p90", "p99", "mean")},
        errors=errors,
        cross_scope=data["cross_scope"],
        detail=data,
        sent=data["sent"],
    )


def worktree(rev: str, repo: Path) -> Path:
    """A checkout of ``rev`` beside the work tree (removed by `remove_worktree`)."""
    target = Path(tempfile.mkdtemp(prefix="osa-baseline-"))
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", str(target), rev], check=True, capture_output=True
    )
    return target


def remove_worktree(path: Path, repo: Path) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], check=False, capture_output=True
    )
    shutil.rmtree(path, ignore_errors=True)
