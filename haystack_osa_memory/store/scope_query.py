"""Whose facts a recall reads, and which of them: `ScopeQuery`, built once per recall and passed to every
statement that reads the scope, with the validity condition those statements share (`VALID_AT`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from psycopg import sql

from haystack_osa_memory.store.parameters import text_array
from haystack_osa_memory.tools import CONSOLIDATED

FACT_SOURCE = "agent_fact"
FACT_AUDIENCE = "ai_internal"
#: Facts a recall reads though it never returns them: they lend their terms and vector to their neighbours'
#: context windows (`ranking.rank_scope`'s ``scored``). A fact reflect consolidated into an observation still
#: sits between the turns it was stored with; without it they would lose the context it gave them.
CONTEXT_STATUSES: tuple[str, ...] = (CONSOLIDATED,)

# When a fact holds (its validity time, distinct from when it was stored): from ``valid_from`` (default the
# store time; facts stored before validity times existed hold from ``created_at``) until ``valid_to``
# (set by supersession or by the caller). ``%(valid_at)s`` NULL means any time; ``%(history)s`` admits
# facts that held at any time up to ``valid_at`` (recall with ``include_superseded``).
VALID_FROM = sql.SQL("coalesce((g.metadata->>'valid_from')::timestamptz, g.created_at)")
VALID_TO = sql.SQL("coalesce((g.metadata->>'valid_to')::timestamptz, 'infinity')")
VALID_AT = sql.SQL(
    """(%(valid_at)s::timestamptz IS NULL
     OR ({valid_from} <= %(valid_at)s::timestamptz
         AND (%(history)s::boolean
              OR {valid_to} > %(valid_at)s::timestamptz)))"""
).format(valid_from=VALID_FROM, valid_to=VALID_TO)

#: When the facts must hold (`VALID_AT`): a time, ``"now"`` (PostgreSQL's transaction time) or ``None`` (any time).
ValidAt = datetime | Literal["now"] | None


@dataclass(frozen=True)
class ScopeQuery:
    """The scope of one recall: the caller's org and assignment, the audiences and statuses admitted
    (``None``: the configuration's admitted statuses), when the facts must hold (`ValidAt`) and whether
    facts that held at any time up to then count too (``history``).

    Usage:
    ```python
    scope = ScopeQuery.of("acme", "a1", statuses=["approved", "superseded"], valid_at=None, history=True)
    hits = repo.scope_hits(scope, query="vpn", embedding=None, ranking=RankingParams(k=50))
    ```
    """

    org_id: str
    assignment_id: str
    audiences: tuple[str, ...] = (FACT_AUDIENCE,)
    statuses: tuple[str, ...] | None = None
    valid_at: ValidAt = "now"
    history: bool = False

    @classmethod
    def of(
        cls,
        org_id: str,
        assignment_id: str,
        audiences: Sequence[str] = (FACT_AUDIENCE,),
        statuses: Sequence[str] | None = None,
        valid_at: ValidAt = "now",
        history: bool = False,
    ) -> ScopeQuery:
        """The scope of these keyword arguments (any sequences: they are kept as tuples)."""
        return cls(
            org_id,
            assignment_id,
            tuple(audiences),
            tuple(statuses) if statuses is not None else None,
            valid_at,
            history,
        )

    def params(self, admitted_statuses: Sequence[str]) -> dict[str, Any]:
        """The statements' scope parameters. ``statuses`` are the admitted ones (those given, else
        ``admitted_statuses``); ``read_statuses`` add `CONTEXT_STATUSES`, read only to lend context."""
        admitted = list(self.statuses or admitted_statuses)
        return {
            "org_id": self.org_id,
            "assignment_id": self.assignment_id,
            "audiences": text_array(self.audiences),
            "statuses": text_array(admitted),
            "read_statuses": text_array([*admitted, *(s for s in CONTEXT_STATUSES if s not in admitted)]),
            "valid_at": self.valid_at,
            "history": self.history,
        }

    def held_kind(self, admitted_statuses: Sequence[str]) -> bool:
        """A recall the held scopes answer (`scope_cache`): the facts' audience, the admitted statuses
        (``admitted_statuses``, the configuration's), valid now."""
        admitted = list(self.statuses or admitted_statuses) == list(admitted_statuses)
        return admitted and list(self.audiences) == [FACT_AUDIENCE] and self.valid_at == "now" and not self.history
