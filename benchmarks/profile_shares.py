"""Where a served call's CPU goes: py-spy samples of `serve` sorted into the parts of a call.

py-spy (PyPI; installed into this interpreter when missing, as `load.py` installs wrk) records the `serve`
process and its workers while a load runs: ``--gil`` keeps only the samples of the thread holding the
interpreter lock (Python's work; a forward pass of the embedder releases the lock, so its native compute is
not in them). Each sample goes to the first part of `PARTS` named by one of its frames, looked up from the
innermost frame outwards: a sample in the scope's rows statement inside the retriever counts as the
retriever's, whichever tool ran it (a store's search for the facts it may replace runs the same retriever).

    python benchmarks/profile_shares.py RAW [RAW ...]         # raw files of `py-spy record -f raw`
    python benchmarks/load.py --driver wrk --profile DIR ...   # records every phase and prints the shares

A raw file holds one line per distinct stack, ``frame;frame;...;frame count``, outermost frame first, each
frame ``function (file:line)``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

#: The parts of a served call, each with the names that mark its frames: a name ending in ``.py`` marks the
#: frames of that file, any other name the functions whose qualified name starts with it. The first part that
#: marks a frame wins, frames looked up from the innermost outwards.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pipeline: copies of component inputs", ("copy_component_inputs", "_deepcopy_with_exceptions")),
    ("pipeline: tracing spans", ("PipelineBase._create_component_span", "tracing.py", "tracer.py")),
    ("embedders (Python side)", ("guarded_text_embedder.py", "minilm_embedders.py")),
    ("retriever (scope's rows, facts' text, ranking)", ("ScopedMemoryRetriever.run",)),
    ("ACL filter", ("GoverningRowAclFilter.run",)),
    ("marker stripper", ("ScopeMarkerStripper.run",)),
    ("fact writer", ("GovernedFactWriter.run", "ScopeMarkerWriter.run")),
    ("privacy redaction", ("PrivacyRedactor.run", "redaction.py", "gate.py")),
    (
        "fact words: subjects, weights, judge",
        ("supersession_suggestions.py", "supersession.py", "supersession_judge.py"),
    ),
    ("kill switch", ("Memory._lifecycle",)),
    ("pipeline bookkeeping", ("Pipeline.", "PipelineBase.")),
    ("tool outside its pipelines", ("memory.py",)),
    ("token check", ("CachingVerifier.",)),
    (
        "MCP handler: validation, serialisation",
        ("DirectToolCalls.", "Server.call_tool", "_lock_down", "instrument_tool_call"),
    ),
    ("answer out (JSON body, send)", ("_respond_json", "RequestResponseCycle.send")),
    ("thread hand-off", ("WorkerThread.", "run_sync", "CapacityLimiter.", "AsyncIOBackend.run_sync_in_worker_thread")),
    (
        "HTTP in, middleware, routing",
        ("BearerAuthMiddleware.", "ProxyHeadersMiddleware.", "RequestResponseCycle.", "HttpToolsProtocol."),
    ),
    ("event loop, other", ("Runner.run", "BaseEventLoop.")),
)
OTHER = "other"
#: Every part, in the order the shares and the table list them.
NAMES = (*(part for part, _ in PARTS), OTHER)
#: The recording of `--gil` samples, `RATE` per second (Hz), from the process and its children.
RATE = 250


def _marks(function: str, path: str, name: str) -> bool:
    if name.endswith(".py"):
        return path == name or path.endswith("/" + name)
    return function.startswith(name)


def part_of(frames: Sequence[str]) -> str:
    """The part of `PARTS` a sample belongs to (``frames``: outermost first, each ``function (file:line)``),
    else `OTHER`."""
    for frame in reversed(frames):
        function, _, where = frame.partition(" (")
        path = where.rsplit(":", 1)[0]
        for part, names in PARTS:
            if any(_marks(function, path, name) for name in names):
                return part
    return OTHER


def shares(lines: Iterable[str]) -> tuple[dict[str, float], int]:
    """Each part's share of the samples of a raw py-spy file (every part of `PARTS` and `OTHER`, in that
    order, summing to 1), and the number of samples.

    :raises ValueError: a line is not ``stack count``, or the file holds no sample.
    """
    counts: Counter[str] = Counter()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            msg = f"line {n} is not a py-spy raw sample ('frame;frame;... count'): {line[:80]!r}"
            raise ValueError(msg)
        counts[part_of(stack.split(";"))] += int(count)
    total = sum(counts.values())
    if total == 0:
        msg = "no samples: py-spy recorded nothing (was the process busy while it recorded?)"
        raise ValueError(msg)
    return {name: counts[name] / total for name in NAMES}, total


def file_shares(path: Path) -> tuple[dict[str, float], int]:
    """`shares` of a raw file."""
    with path.open(encoding="utf-8", errors="replace") as f:
        return shares(f)


def py_spy() -> str:
    """The py-spy binary, installed from PyPI into this interpreter's environment when missing."""
    beside = Path(sys.executable).with_name("py-spy")
    found = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if found:
        return found
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=True)
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy") or "py-spy"


def start_recording(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    """Start py-spy recording ``pid`` and its children for ``seconds`` into ``out`` (raw); wait on the
    process returned. py-spy pauses the process for each sample: CPU figures of a profiled run are not
    comparable with those of an unprofiled one."""
    command = [py_spy(), "record", "--gil", "--subprocesses", "-r", str(RATE), "-d", str(max(seconds, 1))]
    command += ["-f", "raw", "-o", str(out), "-p", str(pid)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def format_table(columns: Sequence[tuple[str, dict[str, float], int]], per_call_ms: Sequence[float] = ()) -> str:
    """A plain table: one row per part, one column of shares per (label, shares, samples). With
    ``per_call_ms`` (the milliseconds of samples per call of each column), each share is followed by the
    milliseconds per call it stands for."""
    width = max(len(name) for name, _ in PARTS)
    cell = 18 if not per_call_ms else 24
    head = f"{'part of the call':{width}s}" + "".join(f" {label[:cell]:>{cell}s}" for label, _, _ in columns)
    rows = [head, "-" * len(head)]

    def value(share: float, i: int) -> str:
        text = f"{share * 100:.1f}%"
        if per_call_ms:
            text += f" {share * per_call_ms[i]:6.3f} ms"
        return f" {text:>{cell}s}"

    for name in NAMES:
        rows.append(f"{name:{width}s}" + "".join(value(s[name], i) for i, (_, s, _) in enumerate(columns)))
    if per_call_ms:
        rows.append(f"{'sampled ms per call':{width}s}" + "".join(f" {ms:{cell}.3f}" for ms in per_call_ms))
    rows.append(f"{'samples':{width}s}" + "".join(f" {n:{cell}d}" for _, _, n in columns))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> list[tuple[str, dict[str, float], int]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("raw", nargs="+", type=Path, help="raw files of `py-spy record -f raw`")
    args = parser.parse_args(argv)
    columns = []
    for path in args.raw:
        try:
            got, samples = file_shares(path)
        except (OSError, ValueError) as e:
            parser.error(f"{path}: {e}")
        columns.append((path.stem, got, samples))
    print(format_table(columns))
    return columns


if __name__ == "__main__":
    main()
