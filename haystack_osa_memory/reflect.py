"""Reflect: consolidate near-duplicate and repeated facts of a scope, deterministically (no LLM needed).

Facts are grouped when their normalised text is equal, their word sets overlap strongly (Jaccard),
one restates the other with more detail (the smaller word set is almost contained in the larger), or
their embeddings are very close (cosine). Each group becomes one `observation` fact whose
metadata links to its evidence (the raw facts' ids) with a count; the raw facts leave default recall
(status `consolidated`, kept for the audit). An existing observation absorbs new members instead of
a second one being made, so running reflect twice changes nothing the second time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from haystack_osa_memory.validation import FACT_MAX, normalise

OBSERVATION = "observation"
_EVIDENCE_SUFFIX = "\n(consolidated from "


@dataclass(frozen=True)
class ReflectSettings:
    """Thresholds of the grouping."""

    jaccard: float = 0.8
    containment: float = 0.9
    cosine: float = 0.92
    min_words: int = 3
    containment_min_words: int = 6


@dataclass
class ReflectReport:
    """What one reflect run changed in one scope."""

    org_id: str
    assignment_id: str
    groups: int = 0
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    consolidated: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "org_id": self.org_id,
            "assignment_id": self.assignment_id,
            "groups": self.groups,
            "observations_created": self.created,
            "observations_updated": self.updated,
            "facts_consolidated": self.consolidated,
            "changed": bool(self.created or self.updated or self.consolidated),
        }


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def group_facts(facts: list[dict[str, Any]], settings: ReflectSettings) -> list[list[int]]:
    """Indexes of ``facts`` grouped by near-duplication (union-find; groups of two or more, stable order)."""
    parent = list(range(len(facts)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)

    norms = [normalise(f["content"]) for f in facts]
    words = [set(n.split()) for n in norms]
    for i in range(len(facts)):
        for j in range(i + 1, len(facts)):
            if norms[i] == norms[j]:
                union(i, j)
                continue
            small = min(len(words[i]), len(words[j]))
            if small >= settings.min_words:
                shared = len(words[i] & words[j])
                if shared / len(words[i] | words[j]) >= settings.jaccard or (
                    small >= settings.containment_min_words and shared / small >= settings.containment
                ):
                    union(i, j)
                    continue
            ei, ej = facts[i].get("embedding"), facts[j].get("embedding")
            if ei and ej and len(ei) == len(ej) and _cosine(ei, ej) >= settings.cosine:
                union(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(len(facts)):
        groups.setdefault(find(i), []).append(i)
    return [members for members in groups.values() if len(members) > 1]


def observation_text(members: list[dict[str, Any]], summarise: Callable[[list[str]], str] | None = None) -> str:
    """The consolidated text: the summariser's, else the most complete member's, with the evidence count."""
    texts = [m["content"] for m in members]
    if summarise is not None:
        body = summarise(texts).strip()
    else:
        body = max(texts, key=lambda t: (len(set(normalise(t).split())), len(t), t))
    suffix = f"{_EVIDENCE_SUFFIX}{len(members)} facts)"
    return body[: FACT_MAX - len(suffix)] + suffix


def observation_body(text: str) -> str:
    """An observation's text without the evidence count `observation_text` appends (what is compared
    when the observation is grouped again)."""
    return text.rsplit(_EVIDENCE_SUFFIX, 1)[0]


def consolidate_scope(
    report: ReflectReport,
    facts: list[dict[str, Any]],
    *,
    settings: ReflectSettings,
    summariser: Callable[[list[str]], str] | None,
    write_observation: Callable[[str, dict[str, Any]], str],
    consolidate: Callable[[str, list[str], list[str]], int],
) -> ReflectReport:
    """One reflect pass over a scope's ``facts`` (`LifecycleRepository.reflect_candidates`).

    Each group of raw facts joins the group's existing observation, or becomes a new one through
    ``write_observation(text, meta) -> id``; ``consolidate(observation_id, evidence, raw_ids)`` links the
    evidence and takes the raw facts out of recall. Returns ``report``, filled in.
    """
    for fact in facts:
        if fact["metadata"].get("kind") == OBSERVATION:
            fact["content"] = observation_body(fact["content"])
    for group in group_facts(facts, settings):
        members = [facts[i] for i in group]
        observations = [m for m in members if m["metadata"].get("kind") == OBSERVATION]
        raws = [m for m in members if m["metadata"].get("kind") != OBSERVATION]
        if not raws:
            continue
        report.groups += 1
        raw_ids = [r["document_id"] for r in raws]
        if observations:
            observation_id = observations[0]["document_id"]
            evidence = list(dict.fromkeys([*observations[0]["metadata"].get("evidence", []), *raw_ids]))
            report.updated.append(observation_id)
        else:
            meta: dict[str, Any] = {"kind": OBSERVATION}
            topic = next((r["metadata"]["topic"] for r in raws if r["metadata"].get("topic")), None)
            if topic is not None:
                meta["topic"] = topic
            observation_id = write_observation(observation_text(raws, summariser), meta)
            evidence = raw_ids
            report.created.append(observation_id)
        report.consolidated += consolidate(observation_id, evidence, raw_ids)
    return report


def chat_summariser(generator: Any) -> Callable[[list[str]], str]:
    """Adapt any Haystack chat generator (`run(messages=[...]) -> {"replies": [ChatMessage]}`) to a summariser."""
    from haystack.dataclasses import ChatMessage

    def summarise(texts: list[str]) -> str:
        prompt = (
            "Merge these notes about the same thing into one short, self-contained fact. "
            "Keep every concrete detail; do not add anything.\n- " + "\n- ".join(texts)
        )
        replies = generator.run(messages=[ChatMessage.from_user(prompt)])["replies"]
        text = replies[0].text if replies else None
        return text or max(texts, key=len)

    return summarise
