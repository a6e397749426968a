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


def copy_meta(value: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy(value, memo)`` for a document's metadata: dicts and lists copied, immutable values kept
    (without a call each), anything else through `copy.deepcopy`."""
    # Atoms inside a dict or list are taken as they are without a call each: most of a fact's metadata.
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _ATOMS else copy_meta(v, memo) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _ATOMS else copy_meta(v, memo) for v in value]
    if isinstance(value, _IMMUTABLE):
        return value
    return copy.deepcopy(value, memo)


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
        state = dict(self.__dict__)
        state["meta"] = copy_meta(self.meta, memo)
        if self.embedding is not None:
            state["embedding"] = list(self.embedding)
        if self.blob is not None or self.sparse_embedding is not None:
            state["blob"] = copy.deepcopy(self.blob, memo)
            state["sparse_embedding"] = copy.deepcopy(self.sparse_embedding, memo)
        new.__dict__.update(state)  # not through setattr: Document warns about mutation there
        return new

    def __eq__(self, other: object) -> bool:
        # Compared with a plain Document too: Document's own comparison requires the same type, and Python
        # asks this subclass's first, whichever side it is on.
        return isinstance(other, Document) and self.to_dict(flatten=False) == other.to_dict(flatten=False)
