"""LLM-free test of whether one fact restates another with a changed value.

Two facts are a *probable succession* when they say nearly the same thing about the same subject
(their content words overlap strongly) but differ in a **value**: a token with a digit (``8443``,
``2026-03-01``, ``v2``), an identifier (``stg-eu2``, ``api.example.com``, ``snake_case``), or a name
(a capitalised word inside a sentence, ``PagerDuty``, ``AWS``).

Usage:
```python
from haystack_osa_memory.supersession import probable_succession

probable_succession("Staging uses the VPN profile stg-eu", "Staging now uses the VPN profile stg-eu2")  # True
probable_succession("Staging uses the VPN profile stg-eu", "Staging deploys need a change ticket")     # False
```

`kb_memory_store` offers such facts as ``possibly_supersedes`` (the agent confirms), and recall ranks
the one valid from later first among such pairs and flags them (``conflicts_with``). It is a heuristic:
two subjects described with one template (``The billing service listens on 8080`` / ``The search
service listens on 9200``) look alike to it, which is why store only suggests, and recall reorders a
pair only when both match the query about equally well.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Final

#: Least `similarity` (shared words over all, weighed) of two facts for a probable succession.
SIMILARITY_MIN: Final = 0.5
#: A query word names the subject when it weighs at least this share of the query's heaviest word.
SUBJECT_SHARE: Final = 0.75

_TOKEN = re.compile(r"[\w](?:[\w\-./:@+#]*[\w])?")
_SENTENCE_END = re.compile(r"[.!?:;]\s*$")
_IDENTIFIER_MARKS = frozenset("-./:@_+#")
# Words that carry no subject: function words and the ones a restatement adds ("now", "changed to").
_STOP_WORDS = """a an the and or but if then else of for to from in on at by with as into onto over under about via
per is are was were be been being am has have had having do does did will would shall should can
could may might must it its it's this that these those there here their our your my his her we you
they he she i me us them not no yes so too very also just only still yet again already anymore
longer instead since until now currently current today new newer latest recent recently changed
change changes changing moved move moves moving switched switch switches updated update updates set
sets became become becomes replaced replace replaces what which who whom whose when where why how
use uses used using"""
_STOP: Final = frozenset(_STOP_WORDS.split())


@dataclass(frozen=True)
class FactWords:
    """A fact's content words (lower-case, lightly stemmed), values (case-folded), and the capitalised
    words that open a sentence (``Alice is on call``: a name or just a capital; counted as content words,
    and as a changed value when the other fact lacks them)."""

    content: frozenset[str]
    values: frozenset[str]
    openers: frozenset[str] = frozenset()

    @cached_property
    def tokens(self) -> frozenset[str]:
        """Content words and values together (worked out once: `fact_words` hands out one instance per text,
        and a recall's conflict check asks for them a few hundred times)."""
        return self.content | self.values


@lru_cache(maxsize=16384)
def _stem(word: str) -> str:
    """A light stemmer: enough for ``profiles``/``profile`` and ``deployed``/``deploy``."""
    if word.endswith("'s"):
        word = word[:-2]
    for suffix, keep in (("ies", 4), ("ing", 5), ("ed", 4), ("es", 4), ("s", 3)):
        if word.endswith(suffix) and len(word) > keep:
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def _is_value(token: str, sentence_start: bool) -> bool:
    # Each test first asks str's own (C) predicates: most tokens are plain lower-case words, and the
    # character loops cost most of a recall's conflict check.
    if not token.isalpha():  # letters only: no digit, no identifier mark
        if any(ch.isdigit() for ch in token):
            return True
        if any(ch in _IDENTIFIER_MARKS for ch in token[1:-1]):
            return True
    rest = token[1:]
    if rest and not rest.islower() and any(ch.isupper() for ch in rest):
        return True  # CamelCase or ALL CAPS: a product, team or acronym
    return token[0].isupper() and not sentence_start


@lru_cache(maxsize=4096)
def fact_words(text: str) -> FactWords:
    """Split ``text`` into content words and values (see the module docstring)."""
    content: set[str] = set()
    values: set[str] = set()
    openers: set[str] = set()
    tokens = [(m.group(0), m.start(), m.end()) for m in _TOKEN.finditer(text)]
    previous_end = 0
    last = len(tokens) - 1
    for n, (token, start, end) in enumerate(tokens):
        if n == 0:
            sentence_start = True
        elif start == previous_end + 1 and text[previous_end] == " ":
            sentence_start = False  # one space since the last token (the common case): no sentence end
        else:
            sentence_start = bool(_SENTENCE_END.search(text[previous_end:start]))
        previous_end = end
        # A capitalised opener followed by another capitalised word is a name ("Maria Novak is on call").
        named = (
            sentence_start
            and n < last
            and token.istitle()
            and tokens[n + 1][0].istitle()
            and token.casefold() not in _STOP
        )
        if named or _is_value(token, sentence_start):
            value = token.casefold().rstrip(".")
            values.add(value[:-2] if value.endswith(("'s", "\u2019s")) else value)
            continue
        word = token.casefold()
        if word in _STOP or len(word) < 2:
            continue
        content.add(_stem(word))
        if token[0].isupper():
            openers.add(_stem(word))
    return FactWords(frozenset(content), frozenset(values), frozenset(openers))


class _Known(dict[str, float]):
    """Words' weights among ``n`` facts whose words' document frequencies are ``df``, each worked out the first
    time it is looked up. It holds those two, not the `Weights` it serves: no reference cycle for the collector
    to find in every recall's and store's weights."""

    def __init__(self, n: int, df: Counter[str]) -> None:
        super().__init__()
        self.n = n
        self.df = df

    def __missing__(self, word: str) -> float:
        weight = self[word] = math.log(1 + max(self.n, 2) / max(self.df.get(word, 0), 1))
        return weight


class Weights:
    """How much a word says about a fact's subject among some facts (a recall's or a search's results):
    ``log(1 + n / df)``, so that the words a template repeats across subjects ("port", "cluster") weigh
    little and a subject's own words ("billing", "swift") weigh much. Read-only once built: each word's
    weight is remembered the first time it is asked for."""

    def __init__(self, texts: Iterable[str]) -> None:
        self.df: Counter[str] = Counter()
        self.n = 0
        for text in texts:
            self.df.update(fact_words(text).tokens)
            self.n += 1
        # Each word's weight worked out once: a store's search asks for ~200 weights of a few dozen words,
        # through a dict lookup (`lookup`) rather than a method call each.
        self.lookup: Callable[[str], float] = _Known(self.n, self.df).__getitem__

    def __call__(self, word: str) -> float:
        return self.lookup(word)


def similarity(
    a: FactWords,
    b: FactWords,
    weight: Callable[[str], float] | None = None,
    *,
    ignore: frozenset[str] = frozenset(),
) -> float:
    """How much two facts share, from 0 to 1: the weight of the words and values they share over the weight
    of their content words and shared values (values that differ do not count against them: a succession
    changes a value). Unweighted without ``weight``; the words in ``ignore`` do not count."""
    shared = (a.tokens & b.tokens) - ignore
    counted = (a.content | b.content | shared) - ignore
    if weight is None:
        total: float = len(counted)
        part: float = len(shared)
    else:
        w = weight.lookup if isinstance(weight, Weights) else weight
        total, part = sum(map(w, counted)), sum(map(w, shared))
    if not total:
        return 1.0 if ignore else 0.0  # nothing beyond what is ignored: they say the same of it
    return part / total


def probable_succession(
    old: str,
    new: str,
    *,
    similarity_min: float = SIMILARITY_MIN,
    weights: Callable[[str], float] | None = None,
) -> bool:
    """True when ``new`` probably restates ``old`` with a changed value (see the module docstring).

    :param weights: word weights among the facts compared (`Weights`); by default those of the two facts.
    """
    if " ".join(old.split()).casefold() == " ".join(new.split()).casefold():
        return False
    a, b = fact_words(old), fact_words(new)
    return value_changed(a, b) and similarity(a, b, weights or Weights((old, new))) >= similarity_min


def value_changed(a: FactWords, b: FactWords) -> bool:
    """The two facts differ in a value (or in the capitalised word that opens a sentence)."""
    return a.values != b.values or bool(a.openers - b.content) or bool(b.openers - a.content)


def subject_words(query: str, weights: Weights, texts: Iterable[str]) -> frozenset[str]:
    """The words of ``query`` that name what it asks about: of its words found in ``texts``, those that
    weigh at least `SUBJECT_SHARE` of the heaviest (the rarest among those facts: "billing" in
    "which port does the billing service listen on?"). Empty when no word of the query is found."""
    asked = fact_words(query).tokens
    found: set[str] = set()
    for text in texts:
        found |= asked & fact_words(text).tokens
    if not found:
        return frozenset()
    top = max(weights(t) for t in found)
    return frozenset(t for t in found if weights(t) >= SUBJECT_SHARE * top)
