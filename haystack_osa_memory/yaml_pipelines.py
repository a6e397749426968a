"""The store and recall pipelines as YAML that a team reads, edits and serves.

`osa-memory serve` (through the wrappers in `pipelines/`) runs the pipelines defined in
``pipelines/kb_memory_store/store.yml`` and ``pipelines/kb_memory_recall/recall.yml``: swap the
embedder, tune the retriever, add a component, and the edited pipeline is what serves. Only modules on
the allow-list load (`ALLOWED_MODULES`, plus Haystack's own): a YAML that names any other module is
refused. What the YAML does not decide is the server's configuration (`docs/configuration.md`), bound
to our components when the pipeline loads:

- the knowledge base every database component acts on (`MemoryStore`: connection, tables, timeouts);
- the redaction classes (``OSA_MEMORY_REDACTION_OFF``), the dataset and admitted statuses, and the
  query embedder's time budget (``OSA_MEMORY_EMBEDDER_TIMEOUT``);
- ``OSA_MEMORY_EMBEDDER=none`` removes the ``embed`` component from both (lexical recall), and ``auto``
  does so when the embedder cannot be built here (the `embeddings` extra missing).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from haystack import Pipeline

from haystack_osa_memory.builders import ALLOWED_MODULES, build_recall_pipeline, build_store_pipeline
from haystack_osa_memory.components.minilm_embedders import BUNDLED_MODEL
from haystack_osa_memory.config import MemoryConfig
from haystack_osa_memory.embedders import build_embedders, minilm_installed
from haystack_osa_memory.errors import ConfigurationError
from haystack_osa_memory.privacy.redaction import CLASSES as REDACTION_CLASSES
from haystack_osa_memory.store.memory_store import MemoryStore

#: Where the definitions live, relative to the pipelines folder (beside the tools that run them).
STORE_FILE = Path("kb_memory_store") / "store.yml"
RECALL_FILE = Path("kb_memory_recall") / "recall.yml"
#: The component the embedder is, in both pipelines (removed for lexical recall).
EMBED = "embed"

HEADER = """\
# The {name} pipeline `osa-memory serve` runs (docs/configuration.md, "Pipelines as YAML").
# Edit it to swap the embedder (the store and recall embedders must be the same model), tune the
# retriever or add components; the knowledge base, redaction classes, dataset, statuses and the query
# embedder's time budget come from the server's configuration. Only allow-listed modules load.
"""


@dataclass(frozen=True)
class PipelineDefinitions:
    """The YAML texts of the store and recall pipelines, and where they came from."""

    store: str
    recall: str
    origin: str

    @classmethod
    def find(cls, pipelines_dir: Path) -> PipelineDefinitions | None:
        """The definitions in a pipelines folder, or ``None`` when it has neither file.

        :raises ConfigurationError: only one of the two files is there.
        """
        store, recall = pipelines_dir / STORE_FILE, pipelines_dir / RECALL_FILE
        if not store.exists() and not recall.exists():
            return None
        if not (store.exists() and recall.exists()):
            msg = f"{pipelines_dir} needs both {STORE_FILE} and {RECALL_FILE} (or neither, to use the built-in ones)"
            raise ConfigurationError(msg)
        return cls(store.read_text(encoding="utf-8"), recall.read_text(encoding="utf-8"), str(pipelines_dir))


def default_definitions() -> PipelineDefinitions:
    """What the shipped YAML files hold: the built-in pipelines with the bundled MiniLM embedders."""
    config = MemoryConfig(embedder="minilm")
    document_embedder, text_embedder = build_embedders(config, model=BUNDLED_MODEL)
    store = build_store_pipeline(config, document_embedder)
    recall = build_recall_pipeline(config, text_embedder)
    return PipelineDefinitions(
        HEADER.format(name="store") + store.dumps(), HEADER.format(name="recall") + recall.dumps(), "built-in"
    )


def _drop_embedder(data: dict[str, Any]) -> None:
    """Remove ``embed`` and join what fed it to what it fed (documents pass straight through)."""
    components = data.get("components") or {}
    if EMBED not in components:
        return
    del components[EMBED]
    connections = data.get("connections") or []
    into = [c["sender"] for c in connections if c["receiver"].split(".")[0] == EMBED]
    out_of = [c["receiver"] for c in connections if c["sender"].split(".")[0] == EMBED]
    kept = [c for c in connections if EMBED not in (c["sender"].split(".")[0], c["receiver"].split(".")[0])]
    if (
        into
        and out_of
        and all(s.endswith(".documents") for s in into)
        and all(r.endswith(".documents") for r in out_of)
    ):
        kept += [{"sender": s, "receiver": r} for s in into for r in out_of]
    data["connections"] = kept


def _bind(data: dict[str, Any], config: MemoryConfig) -> None:
    """The server's settings into our components' parameters (the store is bound after loading)."""
    classes = [c for c in REDACTION_CLASSES if c not in config.redaction_off]
    for component in (data.get("components") or {}).values():
        kind = str(component.get("type", "")).rsplit(".", 1)[-1]
        params = component.setdefault("init_parameters", {})
        if kind == "PrivacyRedactor":
            params["enabled_classes"] = classes
        elif kind == "ScopeMarkerWriter":
            params["dataset"] = config.dataset
            params["status"] = config.admitted_statuses[0]
        elif kind == "GuardedTextEmbedder":
            params["timeout"] = config.embedder_timeout
        elif kind == "ScopedMemoryRetriever" or (
            kind == "GoverningRowAclFilter" and "ai_internal" in params.get("audiences", [])
        ):
            params["admitted_statuses"] = list(config.admitted_statuses)


def lexical_only(config: MemoryConfig) -> bool:
    """Whether the served pipelines drop their embedder (``none``, or ``auto`` without the extra)."""
    return config.embedder == "none" or (config.embedder == "auto" and not minilm_installed())


def load_pipeline(text: str, *, config: MemoryConfig, store: MemoryStore, origin: str = "YAML") -> Pipeline:
    """A pipeline from its YAML, allow-listed, bound to ``config`` and to the knowledge base ``store``.

    :raises ConfigurationError: the YAML is not a pipeline, or names a module outside the allow-list.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        msg = f"{origin}: not valid YAML: {e}"
        raise ConfigurationError(msg) from None
    if not isinstance(data, dict) or not isinstance(data.get("components"), dict):
        msg = f"{origin}: not a Haystack pipeline (no `components` mapping)"
        raise ConfigurationError(msg)
    data = copy.deepcopy(data)
    if lexical_only(config):
        _drop_embedder(data)
    _bind(data, config)
    try:
        pipe = Pipeline.from_dict(data, allowed_modules=ALLOWED_MODULES)
    except Exception as e:  # Haystack raises several types here; the message says which module or key
        msg = f"{origin}: the pipeline could not be loaded: {type(e).__name__}: {e}"
        raise ConfigurationError(msg) from e
    for _, component in pipe.walk():
        if isinstance(getattr(component, "store", None), MemoryStore):
            setattr(component, "store", store)  # noqa: B010 - components are typed as Haystack's protocol
    return pipe
