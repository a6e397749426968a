"""The store and recall pipelines as YAML that a team reads, edits and serves.

`osa-memory serve` (through the wrappers in `pipelines/`) runs the pipelines defined in
``pipelines/kb_memory_store/store.yml`` and ``pipelines/kb_memory_recall/recall.yml``: swap the
embedder, tune the retriever, add a component, name a supersession judge (a component ``judge`` in the
store YAML: a `SupersessionJudge` or any Haystack chat generator), and the edited pipeline is what
serves. Only modules on the allow-list load (`ALLOWED_MODULES`, plus Haystack's own): a YAML that names
any other module is refused. What the YAML does not decide is the server's configuration
(`docs/configuration.md`), bound to our components when the pipeline loads (`BOUND`):

- the knowledge base every database component acts on (the ``store:`` blocks, `MemoryStore`:
  connection, tables, timeouts);
- the redaction classes (``OSA_MEMORY_REDACTION_OFF``), the dataset and admitted statuses, and the
  query embedder's time budget (``OSA_MEMORY_EMBEDDER_TIMEOUT``);
- the precision of the MiniLM document embedder (``OSA_MEMORY_DOCUMENT_PRECISION``): stored vectors
  outlive the process, and the command line (import, reflect) stores with the same setting, so the
  server and the command line write facts of one knowledge base alike (a query vector lives for one
  recall: the recall YAML's ``precision`` decides it);
- what runs the MiniLM embedders' forward pass, store and recall (``OSA_MEMORY_EMBEDDER_RUNTIME``);
- ``OSA_MEMORY_EMBEDDER=none`` removes the ``embed`` component from both (lexical recall), and ``auto``
  does so when the embedder cannot be built here (the `embeddings` extra missing).

The shipped files leave those values out. A YAML may state one only when it equals what the server
binds: any other value is refused at load, naming the setting that decides it, so an edit that would
have no effect never passes silently.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from haystack import Pipeline
from haystack.marshal import YamlMarshaller
from haystack.utils import Secret
from haystack.utils.auth import EnvVarSecret

from haystack_osa_memory.builders import ALLOWED_MODULES, build_recall_pipeline, build_store_pipeline
from haystack_osa_memory.components.minilm_embedders import BUNDLED_MODEL
from haystack_osa_memory.components.supersession_judge import SupersessionJudge
from haystack_osa_memory.config import ENVIRONMENT, MemoryConfig
from haystack_osa_memory.embedders import build_embedders, minilm_installed
from haystack_osa_memory.errors import ConfigurationError
from haystack_osa_memory.store.memory_store import CONNECTION_ENV, STORE_FIELDS, MemoryStore

#: Where the definitions live, relative to the pipelines folder (beside the tools that run them).
STORE_FILE = Path("kb_memory_store") / "store.yml"
RECALL_FILE = Path("kb_memory_recall") / "recall.yml"
#: The component the embedder is, in both pipelines (removed for lexical recall).
EMBED = "embed"
#: The component of the store YAML that decides supersession (taken out of the pipeline when it loads).
JUDGE = "judge"

HEADER = """\
# The {name} pipeline `osa-memory serve` runs (docs/configuration.md, "Pipelines as YAML").
# Edit it to swap the embedder (the store and recall embedders must be the same model), tune the
# retriever or add components; the knowledge base, redaction classes, dataset, statuses, the query
# embedder's time budget, the MiniLM runtime and document precision come from the server's configuration:
# leave them out (a differing value is refused at load). Only allow-listed modules load.
"""
#: Appended to the store pipeline's header: how a team names a supersession judge.
JUDGE_EXAMPLE = """\
# A supersession judge (off unless named): add a component `judge`, connected to nothing, e.g.
#   judge:
#     type: haystack_osa_memory.components.supersession_judge.SupersessionJudge
#     init_parameters:
#       timeout: 10.0      # seconds for all its questions of one store; past it, suggestions only
#       max_calls: 8       # questions per store
#       chat_generator:
#         type: haystack.components.generators.chat.openai.OpenAIChatGenerator
#         init_parameters:
#           model: llama3.2
#           api_base_url: http://localhost:11434/v1   # OpenAI, Ollama, vLLM, ...
#           api_key: {type: env_var, env_vars: [OSA_MEMORY_JUDGE_API_KEY], strict: true}
#           timeout: 10.0
#           max_retries: 0
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
    store, recall = build_store_pipeline(config, document_embedder), build_recall_pipeline(config, text_embedder)
    marshaller = YamlMarshaller()
    return PipelineDefinitions(
        HEADER.format(name="store") + JUDGE_EXAMPLE + marshaller.marshal(_without_bound(store.to_dict())),
        HEADER.format(name="recall") + marshaller.marshal(_without_bound(recall.to_dict())),
        "built-in",
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


@dataclass(frozen=True)
class Bound:
    """One parameter the server's configuration decides: the value it binds and where that is set."""

    value: Callable[[MemoryConfig], Any]
    setting: str
    #: Compared as a set (the order carries no meaning).
    unordered: bool = False


def _setting(field: str) -> str:
    """Where a `MemoryConfig` field is set: its environment variable, else the field itself."""
    variables = [v for v, f in ENVIRONMENT.items() if f == field]
    return variables[0] if variables else f"MemoryConfig.{field}"


#: Per component class name, the parameters bound from the server's configuration.
BOUND: dict[str, dict[str, Bound]] = {
    "PrivacyRedactor": {
        "enabled_classes": Bound(
            lambda c: c.enabled_redaction_classes,
            "OSA_MEMORY_REDACTION_OFF (the classes left unredacted)",
            unordered=True,
        ),
    },
    "ScopeMarkerWriter": {
        "dataset": Bound(lambda c: c.dataset, "OSA_MEMORY_DATASET"),
        "status": Bound(lambda c: c.admitted_statuses[0], "MemoryConfig.admitted_statuses (its first status)"),
    },
    "GuardedTextEmbedder": {"timeout": Bound(lambda c: c.embedder_timeout, "OSA_MEMORY_EMBEDDER_TIMEOUT")},
    "MiniLMDocumentEmbedder": {
        "precision": Bound(lambda c: c.document_precision, "OSA_MEMORY_DOCUMENT_PRECISION"),
        "runtime": Bound(lambda c: c.embedder_runtime, "OSA_MEMORY_EMBEDDER_RUNTIME"),
    },
    "MiniLMTextEmbedder": {"runtime": Bound(lambda c: c.embedder_runtime, "OSA_MEMORY_EMBEDDER_RUNTIME")},
    "ScopedMemoryRetriever": {
        "admitted_statuses": Bound(lambda c: list(c.admitted_statuses), "MemoryConfig.admitted_statuses")
    },
}
#: The ACL filter of facts (audience `ai_internal`) admits the server's statuses; a customer-facing one its own.
FACT_ACL: dict[str, Bound] = {
    "admitted_statuses": Bound(lambda c: list(c.admitted_statuses), "MemoryConfig.admitted_statuses")
}


#: Our components that act on the database (their ``store`` is the server's knowledge base).
STORE_COMPONENTS = frozenset({"GovernedFactWriter", "GoverningRowAclFilter", "ScopedMemoryRetriever"})


def _kind(component: dict[str, Any]) -> str | None:
    """The class name of one of our components (``None`` for any other: nothing is bound to it)."""
    kind = str(component.get("type", ""))
    return kind.rsplit(".", 1)[-1] if kind.startswith("haystack_osa_memory.components.") else None


def _bound_of(component: dict[str, Any]) -> dict[str, Bound]:
    kind = _kind(component)
    if kind == "GoverningRowAclFilter":
        return FACT_ACL if "ai_internal" in (component.get("init_parameters") or {}).get("audiences", []) else {}
    return BOUND.get(kind, {}) if kind else {}


def _without_bound(data: dict[str, Any]) -> dict[str, Any]:
    """A pipeline's dictionary without the values the server binds (what the shipped YAML holds)."""
    for component in (data.get("components") or {}).values():
        params = component.get("init_parameters") or {}
        for name in _bound_of(component):
            params.pop(name, None)
        if _kind(component):
            params.pop("store", None)
        inner = params.get("embedder")
        if isinstance(inner, dict):
            _without_bound({"components": {"inner": inner}})
    return data


def _same(given: Any, bound: Any, unordered: bool) -> bool:
    if unordered and isinstance(given, list | tuple) and isinstance(bound, list | tuple):
        return sorted(map(str, given)) == sorted(map(str, bound))
    if isinstance(given, list | tuple) and isinstance(bound, list | tuple):
        return list(given) == list(bound)
    return bool(given == bound)


def _refuse(origin: str, where: str, given: Any, bound: Any, setting: str) -> ConfigurationError:
    msg = (
        f"{origin}: {where} is {given!r} but the server's configuration binds {bound!r} there: set it with "
        f"{setting} (docs/configuration.md) and leave it out of the YAML"
    )
    return ConfigurationError(msg)


def _store_params(store: MemoryStore) -> dict[str, tuple[Any, str]]:
    """The knowledge base's parameters as a ``store:`` block states them, with where each is set."""
    params: dict[str, tuple[Any, str]] = {
        name: (getattr(store, name), _setting(name)) for name in STORE_FIELDS if name != "redaction_off"
    }
    params["redaction_off"] = (store.redaction_off, "OSA_MEMORY_REDACTION_OFF")
    named = store.connection_string
    # Compared as the variable it names (a value given in code is never in a YAML); a token matches nothing.
    secret = (
        Secret.from_env_var(list(named._env_vars), strict=named._strict).to_dict()
        if isinstance(named, EnvVarSecret)
        else None
    )
    params["connection_string"] = (secret, f"{CONNECTION_ENV} (a `store:` block may only name that variable)")
    return params


def _check_store(origin: str, where: str, block: Any, store: MemoryStore) -> None:
    """Refuse a ``store:`` block that states a value other than the knowledge base the server binds."""
    if not isinstance(block, dict):
        msg = f"{origin}: {where} is not a MemoryStore block (`type` and `init_parameters`)"
        raise ConfigurationError(msg)
    if block.get("type") != f"{MemoryStore.__module__}.{MemoryStore.__name__}":
        msg = f"{origin}: {where} names {block.get('type')!r}; only the server's MemoryStore is allowed there"
        raise ConfigurationError(msg)
    bound = _store_params(store)
    for name, given in (block.get("init_parameters") or {}).items():
        if name not in bound:
            msg = f"{origin}: {where}.init_parameters.{name} is not a MemoryStore parameter; allowed: {sorted(bound)}"
            raise ConfigurationError(msg)
        value, setting = bound[name]
        if not _same(given, value, unordered=name == "redaction_off"):
            if name == "connection_string":  # never echo what a YAML put there
                msg = f"{origin}: {where}.init_parameters.connection_string must name the variable {setting}"
                raise ConfigurationError(msg)
            raise _refuse(origin, f"{where}.init_parameters.{name}", given, value, setting)


def _bind(data: dict[str, Any], config: MemoryConfig, store: MemoryStore, origin: str) -> None:
    """The server's settings into our components' parameters (the store object is bound after loading).

    :raises ConfigurationError: the YAML states a value other than the one the server binds.
    """
    for name, component in (data.get("components") or {}).items():
        params = component.setdefault("init_parameters", {})
        for param, bound in _bound_of(component).items():
            value = bound.value(config)
            if param in params and not _same(params[param], value, bound.unordered):
                where = f"components.{name}.init_parameters.{param}"
                raise _refuse(origin, where, params[param], value, bound.setting)
            params[param] = value
        inner = params.get("embedder")
        if isinstance(inner, dict) and _kind(component):
            # A wrapped embedder (`GuardedTextEmbedder`'s) is bound as a component of its own.
            _bind({"components": {f"{name}.init_parameters.embedder": inner}}, config, store, origin)
        if "store" in params and _kind(component):
            _check_store(origin, f"components.{name}.init_parameters.store", params["store"], store)
        if _kind(component) in STORE_COMPONENTS:
            params["store"] = store  # the shipped YAML leaves the block out: the server binds its store


def lexical_only(config: MemoryConfig) -> bool:
    """Whether the served pipelines drop their embedder (``none``, or ``auto`` without the extra)."""
    return config.embedder == "none" or (config.embedder == "auto" and not minilm_installed())


def load_pipeline(text: str, *, config: MemoryConfig, store: MemoryStore, origin: str = "YAML") -> Pipeline:
    """A pipeline from its YAML, allow-listed, bound to ``config`` and to the knowledge base ``store``.

    :raises ConfigurationError: the YAML is not a pipeline, names a module outside the allow-list, or states
        a value other than the one the server's configuration binds (`BOUND`, the ``store:`` blocks).
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
    _bind(data, config, store, origin)
    try:
        pipe = Pipeline.from_dict(data, allowed_modules=ALLOWED_MODULES)
    except Exception as e:  # Haystack raises several types here; the message says which module or key
        msg = f"{origin}: the pipeline could not be loaded: {type(e).__name__}: {e}"
        raise ConfigurationError(msg) from e
    for _, component in pipe.walk():
        if isinstance(getattr(component, "store", None), MemoryStore):
            setattr(component, "store", store)  # noqa: B010 - components are typed as Haystack's protocol
    return pipe


def judge_of(component: Any, given: SupersessionJudge | None, origin: str) -> SupersessionJudge:
    """The supersession judge a store YAML names (component `JUDGE`): a `SupersessionJudge`, or any chat
    generator, wrapped with the default budget.

    :raises ConfigurationError: `Memory(judge=...)` names one too, or the component is not a chat generator.
    """
    if given is not None:
        msg = f"{origin}: the store pipeline names a `{JUDGE}` and Memory(judge=...) another: keep one"
        raise ConfigurationError(msg)
    if isinstance(component, SupersessionJudge):
        return component
    try:
        return SupersessionJudge(chat_generator=component)
    except ValueError as e:
        msg = f"{origin}: components.{JUDGE}: {e}"
        raise ConfigurationError(msg) from None
