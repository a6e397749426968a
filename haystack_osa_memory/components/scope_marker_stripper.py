from __future__ import annotations

from dataclasses import replace
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict

from haystack_osa_memory.components.fact_document import FactDocument
from haystack_osa_memory.markers import strip_marker


@component
class ScopeMarkerStripper:
    """Removes exactly the leading scope-marker line from each document's content.

    Text that merely looks like a marker further down is left alone (it is data, and scope never
    comes from the bytes anyway). Documents without a marker pass through unchanged.

    Usage example:
    ```python
    from haystack import Document
    from haystack_osa_memory import ScopeMarkerStripper

    docs = [Document(content="<!-- osa-memory:scope asg-1 -->\\nStaging deploys need the VPN")]
    ScopeMarkerStripper().run(documents=docs)["documents"][0].content  # 'Staging deploys need the VPN'
    ```
    """

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScopeMarkerStripper:
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, list[Document]]:
        """
        :param documents: Retrieved documents.
        :returns: `documents` with the leading marker removed.
        """
        out = []
        for doc in documents:
            if doc.content is None:
                out.append(doc)
                continue
            stripped = strip_marker(doc.content)
            if stripped == doc.content:
                out.append(doc)
            elif type(doc) is FactDocument:
                out.append(doc.with_content(stripped))  # as `replace` makes it, without Haystack's field tracking
            else:
                out.append(replace(doc, content=stripped))
        return {"documents": out}
