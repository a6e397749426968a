"""The facts a stored fact may replace (`possibly_supersedes`), and the judge that may decide on them.

`haystack_osa_memory.supersession` holds the rules (no I/O); this module applies them to a scope: it
runs the recall components for the fact just stored, compares the vectors the store holds, and, when a
`SupersessionJudge` is configured, asks it which of the suggestions the fact replaces. `Memory.store`
calls it after the fact is written, so nothing here can turn a store into an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from haystack import Pipeline

from haystack_osa_memory.caller import Caller
from haystack_osa_memory.components.supersession_judge import SupersessionJudge
from haystack_osa_memory.store.database import fact_scope
from haystack_osa_memory.store.memory_store import MemoryStore
from haystack_osa_memory.supersession import Weights, fact_words, similarity, value_changed

logger = logging.getLogger(__name__)

#: The scope's best matches for a stored fact that are tested as facts it may replace, and how many are offered.
SUGGESTIONS_SEARCHED = 15
SUGGESTIONS_MAX = 8
#: Content-word overlap for a suggestion: lower than recall's (`supersession.SIMILARITY_MIN`), because the
#: agent confirms what is suggested, and a missed predecessor keeps answering as if it still held.
SUGGESTION_SIMILARITY_MIN = 0.15
#: ... or cosine similarity of the two facts' vectors.
SUGGESTION_COSINE_MIN = 0.5
#: ... and the two share a word that names the subject: one weighing at least this share of the new fact's
#: heaviest word among the matches. Two subjects written with one template share only its light words.
SUGGESTION_SHARED_SHARE = 0.5

#: One suggestion: a fact of the scope the stored one probably replaces.
Suggestion = dict[str, str]


def as_judge(judge: Any | None) -> SupersessionJudge | None:
    """``judge`` as a `SupersessionJudge`: a chat generator is wrapped with the default budget."""
    if judge is None or isinstance(judge, SupersessionJudge):
        return judge
    return SupersessionJudge(chat_generator=judge)


def warm_up_judge(judge: SupersessionJudge | None) -> None:
    """Warm the judge up; a failure is logged, not raised (stores still work: the judge then answers
    `degraded` and its suggestions are returned)."""
    if judge is None:
        return
    try:
        judge.warm_up()
    except Exception as e:
        logger.warning("the supersession judge could not be warmed up: %s", type(e).__name__)


def possible_predecessors(
    recall: Pipeline,
    kb: MemoryStore | None,
    text: str,
    document_id: str,
    named: set[str],
    caller: Caller,
    embedding: Any | None,
) -> list[Suggestion]:
    """Facts of the caller's scope that ``text`` (stored as ``document_id``) probably restates with another
    value, best match first, at most `SUGGESTIONS_MAX`, without those ``named`` as superseded already.

    The scope's best matches for it come from the recall components (``retrieve``, ``acl``, ``strip`` of
    ``recall``) with the vector the store just computed (no second embedding); a match is kept when its
    value changed, its words overlap or its vector is close (read from ``kb``), and it shares a word naming
    the subject with the fact (not only a template's words).
    """
    scope = {"org_id": caller.org_id, "assignment_id": caller.assignment_id}
    retrieved = recall.get_component("retrieve").run(
        query=text, query_embedding=embedding, top_k=SUGGESTIONS_SEARCHED, **scope
    )["documents"]
    admitted = recall.get_component("acl").run(documents=retrieved, **scope)["documents"]
    found = [
        {"document_id": d.meta["document_id"], "content": d.content or ""}
        for d in recall.get_component("strip").run(documents=admitted)["documents"]
    ]
    found = [f for f in found if f["document_id"] != document_id and f["document_id"] not in named]
    weights = Weights([text, *(f["content"] for f in found)])
    new = fact_words(text)
    # A probable succession (`supersession.probable_succession`): a changed value, then words or vectors.
    changed = [(f, words) for f in found if value_changed(words := fact_words(f["content"]), new)]
    close: dict[str, float] = {}
    if embedding is not None and changed and kb is not None:
        # The same statement in other words: the vectors tell what the words do not.
        with fact_scope(caller.org_id, caller.assignment_id):
            ids = [f["document_id"] for f, _ in changed]
            close = kb.facts.cosines_to(document_id, ids, caller.org_id)
    top = max((weights(t) for t in new.tokens), default=0.0)
    return [
        f
        for f, words in changed
        if (
            close.get(f["document_id"], 0.0) >= SUGGESTION_COSINE_MIN
            or similarity(words, new, weights) >= SUGGESTION_SIMILARITY_MIN
        )
        and max((weights(t) for t in words.tokens & new.tokens), default=0.0) >= SUGGESTION_SHARED_SHARE * top
    ][:SUGGESTIONS_MAX]


def judge_predecessors(
    judge: SupersessionJudge,
    fact: str,
    possible: list[Suggestion],
    supersede: Callable[[list[str]], object],
    *,
    document_id: str,
) -> tuple[list[str], list[Suggestion]]:
    """Let the judge decide which of ``possible`` the stored ``fact`` replaces.

    :param fact: The fact as stored (redacted): the judge may be a remote LLM.
    :param supersede: Writes the fact again as superseding the ids it is given (the ones confirmed).
    :param document_id: The stored fact's id (for the log).
    :returns: the ids superseded, and the suggestions still offered (those the judge left undecided).
        When the judge runs out of its budget or fails, or the supersession fails, the suggestions are
        returned unchanged (with what was superseded before the failure, if anything).
    """
    superseded: list[str] = []
    try:
        verdict = judge.run(fact=fact, candidates=possible)
        confirmed = list(verdict["superseded"])
        if confirmed:
            supersede(confirmed)
            superseded = confirmed
        if verdict["degraded"]:
            logger.warning("store %s: %s; its suggestions are returned", document_id, verdict["degraded"])
        undecided = set(verdict["undecided"])
        return superseded, [p for p in possible if p["document_id"] in undecided]
    except Exception as e:  # the supersession itself failed: the suggestions are returned instead
        logger.warning(
            "store %s: the judge's supersession failed (%s); its suggestions are returned",
            document_id,
            type(e).__name__,
        )
        return superseded, possible
