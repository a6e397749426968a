"""benchmarks/profile_shares.py: py-spy samples sorted into the parts of a served call."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.profile_shares import OTHER, PARTS, format_table, part_of, shares

LOOP = "Runner.run (asyncio/runners.py:118)"
MIDDLEWARE = "BearerAuthMiddleware.__call__ (/x/haystack_osa_memory/mcp/server.py:609)"
HAND_OFF = "run_sync (anyio/to_thread.py:65)"
WORKER = "WorkerThread.run (anyio/_backends/_asyncio.py:986)"
RECALL = "Memory.recall (/x/haystack_osa_memory/memory.py:700)"
PIPELINE = "Pipeline.run (haystack/core/pipeline/pipeline.py:300)"
RETRIEVER = "ScopedMemoryRetriever.run (/x/haystack_osa_memory/components/scoped_memory_retriever.py:337)"
PSYCOPG = "Connection.wait (psycopg/connection.py:420)"


def test_the_innermost_frame_that_a_part_marks_decides() -> None:
    # psycopg's frame names no part: the retriever around it does, not the pipeline or the tool further out
    assert part_of([WORKER, RECALL, PIPELINE, RETRIEVER, PSYCOPG]) == "retriever (scope's rows, facts' text, ranking)"
    assert part_of([WORKER, RECALL, PIPELINE]) == "pipeline bookkeeping"
    assert part_of([WORKER, RECALL]) == "tool outside its pipelines"
    assert part_of([WORKER, "Queue.get (queue.py:171)"]) == "thread hand-off"
    assert part_of([LOOP, MIDDLEWARE, HAND_OFF, "CancelScope.__enter__ (anyio/_backends/_asyncio.py:434)"]) == (
        "thread hand-off"
    )
    assert part_of([LOOP, MIDDLEWARE]) == "HTTP in, middleware, routing"
    assert part_of([LOOP]) == "event loop, other"
    assert part_of(["<module> (x.py:1)"]) == OTHER


def test_a_file_marks_only_its_own_frames() -> None:
    # the token check lives in mcp/server.py, like the middleware: a function name decides, not the file
    verifier = "CachingVerifier._check (/x/haystack_osa_memory/mcp/server.py:365)"
    assert part_of([WORKER, verifier, PSYCOPG]) == "token check"
    # "memory.py" marks memory.py, not a file whose name merely ends the same way
    assert part_of([WORKER, "f (/x/haystack_osa_memory/store/memory_store.py:10)"]) == "thread hand-off"
    assert part_of([WORKER, "f (/x/not_memory.py:10)"]) == "thread hand-off"
    assert part_of(["Memory.store (memory.py:10)"]) == "tool outside its pipelines"


def test_shares_count_each_sample_once_and_sum_to_one() -> None:
    lines = [
        f"{';'.join([WORKER, RECALL, PIPELINE, RETRIEVER, PSYCOPG])} 6\n",
        f"{';'.join([WORKER, RECALL, PIPELINE])} 2\n",
        "\n",
        f"{';'.join([LOOP, MIDDLEWARE, HAND_OFF])} 2\n",
    ]
    got, samples = shares(lines)
    assert samples == 10
    assert list(got) == [*(name for name, _ in PARTS), OTHER]
    assert got["retriever (scope's rows, facts' text, ranking)"] == pytest.approx(0.6)
    assert got["pipeline bookkeeping"] == pytest.approx(0.2)
    assert got["thread hand-off"] == pytest.approx(0.2)
    assert sum(got.values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("lines", "message"),
    [([], "no samples"), (["\n"], "no samples"), ([f"{WORKER} x\n"], "line 1"), (["12\n"], "line 1")],
)
def test_shares_refuse_what_is_not_a_raw_profile(lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shares(lines)


def test_table_has_a_row_per_part_and_a_column_per_profile(tmp_path: Path) -> None:
    a, _ = shares([f"{WORKER};{RECALL} 3\n", f"{LOOP} 1\n"])
    b, _ = shares([f"{WORKER};{RECALL};{PIPELINE} 1\n"])
    table = format_table([("recall x4", a, 4), ("store x4", b, 1)]).splitlines()
    assert "recall x4" in table[0]
    assert "store x4" in table[0]
    rows = {line[: line.index("  ")].strip(): line.split() for line in table[2:] if "  " in line}
    assert rows["tool outside its pipelines"][-2:] == ["75.0%", "0.0%"]
    assert rows["pipeline bookkeeping"][-2:] == ["0.0%", "100.0%"]
    assert rows["samples"][-2:] == ["4", "1"]
    assert len(table) == 2 + len(PARTS) + 2  # header, rule, parts, other, samples


def test_table_with_milliseconds_per_call() -> None:
    a, _ = shares([f"{WORKER};{RECALL} 3\n", f"{LOOP} 1\n"])
    table = format_table([("recall x4", a, 4)], [2.0]).splitlines()
    rows = {line[: line.index("  ")].strip(): line.split() for line in table[2:] if "  " in line}
    assert rows["tool outside its pipelines"][-3:] == ["75.0%", "1.500", "ms"]
    assert rows["event loop, other"][-3:] == ["25.0%", "0.500", "ms"]
    assert rows["sampled ms per call"][-1] == "2.000"
