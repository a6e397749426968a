"""Reflect: consolidate near-duplicate and repeated facts of a scope, deterministically (no LLM needed).

Facts are grouped when their normalised text is equal, their word sets overlap strongly (Jaccard),
one restates the other with more detail (the smaller word set is almost contained in the larger), or
their embeddings are very close (cosine), and only when they say the same thing: no number, date,
identifier or name differs (`haystack_osa_memory.supersession`: facts with another value are versions or
conflicts, which supersession handles), they are filed under the same topic (or none), and their validity
periods overlap or touch. Each group becomes one `observation` fact whose metadata links to its evidence
(the raw facts' ids) with a count, and which holds for the union of its evidence's validity; the raw facts
leave default recall (status `consolidated`, kept for the audit and readable by id through `evidence`).
An existing observation absorbs new members instead of a second one being made, so running reflect twice
changes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from haystack_osa_memory.store.lifecycle import LifecycleRepository, Scope
from haystack_osa_memory.supersession import fact_words, value_changed
from haystack_osa_memory.tools import CONSOLIDATED, RETIRED
from haystack_osa_memory.validation import FACT_MAX, normalise

OBSERVATION = "observation"
_EVIDENCE_SUFFIX = "\n(consolidated from "


@dataclass(frozen=True)
class ReflectSettings:
    """Thresholds of the grouping."""

    jaccard: float = 0.8
    containment: float = 0.9
    cosine: float = 0.92
    #: Least share of content words two facts linked by their vectors alone must have in common.
    cosine_words: float = 0.5
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


_FOREVER = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Period:
    """When a fact holds: from ``start`` until ``end`` (``None``: until further notice)."""

    start: datetime
    end: datetime | None = None

    def touches(self, other: Period) -> bool:
        """The two periods overlap or meet end to start."""
        return self.start <= (other.end or _FOREVER) and other.start <= (self.end or _FOREVER)

    def union(self, other: Period) -> Period:
        end = None if self.end is None or other.end is None else max(self.end, other.end)
        return Period(min(self.start, other.start), end)


def _instant(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def period_of(fact: dict[str, Any]) -> Period:
    """A candidate's validity: its ``valid_from`` (else its creation, as recall reads it) to its ``valid_to``."""
    meta = fact["metadata"]
    start = _instant(meta.get("valid_from")) or _instant(fact["created_at"])
    assert start is not None
    return Period(start, _instant(meta.get("valid_to")))


def validity_of(members: Sequence[dict[str, Any]]) -> dict[str, str | None]:
    """What an observation of ``members`` holds for: the union of their periods (they overlap or touch),
    and an expiry only when every member expires (the latest of theirs)."""
    period = period_of(members[0])
    for member in members[1:]:
        period = period.union(period_of(member))
    expiries = [_instant(m["metadata"].get("expires_at")) for m in members]
    known = [e for e in expiries if e is not None]
    return {
        "valid_from": period.start.astimezone(UTC).isoformat(),
        "valid_to": period.end.astimezone(UTC).isoformat() if period.end is not None else None,
        "expires_at": max(known).astimezone(UTC).isoformat() if known and len(known) == len(expiries) else None,
    }


def says_same(a: str, b: str) -> bool:
    """The two texts say the same thing: no value (number, date, identifier, name) differs
    (`supersession.value_changed`). Texts equal but for case and punctuation, or one written without
    lower-case letters, are compared case-folded: capitals there say nothing about names."""
    if normalise(a) == normalise(b) or not any(ch.islower() for ch in a) or not any(ch.islower() for ch in b):
        a, b = a.casefold(), b.casefold()
    return not value_changed(fact_words(a), fact_words(b))


def _cosines(facts: list[dict[str, Any]]) -> npt.NDArray[np.float64] | None:
    """Every pair's cosine (one matrix product; 0 where a fact has no vector), or ``None`` without vectors
    of one dimension."""
    vectors = [f.get("embedding") for f in facts]
    dims = {len(v) for v in vectors if v}
    if len(dims) != 1:
        return None
    (dim,) = dims
    matrix = np.array([v if v and len(v) == dim else [0.0] * dim for v in vectors], dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1)
    matrix /= np.where(norms > 0, norms, 1.0)[:, None]
    return matrix @ matrix.T


def _may_merge(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Facts that may share an observation: the same values, the same topic (or none), periods that meet."""
    ta, tb = a["metadata"].get("topic"), b["metadata"].get("topic")
    if ta is not None and tb is not None and ta != tb:
        return False
    return says_same(a["content"], b["content"]) and period_of(a).touches(period_of(b))


def group_facts(facts: list[dict[str, Any]], settings: ReflectSettings) -> list[list[int]]:
    """Indexes of ``facts`` grouped by near-duplication (groups of two or more, stable order).

    Two facts are linked when they are near-duplicates and `_may_merge`; a group is the facts linked
    together (union-find) when each is linked to every other. A group held together only through a chain
    (a short fact contained in two longer ones that say different things; a topic on each side of a
    fact without one) is split again: members taken by validity, each joins the first part whose every
    member it is linked to and whose period it meets.
    """
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
    cosines = _cosines(facts)
    linked: set[tuple[int, int]] = set()
    for i in range(len(facts)):
        for j in range(i + 1, len(facts)):
            if _near_duplicates(i, j, facts, norms, words, cosines, settings) and _may_merge(facts[i], facts[j]):
                linked.add((i, j))
                union(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(len(facts)):
        groups.setdefault(find(i), []).append(i)
    out: list[list[int]] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        if all((a, b) in linked for n, a in enumerate(members) for b in members[n + 1 :]):
            out.append(members)
            continue
        parts: list[tuple[list[int], Period]] = []
        for m in sorted(members, key=lambda k: (period_of(facts[k]).start, k)):
            period = period_of(facts[m])
            for k, (part, span) in enumerate(parts):
                if span.touches(period) and all((min(m, x), max(m, x)) in linked for x in part):
                    parts[k] = ([*part, m], span.union(period))
                    break
            else:
                parts.append(([m], period))
        out.extend(sorted(part) for part, _ in parts if len(part) > 1)
    return sorted(out)


def _near_duplicates(
    i: int,
    j: int,
    facts: list[dict[str, Any]],
    norms: list[str],
    words: list[set[str]],
    cosines: npt.NDArray[np.float64] | None,
    settings: ReflectSettings,
) -> bool:
    if norms[i] == norms[j]:
        return True
    small = min(len(words[i]), len(words[j]))
    if small >= settings.min_words:
        shared = len(words[i] & words[j])
        if shared / len(words[i] | words[j]) >= settings.jaccard or (
            small >= settings.containment_min_words and shared / small >= settings.containment
        ):
            return True
    if cosines is None or float(cosines[i, j]) < settings.cosine:
        return False
    # Close vectors alone do not say two facts say the same thing (a shared preamble or template brings
    # short texts together): their content words must mostly agree too.
    a, b = fact_words(facts[i]["content"]).content, fact_words(facts[j]["content"]).content
    return bool(a | b) and len(a & b) / len(a | b) >= settings.cosine_words


def observation_text(members: list[dict[str, Any]], summarise: Callable[[list[str]], str] | None = None) -> str:
    """The consolidated text: the summariser's, else the most complete member's, with the evidence count.
    A summary that leaves out a value of the members (a number, date, identifier or name) is not used."""
    texts: list[str] = [str(m["content"]) for m in members]
    body = max(texts, key=lambda t: (len(set(normalise(t).split())), len(t), t))
    if summarise is not None:
        summary = summarise(texts).strip()
        values: set[str] = set().union(*(fact_words(t).values for t in texts))
        if summary and values <= fact_words(summary).values:
            body = summary
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
    consolidate: Callable[[str, list[str], list[str], dict[str, str | None]], int],
) -> ReflectReport:
    """One reflect pass over a scope's ``facts`` (`LifecycleRepository.reflect_candidates`).

    Each group of raw facts joins the group's existing observation, or becomes a new one through
    ``write_observation(text, meta) -> id``; ``consolidate(observation_id, evidence, raw_ids, validity)``
    links the evidence, sets the observation's validity (`validity_of`) and takes the raw facts out of
    recall. Returns ``report``, filled in.
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
        validity = validity_of(observations[:1] + raws)
        if observations:
            observation_id = observations[0]["document_id"]
            evidence = list(dict.fromkeys([*observations[0]["metadata"].get("evidence", []), *raw_ids]))
            report.updated.append(observation_id)
        else:
            meta: dict[str, Any] = {"kind": OBSERVATION}
            topic = next((r["metadata"]["topic"] for r in raws if r["metadata"].get("topic")), None)
            if topic is not None:
                meta["topic"] = topic
            meta.update({key: value for key, value in validity.items() if value is not None})
            observation_id = write_observation(observation_text(raws, summariser), meta)
            evidence = raw_ids
            report.created.append(observation_id)
        report.consolidated += consolidate(observation_id, evidence, raw_ids, validity)
    return report


def _connected(members: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``members`` in runs whose periods overlap or touch, each run's periods joined (sorted by start)."""
    runs: list[tuple[list[dict[str, Any]], Period]] = []
    for member in sorted(members, key=lambda m: (period_of(m).start, m["document_id"])):
        period = period_of(member)
        if runs and runs[-1][1].touches(period):
            runs[-1] = ([*runs[-1][0], member], runs[-1][1].union(period))
        else:
            runs.append(([member], period))
    return [run for run, _ in runs]


def _same_validity(observation: dict[str, Any], validity: dict[str, str | None]) -> bool:
    meta = observation["metadata"]
    return all(_instant(meta.get(key)) == _instant(validity[key]) for key in ("valid_from", "valid_to", "expires_at"))


def repair_observations(
    lifecycle: LifecycleRepository, *, dry_run: bool = False, actor: str = "osa-memory repair"
) -> int:
    """Repair observations that an earlier reflect made by merging facts that did not say the same thing.

    For every live observation of every scope: the consolidated evidence facts whose values differ from the
    observation's text (`says_same`) are put back in recall; of those that say the same, the largest run whose
    validity periods meet stays (the others are put back too); the observation then holds for the union of
    its evidence's validity (`validity_of`, not from when reflect ran) and answers their words. With fewer
    than two facts left, the observation is retired and all its facts are put back. Idempotent; with
    ``dry_run`` nothing is written.

    :returns: how many observations were (or, with ``dry_run``, would be) repaired.
    """
    repaired = 0
    for observation in lifecycle.observations():
        scope = Scope(observation["org_id"], observation["assignment_id"])
        evidence_ids = [str(i) for i in observation["metadata"].get("evidence", [])]
        rows = {r["document_id"]: r for r in lifecycle.evidence_rows(scope, evidence_ids)}
        held = [
            rows[i]
            for i in evidence_ids
            if i in rows
            and rows[i]["status"] == CONSOLIDATED
            and rows[i]["metadata"].get("consolidated_into") == observation["document_id"]
        ]
        others = [i for i in evidence_ids if i in rows and rows[i] not in held and rows[i]["status"] != RETIRED]
        body = observation_body(observation["content"])
        same = [r for r in held if says_same(r["content"], body)]
        keep = max(_connected(same), key=len, default=[]) if same else []
        if len(keep) + len(others) < 2:
            keep = []
        kept_ids = {r["document_id"] for r in keep}
        restore = [r["document_id"] for r in held if r["document_id"] not in kept_ids]
        evidence = [i for i in evidence_ids if i in kept_ids or i in others] if keep else []
        validity = validity_of(keep) if keep else None
        if not restore and evidence == evidence_ids and validity is not None and _same_validity(observation, validity):
            continue
        repaired += 1
        if not dry_run:
            lifecycle.repair_observation(
                scope, observation["document_id"], evidence=evidence, restore=restore, validity=validity, actor=actor
            )
    return repaired


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
