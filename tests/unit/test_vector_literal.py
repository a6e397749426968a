"""pgvector's text form of an embedding (`haystack_osa_memory.store.facts.vector_literal`)."""

from __future__ import annotations

import numpy as np

from haystack_osa_memory.store.facts import vector_literal


def _parse(literal: str) -> list[float]:
    assert literal.startswith("[")
    assert literal.endswith("]")
    return [float(x) for x in literal[1:-1].split(",")]


def test_float32_arrays_come_back_exactly() -> None:
    rng = np.random.default_rng(3)
    vector = np.concatenate(
        [rng.standard_normal(380), [np.float32(1e-38), np.float32(-3.4e38), np.nextafter(1, 2, dtype=np.float32), 0]]
    ).astype(np.float32)
    assert np.array_equal(np.asarray(_parse(vector_literal(vector) or ""), dtype=np.float32), vector)


def test_lists_and_float64_keep_full_precision() -> None:
    values = [0.1, 1 / 3, -2.5e-300]
    assert _parse(vector_literal(values) or "") == values
    assert _parse(vector_literal(np.asarray(values)) or "") == values
    assert vector_literal(None) is None
