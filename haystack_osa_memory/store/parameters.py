"""Statement parameters sent to PostgreSQL in binary, built in one step instead of one Python call per item.

psycopg dumps a Python list item by item in Python (`psycopg.types.array.ListDumper`), and pgvector's text
form of an embedding takes one float formatting per dimension, which PostgreSQL then parses back. On the
recall path these were among the costliest things the server's Python did per call (benchmarks/README.md,
"Binary parameters"). The two wrappers here are dumped whole:

- `vector_parameter`: an embedding as a binary ``float4[]`` (numpy builds the bytes). The SQL casts it with
  ``::vector``, pgvector's cast from ``real[]``, which checks the values as its text input does (no NaN, no
  infinity, at least one dimension).
- `text_array`: a list of strings (fact and chunk ids) as a binary ``text[]``.

Usage::

    conn.execute("SELECT %(v)s::vector", {"v": vector_parameter([0.5, 0.25])})
    conn.execute("SELECT id FROM t WHERE id = ANY(%s)", (text_array(["a", "b"]),))
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import adapt, postgres, pq
from psycopg.abc import AdaptContext

__all__ = ["TextArray", "VectorParameter", "text_array", "vector_parameter"]

_FLOAT4_OID = postgres.types["float4"].oid
_TEXT_OID = postgres.types["text"].oid
# array_recv's header of a one-dimensional array without NULLs: ndim, has-nulls flag, element type, then
# the dimension's length and lower bound (1).
_HEADER = struct.Struct(">iiIii")
_EMPTY = struct.Struct(">iiI")
# One float4 element: its length (always 4) and the value, both big-endian.
_FLOAT4_ITEM = np.dtype([("length", ">i4"), ("value", ">f4")])


class VectorParameter:
    """An embedding as PostgreSQL's binary ``float4[]`` (build it with `vector_parameter`)."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload


class TextArray:
    """A list of strings as PostgreSQL's binary ``text[]`` (build it with `text_array`)."""

    __slots__ = ("values",)

    def __init__(self, values: tuple[str, ...]) -> None:
        self.values = values


def vector_parameter(embedding: Sequence[float] | npt.NDArray[np.floating] | None) -> VectorParameter | None:
    """``embedding`` as a binary ``float4[]`` parameter, for ``%(name)s::vector`` (``None`` stays ``None``).

    Each value is rounded to the nearest float32, as pgvector stores it; a float32 embedding is sent exactly.
    """
    if embedding is None:
        return None
    values = np.asarray(embedding, dtype=np.float32).reshape(-1)
    items = np.empty(values.shape[0], dtype=_FLOAT4_ITEM)
    items["length"] = 4
    items["value"] = values
    return VectorParameter(_HEADER.pack(1, 0, _FLOAT4_OID, values.shape[0], 1) + items.tobytes())


def text_array(values: Iterable[str]) -> TextArray:
    """``values`` as a binary ``text[]`` parameter (for ``= ANY(%s)`` or ``unnest(%s::text[])``)."""
    return TextArray(tuple(values))


class _VectorParameterDumper(adapt.Dumper):
    format = pq.Format.BINARY
    oid = postgres.types["float4"].array_oid

    def dump(self, obj: VectorParameter) -> bytes:
        return obj.payload


class _TextArrayDumper(adapt.Dumper):
    format = pq.Format.BINARY
    oid = postgres.types["text"].array_oid

    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        # Binary text is read in the connection's client encoding, as psycopg's own text dumper sends it.
        self._encoding = self.connection.info.encoding if self.connection is not None else "utf-8"

    def dump(self, obj: TextArray) -> bytes:
        if not obj.values:
            return _EMPTY.pack(0, 0, _TEXT_OID)
        encoded = [v.encode(self._encoding) for v in obj.values]
        parts = [_HEADER.pack(1, 0, _TEXT_OID, len(encoded), 1)]
        for item in encoded:
            parts.append(len(item).to_bytes(4, "big"))
            parts.append(item)
        return b"".join(parts)


# Global, like psycopg's own dumpers: the classes are this module's own, so no other value changes form.
psycopg.adapters.register_dumper(VectorParameter, _VectorParameterDumper)
psycopg.adapters.register_dumper(TextArray, _TextArrayDumper)
