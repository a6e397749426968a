"""`FactDocument`: the Document recall returns, cheap for Haystack's pipeline to deep-copy.

Usage:
```python
from haystack import Document
from haystack_osa_memory.components.fact_document import FactDocument

doc = FactDocument(id="d1", content="Staging deploys need the VPN", meta={"topic": "deploy"})
assert doc == Document(id="d1", content="Staging deploys need the VPN", meta={"topic": "deploy"})
```
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import date, datetime
from typing import Any

from haystack import Document

#: Values a fact's metadata holds that need no copy (immutable).
_IMMUTABLE = (str, int, float, bool, type(None), bytes, datetime, date)


_ATOMS = frozenset(_IMMUTABLE)


def _copy_meta(value: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy(value, memo)`` for a document's metadata: dicts and lists copied, immutable values kept
    (without a call each), anything else through `copy.deepcopy`."""
    # Atoms inside a dict or list are taken as they are without a call each: most of a fact's metadata.
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _ATOMS else _copy_meta(v, memo) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _ATOMS else _copy_meta(v, memo) for v in value]
    if isinstance(value, _IMMUTABLE):
        return value
    return copy.deepcopy(value, memo)


def copied_state(doc: Document, memo: dict[int, Any]) -> dict[str, Any]:
    """``doc``'s fields as ``copy.deepcopy(doc, memo)`` copies them, built directly: immutable values kept, the
    metadata through `_copy_meta`, an embedding of floats as one new list (`copy.deepcopy` makes one call per float),
    anything else through `copy.deepcopy`. Two references to one object inside are not kept as one."""
    state = dict(doc.__dict__)
    for name, value in state.items():
        if type(value) in _ATOMS:  # the id, the text, the score, fields left empty
            continue
        if name == "meta":
            state[name] = _copy_meta(value, memo)
        elif name == "embedding" and type(value) is list and all(type(v) is float for v in value):
            state[name] = list(value)
        else:
            state[name] = copy.deepcopy(value, memo)
    return state


class FactDocument(Document):
    """A `Document` equal to a plain `Document` with the same fields, and cheap to deep-copy.

    Haystack's `Pipeline.run` deep-copies every input of every component; a Document's generic deep copy
    walks its metadata through `copy.deepcopy`, which cost more than ranking the scope's facts. This copy is
    as deep (text and numbers are immutable; dicts and lists are copied), only direct.
    """

    @classmethod
    def of(cls, *, id: str, content: str, meta: dict[str, Any], score: float | None = None) -> FactDocument:
        """The document ``FactDocument(id=id, content=content, meta=meta, score=score)`` makes, built directly:
        Haystack's `Document` constructor tracks every field it sets (for its in-place mutation warning), which
        cost more than the few facts a recall returns are worth. An empty id or content that is not text goes
        through the constructor (which makes the id, or refuses the content)."""
        if not id or type(content) is not str:
            return cls(id=id, content=content, meta=meta, score=score)
        new = object.__new__(cls)
        new.__dict__.update(
            id=id, content=content, blob=None, meta=meta, score=score, embedding=None, sparse_embedding=None
        )
        return new

    def with_content(self, content: str) -> FactDocument:
        """``dataclasses.replace(self, content=content)``, built directly (as `of`); the other fields are shared,
        as `replace` shares them. Content that is not text goes through `replace` (which refuses it)."""
        if type(content) is not str:
            return replace(self, content=content)
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__["content"] = content
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> FactDocument:
        new = object.__new__(type(self))
        new.__dict__.update(copied_state(self, memo))  # not through setattr: Document warns about mutation there
        return new

    def __eq__(self, other: object) -> bool:
        # Compared with a plain Document too: Document's own comparison requires the same type, and Python
        # asks this subclass's first, whichever side it is on.
        return isinstance(other, Document) and self.to_dict(flatten=False) == other.to_dict(flatten=False)
