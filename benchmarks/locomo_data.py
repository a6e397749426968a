"""The LoCoMo data set as the benchmarks read it, and the scoring of one question's recall.

A LoCoMo-format file becomes conversations of turns and questions (evidence ids normalised); each
conversation is one assignment of org ``locomo``. Shared by locomo.py, locomo_sweep.py, embedders.py
and vs_mem0.py.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from haystack_osa_memory import Caller
from haystack_osa_memory.markers import IDENTIFIER_PATTERN, MARKER_LOOKALIKE
from haystack_osa_memory.validation import FACT_MAX

ORG = "locomo"
KS = (1, 5, 10, 20, 50)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


# --------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Turn:
    """One dialog turn, in conversation order (``position`` counts from 0 over all sessions)."""

    dia_id: str
    speaker: str
    text: str
    date: str
    session: int
    position: int
    caption: str | None = None

    @property
    def fact(self) -> str:
        """The stored fact: ``"(<session date>) <speaker>: <text>"`` (no date prefix when the session has none)."""
        prefix = f"({self.date}) " if self.date else ""
        return f"{prefix}{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Question:
    question: str
    evidence: tuple[str, ...]
    category: int


@dataclass
class Conversation:
    sample_id: str
    assignment_id: str
    turns: list[Turn]
    questions: list[Question]
    dropped_evidence: int = 0
    skipped_turns: int = 0

    @property
    def caller(self) -> Caller:
        return Caller(org_id=ORG, assignment_id=self.assignment_id)


_DIA_ID = re.compile(r"D:*0*(\d+):+0*(\d+):*")


def normalise_dia_id(raw: object) -> str:
    """``"D30:05"`` -> ``"D30:5"``, ``"D:11:26"`` -> ``"D11:26"``; anything else is returned stripped."""
    text = re.sub(r"\s+", "", str(raw))
    match = _DIA_ID.fullmatch(text)
    if match is None:
        return text
    return f"D{int(match.group(1))}:{int(match.group(2))}"


def split_evidence(raw: object) -> list[str]:
    """Evidence ids of one QA item, normalised (``"D8:6; D9:17"`` is two ids), order kept, no duplicates."""
    items = raw if isinstance(raw, list) else [raw] if raw else []
    out: list[str] = []
    for item in items:
        for part in str(item).split(";"):
            dia = normalise_dia_id(part)
            if dia and dia not in out:
                out.append(dia)
    return out


def sanitise_assignment_id(sample_id: str, taken: set[str]) -> str:
    """An assignment id allowed by ``IDENTIFIER_PATTERN`` and unique in this run."""
    base = re.sub(r"[^A-Za-z0-9._:@-]+", "-", sample_id).lstrip("._:@-")[:100] or "conv"
    candidate, n = base, 1
    while candidate in taken or not IDENTIFIER_PATTERN.fullmatch(candidate):
        n += 1
        candidate = f"{base}-{n}"
    taken.add(candidate)
    return candidate


def _session_number(key: str) -> int | None:
    match = re.fullmatch(r"session_(\d+)", key)
    return int(match.group(1)) if match else None


def load_locomo(path: Path, limit_conversations: int | None = None) -> list[Conversation]:
    """Read a LoCoMo-format file: a list of ``{sample_id, conversation, qa}`` samples."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(raw, dict):  # a single sample
        raw = [raw]
    if not isinstance(raw, list):
        msg = f"{path}: expected a list of LoCoMo samples"
        raise ValueError(msg)
    taken: set[str] = set()
    conversations = []
    for index, sample in enumerate(raw[:limit_conversations] if limit_conversations else raw):
        conv = sample["conversation"]
        sessions = sorted(
            (n, value)
            for key, value in conv.items()
            if (n := _session_number(key)) is not None and isinstance(value, list)
        )
        turns: list[Turn] = []
        skipped = 0
        for n, session in sessions:
            date = str(conv.get(f"session_{n}_date_time") or "").strip()
            for item in session:
                text = str(item.get("text") or "").strip()
                turn = Turn(
                    dia_id=normalise_dia_id(item.get("dia_id", f"D{n}:{len(turns) + 1}")),
                    speaker=str(item.get("speaker") or "?").strip(),
                    text=text,
                    date=date,
                    session=n,
                    position=len(turns),
                    caption=(str(item["blip_caption"]).strip() or None) if item.get("blip_caption") else None,
                )
                if not text or len(turn.fact) > FACT_MAX or MARKER_LOOKALIKE.search(turn.fact):
                    skipped += 1  # our store refuses it (empty, too long, or a scope-marker look-alike)
                    continue
                turns.append(turn)
        known = {t.dia_id for t in turns}
        questions, dropped = [], 0
        for qa in sample.get("qa", []):
            evidence = split_evidence(qa.get("evidence"))
            kept = tuple(e for e in evidence if e in known)
            dropped += len(evidence) - len(kept)
            category = int(qa.get("category", 0) or 0)
            questions.append(Question(question=str(qa.get("question", "")).strip(), evidence=kept, category=category))
        sample_id = str(sample.get("sample_id") or f"conv-{index + 1}")
        conversations.append(
            Conversation(
                sample_id=sample_id,
                assignment_id=sanitise_assignment_id(sample_id, taken),
                turns=turns,
                questions=questions,
                dropped_evidence=dropped,
                skipped_turns=skipped,
            )
        )
    return conversations


# ------------------------------------------------------------------------------------------ metrics


def texts_from(conversations: Sequence[Conversation]) -> tuple[list[str], list[str]]:
    """(turn facts, questions) in data order."""
    turns = [t.fact for c in conversations for t in c.turns]
    questions = [q.question for c in conversations for q in c.questions if q.question]
    return turns, questions


def spread(items: Sequence[str], n: int) -> list[str]:
    """n items evenly spread over the list (all when n >= len)."""
    if n >= len(items):
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def question_metrics(ranked: Sequence[frozenset[str]], evidence: Sequence[str]) -> dict[str, float]:
    """Metrics of one question. ``ranked``: the dia_ids of each returned fact, best first."""
    wanted = set(evidence)
    out: dict[str, float] = {}
    for k in KS:
        found = set().union(*ranked[:k]) & wanted if ranked[:k] else set()
        out[f"R@{k}"] = len(found) / len(wanted)
    first = next((i for i, ids in enumerate(ranked, 1) if ids & wanted), None)
    out["MRR"] = 1.0 / first if first else 0.0
    gains = [1.0 if ids & wanted else 0.0 for ids in ranked[:10]]
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains))
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(wanted), 10)))
    out["nDCG@10"] = min(dcg / ideal, 1.0) if ideal else 0.0
    return out


METRIC_NAMES = [f"R@{k}" for k in KS] + ["MRR", "nDCG@10"]


def aggregate(rows: Sequence[tuple[int, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Mean metrics for all, without category 5, and per category. ``rows``: (category, metrics)."""
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for category, metrics in rows:
        groups["all"].append(metrics)
        if category != 5:
            groups["no-cat-5"].append(metrics)
        groups[f"cat-{category}"].append(metrics)
    out: dict[str, dict[str, float]] = {}
    for name in ["all", "no-cat-5", *sorted(g for g in groups if g.startswith("cat-"))]:
        if name not in groups:
            continue
        items = groups[name]
        out[name] = {"n": float(len(items))} | {
            m: round(statistics.fmean(x[m] for x in items), 4) for m in METRIC_NAMES
        }
    return out
