"""Import and export of facts: JSONL, CSV and folders of Markdown notes.

Export writes JSONL that import reads back losslessly (text, topic, kind, status, expiry, validity and
supersessions); since document ids are derived from the bytes, re-importing the same facts creates nothing
new, which also makes an interrupted import resumable.

Import is an operator's action: each line is checked with the tools' limits (every field, typed), free
text is redacted as `kb_memory_store` redacts it, a bad line is reported by its number while the others are
imported, and statuses are restored as the file gives them (a backup's proposed facts stay proposed).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from haystack import Document

from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.privacy.redaction import redact
from haystack_osa_memory.tools import LISTABLE_STATUSES, SUPERSEDED, SUPERSEDES_MAX
from haystack_osa_memory.validation import (
    FACT_MAX,
    KINDS,
    TOPIC_MAX,
    check_choice,
    check_document_id,
    check_document_ids,
    check_fact,
    check_timestamp,
    check_topic,
    check_validity,
)

IMPORTABLE_STATUSES = LISTABLE_STATUSES
#: What `export_line` writes, in this order.
EXPORT_FIELDS: tuple[str, ...] = (
    "fact",
    "topic",
    "kind",
    "status",
    "expires_at",
    "document_id",
    "created_at",
    "valid_from",
    "valid_to",
    "supersedes",
)
#: The fields a line may have (what `export_line` writes; `content` is another name for `fact`).
IMPORT_FIELDS: tuple[str, ...] = (EXPORT_FIELDS[0], "content", *EXPORT_FIELDS[1:])
#: The longest fact and topic an import stores, placeholders included. An exported fact is redacted, and a
#: placeholder counts as the one character it at least replaced (so a fact stored at the limit reads back);
#: text made of placeholder look-alikes would otherwise pass at any length. Redaction lengthens a fact at
#: most ~2.6 times (``10.0.0.1,`` -> ``[REDACTED-PRIVATE-IP],``): four times the limit is room enough.
STORED_FACT_MAX = 4 * FACT_MAX
STORED_TOPIC_MAX = 4 * TOPIC_MAX
#: An import refreshes the planner's statistics once it has stored this many facts, then each time the
#: count doubles, and at its end (`import_facts`'s ``analyze``).
ANALYZE_FIRST_AFTER = 1000
#: Exceptions a malformed line can raise while it is parsed and checked (reported with its line number).
_LINE_ERRORS = (InvalidInputError, ValueError, TypeError, OverflowError, RecursionError)


@dataclass(frozen=True)
class ImportItem:
    """One fact to import, with where it came from (for error messages)."""

    fact: str
    origin: str
    topic: str | None = None
    kind: str = "fact"
    status: str = "approved"
    expires_at: str | None = None
    valid_from: str | None = None
    valid_to: str | None = None
    #: The fact's id where it was exported, and the ids (there) of the facts it superseded: import maps
    #: them to the ids in the target scope, so that chains survive a move between assignments.
    document_id: str | None = None
    supersedes: tuple[str, ...] = ()


@dataclass
class ImportReport:
    """Counts of an import run: ``invalid`` and ``never_recalled`` hold ``"origin: reason"`` lines (redacted)."""

    read: int = 0
    stored: int = 0
    skipped_existing: int = 0
    invalid: list[str] = field(default_factory=list)
    redactions: int = 0
    #: Facts stored that no recall will return (valid until a time in the past, from the import on).
    never_recalled: list[str] = field(default_factory=list)
    #: Whether the planner's statistics were refreshed after the facts were written.
    analyzed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "stored": self.stored,
            "skipped_existing": self.skipped_existing,
            "invalid": len(self.invalid),
            "invalid_examples": self.invalid[:10],
            "redactions": self.redactions,
            "never_recalled": len(self.never_recalled),
            "never_recalled_examples": self.never_recalled[:10],
            "analyzed": self.analyzed,
        }


def safe_reason(reason: str) -> str:
    """An error message about a line, redacted: messages may quote the value they refuse."""
    return redact(reason).text


def _optional(raw: dict[str, Any], key: str) -> Any:
    """A field's value; absent, null and empty (an empty CSV cell) are all ``None``."""
    value = raw.get(key)
    return None if value is None or value == "" else value


def _stored_length(text: str, what: str, limit: int) -> str:
    if len(text) > limit:
        msg = f"{what} must be at most {limit} characters as stored (redaction placeholders included), got {len(text)}"
        raise InvalidInputError(msg)
    return text


def _item(raw: dict[str, Any], origin: str) -> ImportItem:
    """One line checked as the tools check their arguments: every field typed, within the same limits."""
    unknown = sorted(str(k) for k in raw if k not in IMPORT_FIELDS)
    if unknown:
        msg = f"unknown field(s) {unknown[:5]}; a line may have {list(IMPORT_FIELDS)}"
        raise InvalidInputError(msg)
    text = raw["fact"] if _optional(raw, "fact") is not None else raw.get("content")
    # An export holds redacted facts: a placeholder counts as the character it replaced, and the stored
    # length is capped on its own.
    fact = _stored_length(check_fact(text, redacted=True), "fact", STORED_FACT_MAX)
    topic = check_topic(_optional(raw, "topic"), redacted=True)
    if topic is not None:
        _stored_length(topic, "topic", STORED_TOPIC_MAX)
    kind = check_choice(_optional(raw, "kind") or "fact", "kind", KINDS)
    status = check_choice(_optional(raw, "status") or "approved", "status", IMPORTABLE_STATUSES)
    expires = check_timestamp(_optional(raw, "expires_at"), "expires_at")
    check_timestamp(_optional(raw, "created_at"), "created_at")  # exported for people; the import time is kept
    since = check_timestamp(_optional(raw, "valid_from"), "valid_from")
    until = check_timestamp(_optional(raw, "valid_to"), "valid_to")
    check_validity(since, until)
    source = _optional(raw, "document_id")
    source_id = check_document_id(source) if source is not None else None
    replaced = check_document_ids(_optional(raw, "supersedes"), "supersedes", max_items=SUPERSEDES_MAX)
    if source_id is not None and source_id in replaced:
        msg = f"fact {source_id} supersedes itself: a fact cannot supersede itself"
        raise InvalidInputError(msg)
    return ImportItem(
        fact=fact,
        origin=origin,
        topic=topic,
        kind=kind,
        status=status,
        expires_at=expires.isoformat() if expires else None,
        valid_from=since.isoformat() if since else None,
        valid_to=until.isoformat() if until else None,
        document_id=source_id,
        supersedes=tuple(replaced),
    )


def _fields(item: ImportItem) -> dict[str, Any]:
    """An item's fields as a line holds them (for `_item`)."""
    return {
        "fact": item.fact,
        "topic": item.topic,
        "kind": item.kind,
        "status": item.status,
        "expires_at": item.expires_at,
        "valid_from": item.valid_from,
        "valid_to": item.valid_to,
        "document_id": item.document_id,
        "supersedes": list(item.supersedes) or None,
    }


def _markdown_facts(path: Path) -> Iterator[str]:
    """Paragraphs of a note, joined up to the fact size limit."""
    current = ""
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        block = block.strip()
        if not block:
            continue
        while len(block) > FACT_MAX:
            cut = block.rfind(" ", 0, FACT_MAX)
            cut = cut if cut > 0 else FACT_MAX
            if current:
                yield current
                current = ""
            yield block[:cut].strip()
            block = block[cut:].strip()
        if current and len(current) + 2 + len(block) > FACT_MAX:
            yield current
            current = ""
        current = f"{current}\n\n{block}" if current else block
    if current:
        yield current


def read_items(path: Path) -> Iterator[ImportItem | tuple[str, str]]:
    """Items of a JSONL or CSV file or a folder of Markdown notes; invalid rows as (origin, reason)."""
    if path.is_dir():
        for note in sorted(path.rglob("*.md")):
            topic = note.stem[:TOPIC_MAX]
            for i, text in enumerate(_markdown_facts(note), start=1):
                origin = f"{note.relative_to(path)}#{i}"
                try:
                    yield _item({"fact": text, "topic": topic}, origin)
                except _LINE_ERRORS as e:
                    yield origin, safe_reason(str(e))
        return
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        # Bytes that are not UTF-8 become lone surrogates, which the checks refuse line by line.
        with path.open(encoding="utf-8", errors="surrogateescape") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                origin = f"{path.name}:{n}"
                try:
                    raw = json.loads(line)
                    if not isinstance(raw, dict):
                        raise InvalidInputError("each line must be a JSON object with a 'fact'")
                    yield _item(raw, origin)
                except _LINE_ERRORS as e:  # JSONDecodeError is a ValueError
                    yield origin, safe_reason(str(e) or type(e).__name__)
        return
    if suffix == ".csv":
        with path.open(encoding="utf-8", errors="surrogateescape", newline="") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or not {"fact", "content"} & set(reader.fieldnames):
                msg = f"{path.name}: a CSV needs a 'fact' column (optional: topic, kind, status)"
                raise InvalidInputError(msg)
            n = 1
            while True:
                n += 1
                origin = f"{path.name}:{n}"
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as e:  # a cell past the csv module's size limit, a NUL byte
                    yield origin, safe_reason(str(e))
                    continue
                try:
                    # Cells past the header's columns come under the key None: an unknown field too.
                    yield _item({k if k is not None else "(unnamed)": v for k, v in row.items()}, origin)
                except _LINE_ERRORS as e:
                    yield origin, safe_reason(str(e))
        return
    msg = f"cannot import {path}: use a .jsonl or .csv file, or a folder of .md notes"
    raise InvalidInputError(msg)


def export_line(fact: dict[str, Any]) -> str:
    """One JSONL line of an exported fact (what `read_items` reads back)."""
    return json.dumps({k: fact.get(k) for k in EXPORT_FIELDS}, ensure_ascii=False, default=str)


def _write_status(item: ImportItem) -> str:
    """The status an item is written with (`superseded` is given back by its successor)."""
    return "approved" if item.status == SUPERSEDED else item.status


def never_recalled(item: ImportItem, now: datetime) -> str | None:
    """Why recall would never return ``item``, or None: valid until a time already past and no valid_from, so
    it would hold from the import on, after its end (the tools refuse such a fact; a backup may hold one)."""
    if item.status == SUPERSEDED or item.valid_to is None or item.valid_from is not None:
        return None
    if datetime.fromisoformat(item.valid_to) > now:
        return None
    return f"valid_to {item.valid_to} is in the past and it has no valid_from: recall will never return it"


def supersession_order(items: Sequence[ImportItem]) -> tuple[list[ImportItem], list[tuple[str, str]]]:
    """``items`` with every fact after the facts of the file it supersedes (otherwise in file order), and the
    items refused because their supersessions form a loop, as (origin, reason)."""
    by_source = {item.document_id: n for n, item in enumerate(items) if item.document_id is not None}
    state = [0] * len(items)  # 0 unseen, 1 being placed, 2 placed, 3 refused
    ordered: list[ImportItem] = []
    refused: list[tuple[str, str]] = []
    for first in range(len(items)):
        if state[first]:
            continue
        # Depth first over predecessors, without recursion (a chain may be long).
        stack = [(first, iter(items[first].supersedes))]
        state[first] = 1
        while stack:
            n, pending = stack[-1]
            nxt = next((by_source[i] for i in pending if i in by_source and by_source[i] != n), None)
            if nxt is None:
                stack.pop()
                if state[n] == 1:
                    state[n] = 2
                    ordered.append(items[n])
            elif state[nxt] == 1:
                for m, _ in stack:  # the loop's members: none can be placed before the others
                    state[m] = 3
                stack.clear()
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(items[nxt].supersedes)))
    for n, item in enumerate(items):
        if state[n] != 2:
            refused.append((item.origin, "its supersessions form a loop with other lines of the file"))
    return ordered, refused


def import_facts(
    items: Iterable[ImportItem],
    *,
    redact: Callable[[list[Document]], tuple[list[Document], int]],
    redact_topic: Callable[[str], tuple[str | None, int]],
    document_id: Callable[[str], str],
    live_ids: Callable[[list[str]], set[str]],
    write: Callable[[list[Document], str], tuple[list[str], int]],
    batch_size: int = 64,
    on_batch: Callable[[int], None] | None = None,
    analyze: Callable[[], bool] | None = None,
) -> ImportReport:
    """Store ``items`` in batches, skipping those already stored (same bytes, same scope).

    Each batch is redacted first by ``redact`` (the store pipeline's own redactor), so the ids checked
    against ``live_ids`` are those of what would be stored; ``write`` then stores the rest by status. A fact
    that supersedes others of the file is written after them (`supersession_order`), in a later write than
    those of its batch. A write the tools refuse (`InvalidInputError`) is retried fact by fact and the refused
    facts are reported with their origin; the others are stored. ``analyze`` (refreshing the planner's
    statistics) runs once `ANALYZE_FIRST_AFTER` facts are stored, each time the count doubles, and at the end.
    Idempotent and resumable: running it again stores nothing new.
    """
    report = ImportReport()
    # Items made in Python (not read by `read_items`) are checked the same way: the API is a door too.
    checked: list[ImportItem] = []
    for given in items:
        try:
            checked.append(_item(_fields(given), given.origin))
        except _LINE_ERRORS as e:
            report.read += 1
            report.invalid.append(f"{safe_reason(str(given.origin))}: {safe_reason(str(e))}")
    ordered, looped = supersession_order(checked)
    report.invalid.extend(f"{origin}: {reason}" for origin, reason in looped)
    report.read += len(looped)
    batch: list[ImportItem] = []
    # Exported id -> id in the target scope, across batches (predecessors are written first).
    mapped: dict[str, str] = {}
    now = datetime.now(UTC)
    analyze_at = ANALYZE_FIRST_AFTER

    def prepared(item: ImportItem, text: str) -> Document:
        meta: dict[str, Any] = {"kind": item.kind}
        if item.topic is not None:  # kept in metadata and the title: redacted as in `store`
            meta["topic"], topic_redactions = redact_topic(item.topic)
            report.redactions += topic_redactions
        for key in ("expires_at", "valid_from", "valid_to"):
            if getattr(item, key) is not None:
                meta[key] = getattr(item, key)
        replaced = [mapped[i] for i in item.supersedes if i in mapped]
        if replaced:
            meta["supersedes"] = replaced
        return Document(content=text, meta=meta)

    def store(group: list[tuple[ImportItem, str, str]], status: str) -> None:
        """Write one group; refused as a whole, fact by fact, reporting the refused ones."""
        try:
            written, _ = write([prepared(item, text) for item, text, _ in group], status)
        except InvalidInputError as e:
            if len(group) == 1:
                report.invalid.append(f"{group[0][0].origin}: {safe_reason(str(e))}")
                return
            for one in group:
                store([one], status)
            return
        report.stored += len(written)
        for item, _, doc_id in group:
            if item.document_id is not None:
                mapped[item.document_id] = doc_id
            reason = never_recalled(item, now)
            if reason is not None:
                report.never_recalled.append(f"{item.origin}: {reason}")

    def flush_batch() -> None:
        nonlocal analyze_at
        redacted, redactions = redact([Document(content=item.fact) for item in batch])
        report.redactions += redactions
        ids = {
            document_id(doc.content or ""): (item, doc.content or "") for item, doc in zip(batch, redacted, strict=True)
        }
        existing = live_ids(list(ids))
        report.skipped_existing += len(existing)
        for doc_id in existing:
            item = ids[doc_id][0]
            if item.document_id is not None:
                mapped[item.document_id] = doc_id
        # A fact goes in a later write than the facts of its batch it supersedes (`depth`), so that each
        # predecessor exists, and holds from earlier, when its successor is written.
        depth: dict[str, int] = {}
        fresh: list[tuple[int, ImportItem, str, str]] = []
        in_batch = {item.document_id: doc_id for doc_id, (item, _) in ids.items() if item.document_id is not None}
        for doc_id, (item, text) in ids.items():
            if doc_id in existing:
                continue
            level = 1 + max((depth.get(in_batch[i], -1) for i in item.supersedes if i in in_batch), default=-1)
            depth[doc_id] = level
            fresh.append((level, item, text, doc_id))
        # A superseded fact is imported as it held (with its valid_to); its successor's `supersedes`
        # supersedes it again, so the chain is rebuilt with the target scope's ids.
        for level in sorted({f[0] for f in fresh}):
            wave = [(item, text, doc_id) for lv, item, text, doc_id in fresh if lv == level]
            for status in dict.fromkeys(_write_status(item) for item, _, _ in wave):
                store([w for w in wave if _write_status(w[0]) == status], status)
        if on_batch is not None:
            on_batch(len(batch))
        batch.clear()
        if analyze is not None and report.stored >= analyze_at:
            report.analyzed = analyze()
            analyze_at = 2 * report.stored

    for item in ordered:
        report.read += 1
        batch.append(item)
        if len(batch) >= batch_size:
            flush_batch()
    if batch:
        flush_batch()
    if analyze is not None and report.stored:
        report.analyzed = analyze()
    return report
