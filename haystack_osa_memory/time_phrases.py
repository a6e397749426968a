"""The period a question names, in plain English, LLM-free: "last week", "in March", "since 2026-03-01".

Recall ranks the facts whose validity began in that period first among close matches
(`ScopedMemoryRetriever`), so "what did we decide last week?" prefers last week's decisions.

Usage:
```python
from datetime import UTC, datetime
from haystack_osa_memory.time_phrases import period_of

now = datetime(2026, 3, 18, 12, tzinfo=UTC)
period_of("what did we decide last week?", now)   # Period(start=2026-03-09, end=2026-03-16)
period_of("which region before March 2026?", now) # Period(start=None, end=2026-03-01)
period_of("which region is the cluster in?", now) # None
```

Recognised: ``today``, ``yesterday``, ``this``/``last`` ``week``/``month``/``year``, ``N days|weeks|months
ago``, a month name with or without a year (without one: its latest occurrence up to now), a year
(``in 2025``), an ISO date; preceded by ``before``/``until`` (everything up to it) or ``after``/``since``
(everything from it). Weeks start on Monday; times are UTC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

_MONTHS: tuple[str, ...] = ("january", "february", "march", "april", "may", "june")
_MONTHS += ("july", "august", "september", "october", "november", "december")
_MONTH = "|".join([*_MONTHS, *(m[:3] for m in _MONTHS if m != "may")])
_PHRASE = re.compile(
    r"\b(?:(?P<mod>before|until|after|since)\s+)?(?:the\s+)?"
    r"(?:(?P<iso>\d{4}-\d{2}-\d{2})"
    r"|(?P<relative>today|yesterday|(?:this|last|past)\s+(?:week|month|year))"
    r"|(?P<ago>\d{1,3})\s+(?P<unit>day|week|month)s?\s+ago"
    r"|(?P<month>" + _MONTH + r")\.?(?:\s+(?P<month_year>\d{4}))?"
    r"|(?:in\s+)(?P<year>(?:19|20)\d{2}))\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Period:
    """From ``start`` (inclusive) to ``end`` (exclusive); ``None`` is open."""

    start: datetime | None
    end: datetime | None

    def holds(self, moment: datetime) -> bool:
        """Whether ``moment`` lies in the period."""
        return (self.start is None or moment >= self.start) and (self.end is None or moment < self.end)


def _day(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def _month_start(year: int, month: int) -> datetime:
    return datetime(year + (month - 1) // 12, (month - 1) % 12 + 1, 1, tzinfo=UTC)


def _span(match: re.Match[str], now: datetime) -> tuple[datetime, datetime] | None:
    today = now.astimezone(UTC).date()
    if match["iso"]:
        try:
            day = date.fromisoformat(match["iso"])
        except ValueError:
            return None
        return _day(day), _day(day) + timedelta(days=1)
    if match["relative"]:
        words = match["relative"].lower().split()
        if words == ["today"]:
            return _day(today), _day(today) + timedelta(days=1)
        if words == ["yesterday"]:
            return _day(today) - timedelta(days=1), _day(today)
        back = 1 if words[0] in ("last", "past") else 0
        if words[1] == "week":
            monday = _day(today) - timedelta(days=today.weekday())
            start = monday - timedelta(weeks=back)
            return start, start + timedelta(weeks=1)
        if words[1] == "month":
            start = _month_start(today.year, today.month - back)
            return start, _month_start(start.year, start.month + 1)
        return datetime(today.year - back, 1, 1, tzinfo=UTC), datetime(today.year - back + 1, 1, 1, tzinfo=UTC)
    if match["ago"]:
        n, unit = int(match["ago"]), match["unit"].lower()
        if unit == "day":
            day = _day(today) - timedelta(days=n)
            return day, day + timedelta(days=1)
        if unit == "week":
            monday = _day(today) - timedelta(days=today.weekday()) - timedelta(weeks=n)
            return monday, monday + timedelta(weeks=1)
        start = _month_start(today.year, today.month - n)
        return start, _month_start(start.year, start.month + 1)
    if match["month"]:
        name = match["month"].lower()
        number = next(i for i, m in enumerate(_MONTHS, start=1) if m.startswith(name[:3]))
        year = int(match["month_year"]) if match["month_year"] else today.year
        if not match["month_year"] and number > today.month:
            year -= 1  # "in March", asked in January: last year's March
        start = _month_start(year, number)
        return start, _month_start(year, number + 1)
    if match["year"]:
        year = int(match["year"])
        return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)
    return None


def period_of(text: str, now: datetime) -> Period | None:
    """The period the first time phrase of ``text`` names, relative to ``now``; ``None`` without one."""
    for match in _PHRASE.finditer(text):
        if (
            match["month"]
            and match["month"].lower() in ("may", "mar", "jun", "jan", "dec")
            and not (match["month_year"] or match["mod"] or _PRECEDED_BY_IN.search(text[: match.start()]))
        ):
            continue  # "may" the verb, "mar" and friends as words: a month only with a year or "in"/"before"
        try:
            span = _span(match, now)
        except (ValueError, OverflowError):
            span = None  # a date the calendar cannot hold ("March 0000", "9999-12-31" plus a day): no period
        if span is None:
            continue
        start, end = span
        mod = (match["mod"] or "").lower()
        if mod in ("before", "until"):
            return Period(None, start)
        if mod in ("after", "since"):
            return Period(start if mod == "since" else end, None)
        return Period(start, end)
    return None


_PRECEDED_BY_IN = re.compile(r"\b(?:in|of|during)\s+(?:the\s+)?$", re.IGNORECASE)
