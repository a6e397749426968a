"""Privacy redaction benchmark: precision and recall per class on the labelled corpus.

Usage::

    python benchmarks/redaction.py [--corpus tests/data/redaction_corpus.jsonl] [--show-misses] [--json out.json]

Method
------
Every line of the corpus is a case: a realistic text (log line, config snippet, stack trace, shell
command, chat message, code), the ideal redacted output (``expected``) and the expected number of
redactions per class. Cases without any redaction are the negatives (versions, public and loopback
addresses, ordinary paths, timestamps, UUIDs, git SHAs, code that names secrets without holding
one...). A few cases carry ``accepted_miss``: the ideal output stays in ``expected`` (so they count
against the scores here) and the output we accept today, with the reason, in ``accepted_miss``.

Scores are computed on spans of the original text, strictly per class. The spans that a placeholder
replaced are recovered by aligning the original text with an output (the text between placeholders
is unchanged by construction). An expected span is *found* when spans of the same class cover all of
its characters (a partial redaction is a miss: part of the secret leaked). A produced span is
*correct* when it overlaps an expected span of the same class and stays inside expected spans (a
span that swallows extra text, or has the wrong class, is a false positive). Overall scores are
micro-averages over the classes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from haystack_osa_memory.privacy.redaction import CLASSES, PLACEHOLDER_PATTERN, PLACEHOLDERS, redact  # noqa: E402

CORPUS = REPO / "tests" / "data" / "redaction_corpus.jsonl"
CLASS_OF = {placeholder: name for name, placeholder in PLACEHOLDERS.items()}

Span = tuple[int, int, str]


def load_corpus(path: Path = CORPUS) -> list[dict[str, Any]]:
    """The corpus cases, in file order."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def redacted_spans(original: str, output: str) -> list[Span] | None:
    """The ``(start, end, class)`` spans of ``original`` that ``output`` replaced by a placeholder.

    ``None`` when ``output`` is not ``original`` with some spans replaced by placeholders.
    """
    pattern: list[str] = []
    classes: list[str] = []
    pos = 0
    for m in PLACEHOLDER_PATTERN.finditer(output):
        pattern.append(re.escape(output[pos : m.start()]))
        pattern.append("(.+?)")
        classes.append(CLASS_OF.get(m.group(0), m.group(0)))
        pos = m.end()
    pattern.append(re.escape(output[pos:]))
    aligned = re.fullmatch("".join(pattern), original, re.DOTALL)
    if aligned is None:
        return None
    return [(aligned.start(i + 1), aligned.end(i + 1), cls) for i, cls in enumerate(classes)]


@dataclass
class Tally:
    """Counts of one class."""

    expected: int = 0
    found: int = 0
    produced: int = 0
    correct: int = 0

    @property
    def precision(self) -> float:
        return self.correct / self.produced if self.produced else 1.0

    @property
    def recall(self) -> float:
        return self.found / self.expected if self.expected else 1.0

    def add(self, other: Tally) -> None:
        self.expected += other.expected
        self.found += other.found
        self.produced += other.produced
        self.correct += other.correct


def _covered(span: tuple[int, int], by: Iterable[tuple[int, int]]) -> bool:
    chars = set(range(*span))
    for start, end in by:
        chars.difference_update(range(start, end))
    return not chars


def score_case(original: str, expected: str, output: str) -> dict[str, Tally]:
    """Per-class tallies of one case (see the module docstring)."""
    want = redacted_spans(original, expected)
    if want is None:
        msg = f"corpus error: expected output is not the text with placeholders: {expected!r}"
        raise ValueError(msg)
    got = redacted_spans(original, output)
    if got is None:  # output changed text outside placeholders: nothing it did counts as correct
        got_spans: list[Span] = [(0, len(original), "?")] if output != original else []
    else:
        got_spans = got
    tallies: dict[str, Tally] = {}
    for cls in {s[2] for s in want} | {s[2] for s in got_spans}:
        want_c = [(a, b) for a, b, c in want if c == cls]
        got_c = [(a, b) for a, b, c in got_spans if c == cls]
        t = Tally(expected=len(want_c), produced=len(got_c))
        t.found = sum(_covered(w, got_c) for w in want_c)
        all_wanted = [(a, b) for a, b, _ in want]
        t.correct = sum(any(a < wb and wa < b for wa, wb in want_c) and _covered((a, b), all_wanted) for a, b in got_c)
        tallies[cls] = t
    return tallies


@dataclass
class Report:
    """Scores over a corpus."""

    by_class: dict[str, Tally] = field(default_factory=dict)
    cases: int = 0
    positives: int = 0
    exact: int = 0
    accepted: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def overall(self) -> Tally:
        total = Tally()
        for t in self.by_class.values():
            total.add(t)
        return total


def evaluate(cases: Iterable[Mapping[str, Any]]) -> Report:
    """Redact every case with the default policy and score it against its expected output."""
    report = Report(by_class={cls: Tally() for cls in CLASSES})
    for case in cases:
        report.cases += 1
        report.positives += bool(case["counts"])
        output = redact(case["text"]).text
        if output == case["expected"]:
            report.exact += 1
        elif "accepted_miss" in case and output == case["accepted_miss"]["output"]:
            report.accepted.append(case["id"])
        else:
            report.failures.append({"id": case["id"], "expected": case["expected"], "output": output})
        for cls, tally in score_case(case["text"], case["expected"], output).items():
            report.by_class.setdefault(cls, Tally()).add(tally)
    return report


def format_report(report: Report) -> str:
    lines = [
        f"corpus: {report.cases} cases ({report.positives} with redactions, {report.cases - report.positives} without)",
        "",
        f"{'class':<12} {'expected':>8} {'found':>6} {'produced':>8} {'correct':>7} {'precision':>9} {'recall':>7}",
    ]
    rows = [*report.by_class.items(), ("overall", report.overall)]
    for name, t in rows:
        if name == "overall":
            lines.append("-" * 63)
        counts = f"{t.expected:>8} {t.found:>6} {t.produced:>8} {t.correct:>7}"
        lines.append(f"{name:<12} {counts} {t.precision:>9.3f} {t.recall:>7.3f}")
    lines += [
        "",
        f"exact output: {report.exact}/{report.cases} cases; accepted misses: {len(report.accepted)} "
        f"({', '.join(report.accepted) or '-'}); unexpected outputs: {len(report.failures)}",
    ]
    return "\n".join(lines)


def throughput(cases: Iterable[Mapping[str, Any]], repeats: int = 5) -> tuple[float, int]:
    """Best-of-``repeats`` speed of :func:`redact` over the corpus texts: (MB/s, characters)."""
    texts = [case["text"] for case in cases]
    chars = sum(len(t) for t in texts)
    redact("warm-up")
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for text in texts:
            redact(text)
        best = min(best, time.perf_counter() - start)
    return chars / best / 1e6, chars


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="JSONL corpus (default: %(default)s)")
    parser.add_argument("--show-misses", action="store_true", help="print every output that differs from its case")
    parser.add_argument("--json", type=Path, help="also write the scores as JSON to this file")
    args = parser.parse_args(argv)
    cases = load_corpus(args.corpus)
    report = evaluate(cases)
    print(format_report(report))
    speed, chars = throughput(cases)
    print(f"speed: {speed:.2f} MB/s of text (best of 5 passes over {chars} characters)")
    if args.show_misses:
        by_id = {c["id"]: c for c in cases}
        for case_id in report.accepted:
            case = by_id[case_id]
            print(f"\n[accepted miss] {case_id}: {case['accepted_miss']['reason']}\n  expected: {case['expected']!r}")
        for failure in report.failures:
            print(f"\n[unexpected] {failure['id']}")
            print(f"  expected: {failure['expected']!r}\n  output:   {failure['output']!r}")
    if args.json:
        data = {
            "cases": report.cases,
            "exact": report.exact,
            "accepted_misses": report.accepted,
            "unexpected": [f["id"] for f in report.failures],
            "classes": {
                name: {"expected": t.expected, "produced": t.produced, "precision": t.precision, "recall": t.recall}
                for name, t in [*report.by_class.items(), ("overall", report.overall)]
            },
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0 if not report.failures else 1


if __name__ == "__main__":
    sys.exit(main())
