"""Import and export of facts: JSONL, CSV and folders of Markdown notes.

Export writes JSONL that import reads back losslessly (text, topic, kind, status, expiry); since
document ids are derived from the bytes, re-importing the same facts creates nothing new, which also
makes an interrupted import resumable.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from haystack import Document

from haystack_osa_memory.errors import InvalidInputError
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
    """Counts of an import run."""

    read: int = 0
    stored: int = 0
    skipped_existing: int = 0
    invalid: list[str] = field(default_factory=list)
    redactions: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "stored": self.stored,
            "skipped_existing": self.skipped_existing,
            "invalid": len(self.invalid),
            "invalid_examples": self.invalid[:10],
            "redactions": self.redactions,
        }


def _item(raw: dict[str, Any], origin: str) -> ImportItem:
    text = raw.get("fact", raw.get("content"))
    fact = check_fact(text, redacted=True)  # an export holds redacted facts: placeholders count as sent
    topic = check_topic(raw.get("topic") or None, redacted=True)
    kind = check_choice(raw.get("kind") or "fact", "kind", KINDS)
    status = check_choice(raw.get("status") or "approved", "status", IMPORTABLE_STATUSES)
    expires = raw.get("expires_at")
    if expires is not None and not isinstance(expires, str):
        msg = "expires_at must be an ISO-8601 string"
        raise InvalidInputError(msg)
    since = check_timestamp(raw.get("valid_from") or None, "valid_from")
    until = check_timestamp(raw.get("valid_to") or None, "valid_to")
    check_validity(since, until)
    source_id = check_document_id(raw["document_id"]) if raw.get("document_id") else None
    replaced = check_document_ids(raw.get("supersedes") or None, "supersedes", max_items=SUPERSEDES_MAX)
    return ImportItem(
        fact=fact,
        origin=origin,
        topic=topic,
        kind=kind,
        status=status,
        expires_at=expires,
        valid_from=since.isoformat() if since else None,
        valid_to=until.isoformat() if until else None,
        document_id=source_id,
        supersedes=tuple(replaced),
    )


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
                except InvalidInputError as e:
                    yield origin, str(e)
        return
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                origin = f"{path.name}:{n}"
                try:
                    raw = json.loads(line)
                    if not isinstance(raw, dict):
                        raise InvalidInputError("each line must be a JSON object with a 'fact'")
                    yield _item(raw, origin)
                except (json.JSONDecodeError, InvalidInputError) as e:
                    yield origin, str(e)
        return
    if suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or not {"fact", "content"} & set(reader.fieldnames):
                msg = f"{path.name}: a CSV needs a 'fact' column (optional: topic, kind, status)"
                raise InvalidInputError(msg)
            for n, row in enumerate(reader, start=2):
                origin = f"{path.name}:{n}"
                try:
                    yield _item(dict(row), origin)
                except InvalidInputError as e:
                    yield origin, str(e)
        return
    msg = f"cannot import {path}: use a .jsonl or .csv file, or a folder of .md notes"
    raise InvalidInputError(msg)


def export_line(fact: dict[str, Any]) -> str:
    """One JSONL line of an exported fact (what `read_items` reads back)."""
    keep = (
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
    return json.dumps({k: fact.get(k) for k in keep}, ensure_ascii=False, default=str)


def _write_status(item: ImportItem) -> str:
    """The status an item is written with (`superseded` is given back by its successor)."""
    return "approved" if item.status == SUPERSEDED else item.status


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
) -> ImportReport:
    """Store ``items`` in batches, skipping those already stored (same bytes, same scope).

    Each batch is redacted first by ``redact`` (the store pipeline's own redactor), so the ids checked
    against ``live_ids`` are those of what would be stored; ``write`` then stores the rest by status.
    Idempotent and resumable: running it again stores nothing new.
    """
    report = ImportReport()
    batch: list[ImportItem] = []
    # Exported id -> id in the target scope, across batches (an export lists predecessors first).
    mapped: dict[str, str] = {}

    def flush_batch() -> None:
        redacted, redactions = redact([Document(content=item.fact) for item in batch])
        report.redactions += redactions
        ids = {
            document_id(doc.content or ""): (item, doc.content or "") for item, doc in zip(batch, redacted, strict=True)
        }
        for doc_id, (item, _) in ids.items():
            if item.document_id is not None:
                mapped[item.document_id] = doc_id
        existing = live_ids(list(ids))
        report.skipped_existing += len(existing)
        fresh = [pair for doc_id, pair in ids.items() if doc_id not in existing]
        # A superseded fact is imported as it held (with its valid_to); its successor's `supersedes`
        # supersedes it again, so the chain is rebuilt with the target scope's ids.
        for status in dict.fromkeys(_write_status(item) for item, _ in fresh):
            docs = []
            for item, text in ((i, t) for i, t in fresh if _write_status(i) == status):
                meta: dict[str, Any] = {"kind": item.kind}
                if item.topic is not None:  # kept in metadata and the title: redacted as in `store`
                    meta["topic"], topic_redactions = redact_topic(item.topic)
                    report.redactions += topic_redactions
                if item.expires_at is not None:
                    meta["expires_at"] = item.expires_at
                if item.valid_from is not None:
                    meta["valid_from"] = item.valid_from
                if item.valid_to is not None:
                    meta["valid_to"] = item.valid_to
                replaced = [mapped[i] for i in item.supersedes if i in mapped]
                if replaced:
                    meta["supersedes"] = replaced
                docs.append(Document(content=text, meta=meta))
            written, _ = write(docs, status)
            report.stored += len(written)
        if on_batch is not None:
            on_batch(len(batch))
        batch.clear()

    for item in items:
        report.read += 1
        batch.append(item)
        if len(batch) >= batch_size:
            flush_batch()
    if batch:
        flush_batch()
    return report
