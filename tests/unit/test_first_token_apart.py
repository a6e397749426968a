"""`onnx_runtime.first_token_apart`: the graph surgery behind the `int8-cls` precision, on a graph of its own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from haystack_osa_memory.components import onnx_runtime

pytestmark = pytest.mark.embeddings

FEATURES, OUT = 8, 5


def _model() -> Any:
    """``y = (x @ w) @ (x @ w)^T``-like: two products by weights, and one product of two activations."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w1 = numpy_helper.from_array(rng.normal(size=(FEATURES, OUT)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(OUT, FEATURES)).astype(np.float32), "w2")
    perm = helper.make_node("Transpose", ["h2"], ["h2t"], perm=[0, 2, 1])
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="/layer/first/MatMul"),
        helper.make_node("MatMul", ["h1", "w2"], ["h2"], name="/layer/second/MatMul"),
        perm,
        helper.make_node("MatMul", ["h2", "h2t"], ["y"], name="/layer/scores/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "apart",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["texts", "tokens", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["texts", "tokens", "tokens"])],
        [w1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx_runtime.OPSET)])


def _run(model: Any, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out: np.ndarray = session.run(None, {"x": x})[0]
    return out


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (2, 7), (3, 16)])
def test_the_split_graph_computes_the_same(shape: tuple[int, int]) -> None:
    import onnx

    model = _model()
    x = np.random.default_rng(shape[1]).normal(size=(*shape, FEATURES)).astype(np.float32)
    want = _run(model, x)
    split = onnx.ModelProto()
    split.CopyFrom(model)
    assert onnx_runtime.first_token_apart(split) == 2
    onnx.checker.check_model(split)
    got = _run(split, x)
    assert got.shape == want.shape
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_product_of_one_row_per_text_is_left_whole() -> None:
    """A pooler's product (one row per text, no tokens) has nothing to split: its second axis is features."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((FEATURES, OUT), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="/pooler/dense/MatMul")],
        "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["texts", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["texts", OUT])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx_runtime.OPSET)])
    assert onnx_runtime.first_token_apart(model) == 0
    assert [n.name for n in model.graph.node] == ["/pooler/dense/MatMul"]


def test_only_products_by_a_weight_are_split_each_in_two_parts_on_one_weight() -> None:
    model = _model()
    onnx_runtime.first_token_apart(model)
    products = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert [n.name for n in products] == [
        "/layer/first/first_token/MatMul",
        "/layer/first/other_tokens/MatMul",
        "/layer/second/first_token/MatMul",
        "/layer/second/other_tokens/MatMul",
        "/layer/scores/MatMul",
    ]
    assert [n.input[1] for n in products[:4]] == ["w1", "w1", "w2", "w2"]
    assert [n.op_type for n in model.graph.node].count("Concat") == 2


def test_quantized_the_first_token_keeps_its_own_scale() -> None:
    """The point of the split: a first token far larger than the others no longer sets their int8 step."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 12, FEATURES)).astype(np.float32)
    x[0, 0] *= 40.0  # the first token's outliers, as BERT's [CLS] has them
    want = _run(_model(), x)
    errors = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way in ("whole", "apart"):
            model = _model()
            if way == "apart":
                onnx_runtime.first_token_apart(model)
            source, target = Path(tmp) / f"{way}.onnx", Path(tmp) / f"{way}.int8.onnx"
            onnx.save(model, str(source))
            quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=True)
            got = _run(onnx.load(str(target)), x)
            errors[way] = float(np.abs(got[0, 1:, 1:] - want[0, 1:, 1:]).mean())
    assert errors["apart"] < errors["whole"] / 4
