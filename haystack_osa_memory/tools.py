"""The memory tools' contract, declared once: names, descriptions, arguments, results, limits, choices.

Each tool is one :class:`ToolSpec`: a one-line description, an ``Arguments`` pydantic model (names,
defaults, limits and per-argument descriptions) and a ``Result`` pydantic model (what a successful
call returns). Everything else derives from these declarations:

- the Hayhooks wrappers' ``run_api`` signatures and docstrings (``mcp.wrapper.tool_api``), from which
  Hayhooks builds each MCP tool's input schema and description;
- the MCP ``outputSchema`` of each tool and the ``structuredContent`` of its results (``serve``);
- the limits and choices that ``validation`` enforces;
- the Haystack ``Agent`` tools (``agent_tools``);
- the README's tool table (:func:`markdown_table`, checked by a unit test).

This module imports nothing from the rest of the package, so that every module can import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Final, Generic, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field

# -- limits ------------------------------------------------------------------------------------------
FACT_MAX: Final = 2000
TOPIC_MAX: Final = 120
QUERY_MAX: Final = 1000
LIMIT_MIN: Final = 1
LIMIT_MAX: Final = 20
LIMIT_DEFAULT: Final = 8
TITLE_MAX: Final = 120
NOTE_MAX: Final = 500
REASON_MAX: Final = 500
PATH_MAX: Final = 300
PATHS_MAX: Final = 20
PERSONA_MAX: Final = 60
PERSONAS_MAX: Final = 10
TTL_DAYS_MAX: Final = 3650
CURSOR_MAX: Final = 500
ASSIGNMENT_MAX: Final = 128
#: Facts one store may supersede.
SUPERSEDES_MAX: Final = 20
#: An ISO 8601 date or date-time (`2026-03-01`, `2026-03-01T09:30:00+01:00`); without an offset, UTC.
TIMESTAMP_MAX: Final = 40
#: Times from the start of this year up to (not including) the start of the last one, in UTC.
TIMESTAMP_YEARS: Final = (1900, 9000)
DOCUMENT_ID_LENGTH: Final = 64
#: Facts per page of `kb_memory_list`.
PAGE_SIZE: Final = 20

# -- choices -----------------------------------------------------------------------------------------
Kind = Literal["fact", "procedure", "pitfall", "preference", "reference"]
Verdict = Literal["confirm", "flag"]
#: Statuses a caller can list, import and filter by.
ListableStatus = Literal["approved", "proposed", "flagged", "rejected", "superseded"]
#: Statuses a fact can be read in: the listable ones and `consolidated` (merged into an observation by reflect).
LiveStatus = Literal[ListableStatus, "consolidated"]
#: Every status of a fact's governing row: the live ones and `retired` (forgotten: never read, listed or
#: recalled again).
Status = Literal[LiveStatus, "retired"]
#: What `kb_memory_status` reports about the database.
DatabaseState = Literal["ok", "unreachable", "unauthorised", "erroring"]

KINDS: tuple[str, ...] = get_args(Kind)
VERDICTS: tuple[str, ...] = get_args(Verdict)
LISTABLE_STATUSES: tuple[str, ...] = get_args(ListableStatus)
STATUSES: tuple[str, ...] = get_args(Status)
APPROVED, PROPOSED, FLAGGED, REJECTED, SUPERSEDED, CONSOLIDATED, RETIRED = STATUSES

# -- the governed lifecycle: the one table of allowed transitions -------------------------------------
#: What can happen to a fact. Agents act through the tools (`supersede`: another fact names it in
#: `supersedes`; `confirm` / `flag`: votes until trust crosses the floor; `reflect`: it repeats another
#: approved fact; `forget, then store`: its text stored again after `kb_memory_forget`); `import` is the
#: operator's `osa-memory import` of its text; people act through `osa-memory review`.
AGENT_ACTIONS: tuple[str, ...] = (
    "store",
    "supersede",
    "propose",
    "confirm",
    "flag",
    "import",
    "reflect",
    "forget",
    "forget, then store",
)
PERSON_ACTIONS: tuple[str, ...] = ("review accept", "review reject")
ACTIONS: tuple[str, ...] = AGENT_ACTIONS + PERSON_ACTIONS
#: The source of a fact that does not exist yet.
NEW: Final = "new"
_LIVE: tuple[str, ...] = (APPROVED, PROPOSED, FLAGGED, REJECTED, SUPERSEDED, CONSOLIDATED)


def _outcomes() -> dict[tuple[str, str], tuple[str, bool]]:
    """(status, action) -> (status after, refused): every live status and every action, plus `new`."""
    table: dict[tuple[str, str], tuple[str, bool]] = {}
    for status in _LIVE:
        for action in ACTIONS:
            table[(status, action)] = (status, False)  # by default nothing changes
        table[(status, "supersede")] = (status, True)
        table[(status, "propose")] = (status, True)  # a duplicate of a fact of the scope
        table[(status, "forget")] = (RETIRED, False)
        # Only a person's decision lets a fact forgotten while held come back recalled.
        held = status in (PROPOSED, FLAGGED, REJECTED)
        table[(status, "forget, then store")] = (PROPOSED if held else APPROVED, False)
        reviewable = status in (PROPOSED, FLAGGED)
        table[(status, "review accept")] = (APPROVED if reviewable else status, not reviewable)
        table[(status, "review reject")] = (REJECTED if reviewable else status, not reviewable)
    table[(APPROVED, "supersede")] = (SUPERSEDED, False)
    table[(APPROVED, "flag")] = (FLAGGED, False)
    table[(APPROVED, "reflect")] = (CONSOLIDATED, False)
    table[(SUPERSEDED, "store")] = (APPROVED, False)  # the value went back: it holds again
    table[(NEW, "store")] = (APPROVED, False)
    table[(NEW, "propose")] = (PROPOSED, False)
    table[(NEW, "import")] = (APPROVED, False)  # or the status the file gives
    return table


#: (status, action) -> (status after, whether the tool refuses): the only transitions the lifecycle allows
#: (docs/lifecycle.md renders it with :func:`transitions_markdown`; tests try every cell).
TRANSITIONS: Final[dict[tuple[str, str], tuple[str, bool]]] = _outcomes()


def _sources(action: str, target: str) -> tuple[str, ...]:
    return tuple(s for s in _LIVE if TRANSITIONS[(s, action)] == (target, False) and s != target)


#: Statuses a fact can be superseded from (a newer fact replaces it; see `kb_memory_store`'s `supersedes`).
SUPERSEDABLE_STATUSES: tuple[str, ...] = _sources("supersede", SUPERSEDED)
#: Statuses a person's review accepts or rejects.
REVIEWABLE_STATUSES: tuple[str, ...] = _sources("review accept", APPROVED)
#: Statuses only a person's review moves a fact out of into recall: storing the same text keeps them, and
#: the text of a fact forgotten in one of them comes back `proposed`.
HELD_STATUSES: tuple[str, ...] = (*_sources("forget, then store", PROPOSED), PROPOSED)
#: Statuses feedback may change (flags take trust below the floor; confirmations never lift a flag).
FLAGGABLE_STATUSES: tuple[str, ...] = _sources("flag", FLAGGED)


def transitions_markdown() -> str:
    """docs/lifecycle.md's transition table and diagram, rendered from `TRANSITIONS`."""
    head = "| status | " + " | ".join(f"{a}{' (person)' if a in PERSON_ACTIONS else ''}" for a in ACTIONS) + " |"
    rows = [head, "|" + "---|" * (len(ACTIONS) + 1)]
    for status in (NEW, *_LIVE):
        cells = []
        for action in ACTIONS:
            outcome = TRANSITIONS.get((status, action))
            if outcome is None:
                cells.append("")
            else:
                after, refused = outcome
                cells.append("refused" if refused else ("·" if after == status else f"**{after}**"))
        rows.append(f"| `{status}` | " + " | ".join(cells) + " |")
    edges: dict[tuple[str, str], list[str]] = {}
    for (status, action), (after, refused) in TRANSITIONS.items():
        if not refused and after != status:
            edges.setdefault((status, after), []).append(action)
    diagram = ["```mermaid", "stateDiagram-v2"]
    for (status, after), actions in edges.items():
        source = "[*]" if status == NEW else status
        diagram.append(f"    {source} --> {after}: {', '.join(actions)}")
    diagram.append("```")
    return "\n".join([*rows, "", *diagram])


DATABASE_STATES: tuple[str, ...] = get_args(DatabaseState)


def _text(max_len: int, min_len: int = 1) -> Any:
    return Field(min_length=min_len, max_length=max_len)


_TIMESTAMP = (
    f"ISO 8601 date or date-time between the years {TIMESTAMP_YEARS[0]} and {TIMESTAMP_YEARS[1]} "
    "(without an offset: UTC)"
)
_ACT_ON = "Optional assignment to act on, one granted to your token (default: its first)."
_DOCUMENT_ID = f"The fact's {DOCUMENT_ID_LENGTH}-character id."


class _Arguments(BaseModel):
    """Base of the argument models: unknown arguments are refused (the MCP server says so in the schema)."""

    model_config = ConfigDict(extra="forbid")


# -- arguments ---------------------------------------------------------------------------------------
class StoreArguments(_Arguments):
    fact: Annotated[
        str,
        _text(FACT_MAX),
        Field(description=f"The fact to remember, 1 to {FACT_MAX} characters, self-contained (who/what/why)."),
    ]
    topic: Annotated[
        str | None,
        _text(TOPIC_MAX),
        Field(description=f"Optional short topic to group facts, at most {TOPIC_MAX} characters."),
    ] = None
    kind: Annotated[
        Kind,
        Field(description="What sort of knowledge this is: fact, procedure, pitfall, preference or reference."),
    ] = "fact"
    ttl_days: Annotated[
        int | None,
        Field(ge=1, le=TTL_DAYS_MAX),
        Field(description="Optional time to live in days; afterwards the fact is returned marked stale."),
    ] = None
    supersedes: Annotated[
        list[Annotated[str, _text(DOCUMENT_ID_LENGTH, DOCUMENT_ID_LENGTH)]] | None,
        Field(max_length=SUPERSEDES_MAX),
        Field(
            description=f"Optional ids of facts of this assignment that this fact replaces (at most {SUPERSEDES_MAX}): "
            "they are kept as history, no longer recalled."
        ),
    ] = None
    valid_from: Annotated[
        str | None,
        _text(TIMESTAMP_MAX),
        Field(description=f"Optional time from which the fact holds, {_TIMESTAMP}; default: now."),
    ] = None
    valid_to: Annotated[
        str | None,
        _text(TIMESTAMP_MAX),
        Field(description=f"Optional time until which the fact holds, {_TIMESTAMP}; default: until replaced."),
    ] = None
    assignment: Annotated[str | None, _text(ASSIGNMENT_MAX), Field(description=_ACT_ON)] = None


class RecallArguments(_Arguments):
    query: Annotated[
        str,
        _text(QUERY_MAX),
        Field(description=f"What you want to remember, 1 to {QUERY_MAX} characters (a question or keywords)."),
    ]
    limit: Annotated[
        int,
        Field(ge=LIMIT_MIN, le=LIMIT_MAX),
        Field(description=f"How many facts to return, {LIMIT_MIN} to {LIMIT_MAX} (default {LIMIT_DEFAULT})."),
    ] = LIMIT_DEFAULT
    as_of: Annotated[
        str | None,
        _text(TIMESTAMP_MAX),
        Field(description=f"Optional time, {_TIMESTAMP}: recall the facts valid then (default: valid now)."),
    ] = None
    include_superseded: Annotated[
        bool,
        Field(description="Also return facts that were replaced or are no longer valid (history)."),
    ] = False
    assignment: Annotated[str | None, _text(ASSIGNMENT_MAX), Field(description=_ACT_ON)] = None


class ReadArguments(_Arguments):
    document_id: Annotated[
        str,
        _text(DOCUMENT_ID_LENGTH, DOCUMENT_ID_LENGTH),
        Field(
            description=f"The {DOCUMENT_ID_LENGTH}-character id returned by kb_memory_store, kb_memory_recall "
            "or kb_memory_list."
        ),
    ]
    assignment: Annotated[str | None, _text(ASSIGNMENT_MAX), Field(description=_ACT_ON)] = None


class FeedbackArguments(_Arguments):
    document_id: Annotated[str, _text(DOCUMENT_ID_LENGTH, DOCUMENT_ID_LENGTH), Field(description=_DOCUMENT_ID)]
    verdict: Annotated[Verdict, Field(description="confirm or flag.")]
    note: Annotated[
        str | None,
        _text(NOTE_MAX),
        Field(description=f"Optional reason, at most {NOTE_MAX} characters, without secrets."),
    ] = None
    assignment: Annotated[str | None, _text(ASSIGNMENT_MAX), Field(description=_ACT_ON)] = None


class ProposeArguments(_Arguments):
    kind: Annotated[Kind, Field(description="fact, procedure, pitfall, preference or reference.")]
    title: Annotated[str, _text(TITLE_MAX), Field(description=f"Short title, at most {TITLE_MAX} characters.")]
    body: Annotated[
        str,
        _text(FACT_MAX),
        Field(description=f"The knowledge itself, at most {FACT_MAX} characters, without secrets."),
    ]
    paths: Annotated[
        list[Annotated[str, _text(PATH_MAX)]] | None,
        Field(max_length=PATHS_MAX),
        Field(description=f"Optional files or folders it concerns (at most {PATHS_MAX})."),
    ] = None
    personas: Annotated[
        list[Annotated[str, _text(PERSONA_MAX)]] | None,
        Field(max_length=PERSONAS_MAX),
        Field(description=f"Optional roles it is meant for (at most {PERSONAS_MAX})."),
    ] = None
    assignment: Annotated[str | None, _text(ASSIGNMENT_MAX), Field(description=_ACT_ON)] = None


class ForgetArguments(_Arguments):
    document_id: Annotated[str, _text(DOCUMENT_ID_LENGTH, DOCUMENT_ID_LENGTH), Field(description=_DOCUMENT_ID)]
    reason: Annotated[
        str,
        _text(REASON_MAX),
        Field(description=f"Why it is retracted (kept for the audit), at most {REASON_MAX} characters."),
    ]
    assignment: Annotated[str | None, _text(ASSIGNMENT_MAX), Field(description=_ACT_ON)] = None


class ListArguments(_Arguments):
    status: Annotated[
        ListableStatus | None, Field(description="Only facts with this status (default: all but retracted ones).")
    ] = None
    topic: Annotated[str | None, _text(TOPIC_MAX), Field(description="Only facts with this topic.")] = None
    cursor: Annotated[str | None, _text(CURSOR_MAX), Field(description="The next_cursor of the previous page.")] = None
    assignment: Annotated[str | None, _text(ASSIGNMENT_MAX), Field(description=_ACT_ON)] = None


class ReflectArguments(_Arguments):
    assignment: Annotated[str | None, _text(ASSIGNMENT_MAX), Field(description=_ACT_ON)] = None


class StatusArguments(_Arguments):
    assignment: Annotated[
        str | None,
        _text(ASSIGNMENT_MAX),
        Field(description="Optional assignment to report on, one granted to your token (default: its first)."),
    ] = None


class ScopesArguments(_Arguments):
    pass


# -- results -----------------------------------------------------------------------------------------
# Results are open objects (no `additionalProperties: false`): a tool may add keys in a later version.
# Keys that only some answers carry are optional (`| None = None`): absent, never null, unless said so.
_ASSIGNMENT_ID = "The assignment the call acted on."
_STORED_AT = "When the fact was last stored (ISO 8601)."
_FACT_KIND = "fact, procedure, pitfall, preference, reference, or observation (made by reflect)."


class PossibleSuccession(BaseModel):
    """A fact that the stored one probably replaces."""

    document_id: str
    content: str


class StoreResult(BaseModel):
    """The stored fact's ids; `stored: false, queued: true` while the database is unreachable."""

    stored: bool = Field(description="True when the fact is in the database; false when it was queued.")
    assignment_id: str = Field(description=_ASSIGNMENT_ID)
    document_id: str = Field(description="The fact's id (the same fact stored again keeps it).")
    redactions: int = Field(description="How many private values were redacted before storing.")
    possibly_supersedes: list[PossibleSuccession] | None = Field(
        None,
        description="Facts of this assignment this one probably replaces (same wording, another value); unchanged: "
        "store again with `supersedes` to confirm.",
    )
    superseded: list[str] | None = Field(None, description="The facts this store superseded.")
    status: str | None = Field(
        None,
        description="Present when the same text waits for a person's review (proposed, flagged) or was refused "
        "(rejected): storing it again keeps that status, it is not recalled.",
    )
    queued: bool | None = Field(None, description="True when the fact waits in the server's offline buffer.")
    reason: str | None = Field(None, description="Why the fact was queued.")
    pending: int | None = Field(None, description="Facts of this assignment waiting in the buffer.")


class RecalledFact(BaseModel):
    """One recalled fact."""

    document_id: str
    content: str
    topic: str | None
    score: float = Field(description="Relevance, higher is better.")
    stored_at: str | None = Field(description=_STORED_AT)
    kind: str = Field(description=_FACT_KIND)
    stale: bool = Field(description="True when its time to live has passed.")
    valid_from: str | None = Field(None, description="From when the fact holds (ISO 8601).")
    valid_to: str | None = Field(None, description="Until when it holds (ISO 8601); null while it holds.")
    superseded_by: str | None = Field(None, description="The fact that replaced it (history only).")
    conflicts_with: list[str] | None = Field(
        None, description="Live facts saying the same with another value; the one valid from later ranks first."
    )


class RecallResult(BaseModel):
    """This assignment's best-matching facts, best first."""

    assignment_id: str = Field(description=_ASSIGNMENT_ID)
    facts: list[RecalledFact]
    degraded: str | None = Field(None, description="Present when only keyword search or the buffer answered.")


class StoredBy(BaseModel):
    """Who stored a fact."""

    token_id: str | None
    specialist_id: str | None


class ChainLink(BaseModel):
    """One version in a fact's history."""

    document_id: str
    status: str
    valid_from: str | None
    valid_to: str | None
    content: str | None


class ReadResult(BaseModel):
    """The fact with its provenance, status and trust."""

    document_id: str
    content: str | None
    kind: str = Field(description=_FACT_KIND)
    topic: str | None
    title: str | None
    paths: list[str]
    personas: list[str]
    stored_by: StoredBy
    stored_at: str = Field(description=_STORED_AT)
    created_at: str = Field(description="When the fact was first stored (ISO 8601).")
    expires_at: str | None = Field(description="When its time to live ends (ISO 8601), if it has one.")
    status: LiveStatus
    trust: float = Field(description="From 0 to 1: confirms against flags.")
    confirms: int
    flags: int
    reads: int = Field(description="How many runs read it.")
    valid_from: str | None = Field(None, description="From when the fact holds (ISO 8601).")
    valid_to: str | None = Field(None, description="Until when it holds (ISO 8601); absent while it holds.")
    superseded_by: str | None = Field(None, description="The fact that replaced it.")
    supersedes: list[str] | None = Field(None, description="The facts it replaced.")
    chain: list[ChainLink] | None = Field(
        None, description="Its whole history, oldest first: every version of this fact with its validity."
    )
    evidence: list[str] | None = Field(None, description="For an observation: the facts it consolidates.")
    count: int | None = Field(None, description="For an observation: how many facts it consolidates (may be null).")


class FeedbackResult(BaseModel):
    """The fact's trust and status after the vote."""

    document_id: str
    trust: float = Field(description="From 0 to 1: confirms against flags.")
    status: LiveStatus = Field(description="flagged when trust fell below the floor.")
    confirms: int
    flags: int


class ProposeResult(BaseModel):
    """The proposal's id, or why it was refused (a secret, a duplicate); a human accepts it before recall."""

    document_id: str | None = Field(None, description="The proposed fact's id.")
    status: Literal["proposed"] | None = Field(None, description="proposed: recalled once a human accepts it.")
    redactions: int | None = Field(None, description="How many private values were redacted.")
    rejected: str | None = Field(None, description="Why the proposal was refused; nothing was stored.")


class ForgetResult(BaseModel):
    """The fact is retracted: never recalled, read or listed again."""

    forgotten: Literal[True]
    document_id: str


class ListedFact(BaseModel):
    """One listed fact."""

    document_id: str
    status: ListableStatus
    title: str | None
    kind: str = Field(description=_FACT_KIND)
    topic: str | None
    content: str | None
    created_at: str = Field(description="When the fact was first stored (ISO 8601).")
    stored_at: str = Field(description=_STORED_AT)


class ListResult(BaseModel):
    """A page of this assignment's facts, oldest first."""

    assignment_id: str = Field(description=_ASSIGNMENT_ID)
    facts: list[ListedFact]
    next_cursor: str | None = Field(description="Pass it as `cursor` for the next page; null on the last page.")


class ReflectResult(BaseModel):
    """What consolidation changed."""

    org_id: str
    assignment_id: str = Field(description=_ASSIGNMENT_ID)
    groups: int = Field(description="Groups of near-duplicate facts found.")
    observations_created: list[str]
    observations_updated: list[str]
    facts_consolidated: int
    changed: bool


class EmbedderState(BaseModel):
    """The query embedder."""

    state: Literal["none", "ready", "unavailable"]
    mode: Literal["lexical", "hybrid"]


class ScopeIds(BaseModel):
    """The caller's scope."""

    org_id: str
    assignment_id: str


class StatusResult(BaseModel):
    """Health of the memory for your scope (no connection details)."""

    version: str
    database: DatabaseState
    database_detail: str | None = Field(description="Why the database is not ok; null when it is.")
    pending: int = Field(description="Facts of your scope waiting in the offline buffer.")
    rejected: int = Field(description="Buffered facts of your scope refused at replay (token revoked).")
    embedder: EmbedderState
    scope: ScopeIds
    facts: int | None = Field(description="Facts in your scope; null when the database is not ok.")


class ScopesResult(BaseModel):
    """The assignments your token may use."""

    org_id: str
    default_assignment: str = Field(description="The assignment used when a tool gets no `assignment`.")
    assignments: list[str]


# -- the tools ---------------------------------------------------------------------------------------
A = TypeVar("A", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True)
class ToolSpec(Generic[A, R]):
    """One tool: its name, one-line description (the MCP description), argument and result models."""

    name: str
    description: str
    Arguments: type[A]
    Result: type[R]
    #: More for Python readers of the wrapper's docstring (MCP clients see only `description`).
    details: str = ""

    @property
    def docstring(self) -> str:
        """The wrapper's `run_api` docstring: description, details, and an `Args:` line per argument."""
        parts = [self.description]
        if self.details:
            parts.append(self.details)
        fields = self.Arguments.model_fields
        if fields:
            lines = [f"    {name}: {field.description}" for name, field in fields.items()]
            parts.append("Args:\n" + "\n".join(lines))
        return "\n\n".join(parts) + "\n"

    def markdown_row(self) -> str:
        """This tool's row of the README table."""
        schema = self.Arguments.model_json_schema()
        arguments = [
            _markdown_argument(name, prop, name in schema.get("required", []))
            for name, prop in schema["properties"].items()
            if name != "assignment"
        ]
        result = self.Result.model_json_schema()
        summary = (self.Result.__doc__ or "").strip().splitlines()[0]
        returns = f"`{_markdown_shape(result, result.get('$defs', {}))}` — {summary}"
        return f"| `{self.name}` | {', '.join(arguments) or '—'} | {returns} |"


STORE = ToolSpec(
    "kb_memory_store",
    "Store a durable fact in the memory of the assignment you are working on, for later sessions.",
    StoreArguments,
    StoreResult,
    "Storing the same fact again updates it in place. The assignment comes from your access token. When the fact "
    "replaces earlier ones, pass their ids as `supersedes`; `possibly_supersedes` in the answer suggests them.",
)
RECALL = ToolSpec(
    "kb_memory_recall",
    "Recall facts stored earlier in the memory of the assignment you are working on, best match first.",
    RecallArguments,
    RecallResult,
    "Only this assignment's facts are searched; by default only facts valid now (`as_of` for another time, "
    "`include_superseded` for history).",
)
READ = ToolSpec(
    "kb_memory_read",
    "Read one fact of this assignment in full, with provenance, status and trust.",
    ReadArguments,
    ReadResult,
)
FEEDBACK = ToolSpec(
    "kb_memory_feedback",
    "Confirm a fact that proved right, or flag one that proved wrong; one vote per run and fact.",
    FeedbackArguments,
    FeedbackResult,
)
PROPOSE = ToolSpec(
    "kb_memory_propose",
    "Propose knowledge for this assignment; it is recalled only after a human accepts it.",
    ProposeArguments,
    ProposeResult,
)
FORGET = ToolSpec(
    "kb_memory_forget",
    "Retract a fact of this assignment for good: it is never recalled, read or listed again.",
    ForgetArguments,
    ForgetResult,
)
LIST = ToolSpec(
    "kb_memory_list",
    f"List this assignment's facts, {PAGE_SIZE} per page, oldest first; pass next_cursor back for the next page.",
    ListArguments,
    ListResult,
)
REFLECT = ToolSpec(
    "kb_memory_reflect",
    "Consolidate facts of this assignment that say the same thing (never facts whose values differ) into "
    "observations; reports what changed.",
    ReflectArguments,
    ReflectResult,
)
STATUS = ToolSpec(
    "kb_memory_status",
    "Report the memory's health: database state, your scope's buffered facts, embedder, your scope's size.",
    StatusArguments,
    StatusResult,
    "Counts (pending, rejected, facts) cover only your org and assignment; no connection details are shown.",
)
SCOPES = ToolSpec(
    "kb_memory_scopes",
    "List the assignments your token may use; pass one as `assignment` to the other memory tools.",
    ScopesArguments,
    ScopesResult,
)

#: Every tool, by name, in the README's order.
SPECS: dict[str, ToolSpec[Any, Any]] = {
    spec.name: spec for spec in (STORE, RECALL, READ, FEEDBACK, PROPOSE, FORGET, LIST, REFLECT, STATUS, SCOPES)
}


# -- the README table --------------------------------------------------------------------------------
def markdown_table() -> str:
    """The README's tool table (section "Serve it over MCP"), generated from the specs."""
    header = "| tool | arguments | returns |\n|---|---|---|"
    return "\n".join([header, *(spec.markdown_row() for spec in SPECS.values())])


def _chars(prop: dict[str, Any]) -> str:
    low, high = prop.get("minLength"), prop.get("maxLength")
    if low is not None and low == high:
        return f"{low} chars"
    return f"{low or 0}..{high} chars"


def _markdown_argument(name: str, prop: dict[str, Any], required: bool) -> str:
    """`` `name` (limits, default) `` for the README."""
    options = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
    nullable = len(options) < len(prop.get("anyOf", [prop]))
    inner = options[0] if len(options) == 1 else prop
    notes = []
    if nullable and not required and prop.get("default") is None:
        notes.append("optional")
    if "enum" in inner:
        notes.append("/".join(f"`{value}`" for value in inner["enum"]))
    elif inner.get("type") == "string":
        notes.append(_chars(inner))
    elif inner.get("type") == "integer":
        notes.append(f"{inner.get('minimum')}..{inner.get('maximum')}")
    elif inner.get("type") == "array":
        notes.append(f"≤{inner.get('maxItems')} items of {_chars(inner['items'])}")
    if prop.get("default") is not None:
        default = prop["default"]
        notes.append(f"default `{default}`" if isinstance(default, str) else f"default {default}")
    return f"`{name}` ({', '.join(notes)})" if notes else f"`{name}`"


def _markdown_shape(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    """A result schema's keys, nested objects and lists spelled out; `key?` when a key may be absent."""
    if "$ref" in schema:
        return _markdown_shape(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if schema.get("type") == "array":
        items = _markdown_shape(schema["items"], defs)
        return f"[{items}]" if items else ""
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return "/".join(str(value) for value in schema["enum"])
    properties = schema.get("properties")
    if not properties:
        return ""
    required = set(schema.get("required", []))
    keys = []
    for key, prop in properties.items():
        options = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
        nested = _markdown_shape(options[0], defs) if len(options) == 1 else ""
        name = key if key in required else f"{key}?"
        keys.append(f"{name}: {nested}" if nested else name)
    return "{" + ", ".join(keys) + "}"
