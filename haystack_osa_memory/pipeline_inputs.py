"""Haystack's copy of each component's inputs, with the same result at a fraction of the cost.

`Pipeline.run` deep-copies every input of every component it runs (``_deepcopy_with_exceptions``). For
each object inside those inputs, however plain, that helper runs two import statements and a runtime
``isinstance`` against Haystack's ``Component`` protocol, which on Python 3.11 walks the protocol's
attributes twice: ~40 us per object, ~1 ms of a recall's ~6 ms in process (benchmarks/README.md,
"Lean serving"). `copy_component_inputs` returns what that helper returns: objects that cannot be a
component (strings, numbers, ``None``, bytes, documents, numpy arrays) and the plain lists and
dicts holding them are copied directly; anything else goes to Haystack's own helper. A plain `Document`
is copied field by field (`copy_document`): ``copy.deepcopy`` walked its embedding float by float.

`use_lean_input_copies` puts it in Haystack's pipeline modules. ``osa-memory serve`` does so in every
process that serves tools; a notebook may call it too. Nothing else changes: the pipelines, their
components and what they receive stay Haystack's.
"""

from __future__ import annotations

import logging
from copy import deepcopy
from typing import Any

import numpy as np
from haystack import Document
from haystack.core.pipeline import utils as _pipeline_utils

from haystack_osa_memory.components.fact_document import FactDocument, copied_state

logger = logging.getLogger(__name__)

#: Immutable atoms: ``copy.deepcopy`` returns them as they are, and none is a component.
_ATOMS = frozenset({str, int, float, bool, type(None), bytes})
#: Types whose instances are never components, tools or toolsets: deep-copied directly.
_COPIED = frozenset({FactDocument, np.ndarray})
#: The modules that call the helper for every component run (they imported it by name).
_CALLERS = ("haystack.core.pipeline.pipeline", "haystack.core.pipeline.base")


def copy_document(doc: Document) -> Document:
    """``copy.deepcopy(doc)`` for a plain `Document`, built directly (`fact_document.copied_state`, as a
    `FactDocument` copies itself): its embedding of floats as one new list, where ``copy.deepcopy`` made one call
    per float (~0.1 ms for 384).

    Usage example:
    ```python
    from haystack import Document
    from haystack_osa_memory.pipeline_inputs import copy_document

    doc = Document(content="VPN first", meta={"tags": ["ops"]}, embedding=[0.5, 0.25])
    assert copy_document(doc) == doc
    ```
    """
    new = object.__new__(Document)
    new.__dict__.update(copied_state(doc, {}))  # as `copy.deepcopy` sets a dataclass's state: not through setattr
    return new


def copy_component_inputs(obj: Any) -> Any:
    """A deep copy of ``obj`` as Haystack's ``_deepcopy_with_exceptions`` makes it (components, tools and
    toolsets inside are kept as they are, an object that cannot be copied is kept and logged).

    Usage example:
    ```python
    from haystack_osa_memory.pipeline_inputs import copy_component_inputs

    inputs = {"query": "vpn", "top_k": 5}
    assert copy_component_inputs(inputs) == inputs
    ```
    """
    kind = type(obj)
    if kind in _ATOMS:
        return obj
    if kind is list:
        return [copy_component_inputs(v) for v in obj]
    if kind is dict:
        return {k: copy_component_inputs(v) for k, v in obj.items()}
    if kind is Document:
        try:
            return copy_document(obj)
        except Exception:  # something inside cannot be copied: Haystack's helper keeps the document and logs it
            return _pipeline_utils._deepcopy_with_exceptions(obj)
    if kind in _COPIED:
        return deepcopy(obj)
    return _pipeline_utils._deepcopy_with_exceptions(obj)


def use_lean_input_copies() -> bool:
    """Let Haystack's pipelines copy component inputs with `copy_component_inputs` (idempotent).

    Returns whether it is in use. Where another library already replaced Haystack's helper, that
    replacement is left alone (and this returns ``False``).

    Usage example:
    ```python
    from haystack_osa_memory import use_lean_input_copies

    use_lean_input_copies()  # then run pipelines as usual
    ```
    """
    import importlib

    original = _pipeline_utils._deepcopy_with_exceptions
    modules = [importlib.import_module(name) for name in _CALLERS]
    found = [getattr(m, "_deepcopy_with_exceptions", None) for m in modules]
    if any(f is not original and f is not copy_component_inputs for f in found):
        logger.info("Haystack's input copy was already replaced elsewhere; left as it is")
        return False
    for module in modules:
        module._deepcopy_with_exceptions = copy_component_inputs  # type: ignore[attr-defined]
    return True
