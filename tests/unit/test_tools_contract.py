"""The tool contract is declared once (`haystack_osa_memory.tools`); everything else derives from it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, cast, get_args

import docstring_parser
import pytest
from hayhooks.server.pipelines.models import create_pipeline_metadata, create_request_model_from_callable
from hayhooks.server.utils.module_loader import _set_method_implementation_flags
from pydantic import BaseModel, Field
from starlette.datastructures import Headers

from haystack_osa_memory import tools, transfer, validation
from haystack_osa_memory.agent_tools import memory_tools, tool_parameters
from haystack_osa_memory.caller import Caller
from haystack_osa_memory.errors import InvalidInputError
from haystack_osa_memory.mcp.wrapper import tool_api
from haystack_osa_memory.memory import Memory
from haystack_osa_memory.store import lifecycle

REPO = Path(__file__).resolve().parents[2]
README_TABLE = re.compile(r"^\| tool \| arguments \| returns \|\n(?:\|.*\n?)+", re.MULTILINE)


def _without_title(schema: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in schema.items() if key != "title"}


def _load_wrapper(name: str) -> Any:
    path = REPO / "pipelines" / name / "pipeline_wrapper.py"
    spec = importlib.util.spec_from_file_location(f"_contract_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    wrapper = module.PipelineWrapper()  # no setup(): only the signature matters here
    _set_method_implementation_flags(wrapper)
    return wrapper


# -- README --------------------------------------------------------------------------------------------
def test_the_readme_table_is_the_generated_one() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    tables = README_TABLE.findall(readme)
    assert len(tables) == 1
    assert tables[0].rstrip("\n") == tools.markdown_table()


def test_the_table_shows_every_tool_with_its_limits() -> None:
    table = tools.markdown_table()
    rows = table.splitlines()[2:]
    assert [row.split("`")[1] for row in rows] == list(tools.SPECS)
    assert f"`fact` (1..{tools.FACT_MAX} chars)" in table
    assert f"`limit` ({tools.LIMIT_MIN}..{tools.LIMIT_MAX}, default {tools.LIMIT_DEFAULT})" in table
    assert f"`paths` (optional, ≤{tools.PATHS_MAX} items of 1..{tools.PATH_MAX} chars)" in table
    assert "degraded?" in table  # an optional result key is marked


# -- Hayhooks wrappers ---------------------------------------------------------------------------------
def test_every_pipeline_folder_is_a_declared_tool() -> None:
    folders = sorted(p.name for p in (REPO / "pipelines").iterdir() if (p / "pipeline_wrapper.py").exists())
    assert folders == sorted(tools.SPECS)


@pytest.mark.parametrize("name", list(tools.SPECS))
def test_hayhooks_builds_the_spec_from_each_wrapper(name: str) -> None:
    spec = tools.SPECS[name]
    metadata = create_pipeline_metadata(name, _load_wrapper(name))
    assert metadata["description"] == spec.description
    served = metadata["request_model"].model_json_schema()
    # `osa-memory serve` adds `additionalProperties: false`; the spec's model forbids extra arguments itself.
    assert {**_without_title(served), "additionalProperties": False} == _without_title(
        spec.Arguments.model_json_schema()
    )


def test_a_limit_edited_in_the_spec_changes_the_wrapper_schema() -> None:
    class Tighter(tools.RecallArguments):
        query: Annotated[str, Field(min_length=1, max_length=7, description="A short query.")]

    spec = tools.ToolSpec("kb_test", "A test tool.", Tighter, tools.RecallResult)

    class Wrapper:
        @tool_api(spec)
        def run_api(self, args: Tighter, headers: Headers | None) -> dict[str, Any]:
            return {"query": args.query, "limit": args.limit, "headers": headers}

    docstring = docstring_parser.parse(Wrapper.run_api.__doc__ or "")
    model = create_request_model_from_callable(Wrapper().run_api, "kb_testRun", docstring)
    query = model.model_json_schema()["properties"]["query"]
    assert (query["maxLength"], query["description"]) == (7, "A short query.")
    # Defaults are filled in; the implementation gets the spec's model.
    assert Wrapper().run_api(query="q") == {"query": "q", "limit": tools.LIMIT_DEFAULT, "headers": None}


def test_wrappers_take_headers_as_hayhooks_requires() -> None:
    from hayhooks.server.utils.request_headers import accepts_request_headers

    for name in tools.SPECS:
        assert accepts_request_headers(_load_wrapper(name).run_api), name


# -- validation ----------------------------------------------------------------------------------------
def _max_length(model: type[BaseModel], field: str) -> int:
    prop = model.model_json_schema()["properties"][field]
    options = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
    return int(options[0]["maxLength"])


@pytest.mark.parametrize(
    ("model", "field", "check"),
    [
        (tools.StoreArguments, "fact", validation.check_fact),
        (tools.StoreArguments, "topic", validation.check_topic),
        (tools.ListArguments, "topic", validation.check_topic),
        (tools.RecallArguments, "query", validation.check_query),
        (tools.ProposeArguments, "body", validation.check_fact),
    ],
)
def test_validation_and_schema_share_the_text_limits(model: type[BaseModel], field: str, check: Any) -> None:
    limit = _max_length(model, field)
    assert check("x" * limit) == "x" * limit
    with pytest.raises(InvalidInputError):
        check("x" * (limit + 1))


def test_validation_and_schema_share_the_numbers_and_choices() -> None:
    limit = tools.RecallArguments.model_json_schema()["properties"]["limit"]
    assert validation.check_limit(limit["maximum"]) == limit["maximum"]
    with pytest.raises(InvalidInputError):
        validation.check_limit(limit["maximum"] + 1)
    ttl = tools.StoreArguments.model_json_schema()["properties"]["ttl_days"]["anyOf"][0]
    assert validation.check_ttl_days(ttl["maximum"]) == ttl["maximum"]
    with pytest.raises(InvalidInputError):
        validation.check_ttl_days(ttl["maximum"] + 1)
    assert tools.StoreArguments.model_json_schema()["properties"]["kind"]["enum"] == list(validation.KINDS)
    assert tools.FeedbackArguments.model_json_schema()["properties"]["verdict"]["enum"] == list(validation.VERDICTS)
    for name in ("FACT_MAX", "TOPIC_MAX", "QUERY_MAX", "NOTE_MAX", "REASON_MAX", "TITLE_MAX", "TTL_DAYS_MAX"):
        assert getattr(validation, name) == getattr(tools, name), name


# -- statuses ------------------------------------------------------------------------------------------
def test_statuses_are_declared_once() -> None:
    assert lifecycle.LISTABLE_STATUSES is tools.LISTABLE_STATUSES
    assert transfer.IMPORTABLE_STATUSES is tools.LISTABLE_STATUSES
    assert lifecycle.PAGE_SIZE == tools.PAGE_SIZE
    listed = tools.ListArguments.model_json_schema()["properties"]["status"]["anyOf"][0]["enum"]
    assert listed == list(tools.LISTABLE_STATUSES)
    assert get_args(tools.Status) == tools.STATUSES
    assert set(tools.LISTABLE_STATUSES) < set(get_args(tools.LiveStatus)) < set(tools.STATUSES)


def test_the_sql_uses_only_declared_statuses() -> None:
    sql_statuses: set[str] = set()
    for module in ("lifecycle.py", "facts.py"):
        source = (REPO / "haystack_osa_memory" / "store" / module).read_text(encoding="utf-8")
        for clause in re.findall(r"status\s*(?:=|<>|IN)\s*\(?((?:'\w+'(?:,\s*)?)+)", source):
            sql_statuses.update(re.findall(r"'(\w+)'", clause))
    assert {"approved", "retired", "consolidated"} <= sql_statuses
    assert sql_statuses <= set(tools.STATUSES)


# -- results -------------------------------------------------------------------------------------------
def _closed_objects(schema: Any) -> list[Any]:
    if isinstance(schema, dict):
        found = [schema] if schema.get("additionalProperties") is False else []
        return found + [c for value in schema.values() for c in _closed_objects(value)]
    if isinstance(schema, list):
        return [c for value in schema for c in _closed_objects(value)]
    return []


@pytest.mark.parametrize("name", list(tools.SPECS))
def test_results_are_open_objects(name: str) -> None:
    schema = tools.SPECS[name].Result.model_json_schema()
    assert schema["type"] == "object"  # MCP requires an object at the root of an outputSchema
    assert _closed_objects(schema) == []


def test_optional_result_keys_are_absent_not_required() -> None:
    stored = {"stored": True, "assignment_id": "a", "document_id": "d" * 64, "redactions": 0}
    assert tools.StoreResult.model_validate(stored).queued is None
    assert tools.ProposeResult.model_validate({"rejected": "duplicate"}).document_id is None
    with pytest.raises(ValueError, match="stored"):
        tools.StoreResult.model_validate({"assignment_id": "a", "document_id": "d", "redactions": 0})


# -- Haystack Agent tools ------------------------------------------------------------------------------
class _RecordingMemory:
    """Stands in for `Memory` to see which arguments the agent tools pass on (no database involved)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def store(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("store", args, kwargs))
        return {"stored": True}

    def recall(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("recall", args, kwargs))
        return {"facts": []}

    # Memory's own mapping of the tools' arguments, run against the recording `store` and `recall` above.
    store_arguments = Memory.store_arguments
    recall_arguments = Memory.recall_arguments


def test_agent_tools_are_built_from_the_specs() -> None:
    from haystack.components.agents.state.state import State

    memory = _RecordingMemory()
    agent_tools = {t.name: t for t in memory_tools(cast(Memory, memory))}
    assert set(agent_tools) == {tools.STORE.name, tools.RECALL.name}
    for name, tool in agent_tools.items():
        spec = tools.SPECS[name]
        assert tool.description == spec.description
        assert tool.parameters == tool_parameters(spec)
        expected = [f for f in spec.Arguments.model_fields if f != "assignment"]
        assert list(tool.parameters["properties"]) == expected
        for field in expected:
            assert tool.parameters["properties"][field]["description"] == spec.Arguments.model_fields[field].description
    assert agent_tools["kb_memory_recall"].parameters["properties"]["limit"]["maximum"] == tools.LIMIT_MAX

    state = State(schema={"osa_scope": {"type": dict}}, data={"osa_scope": {"org_id": "o", "assignment_id": "a"}})
    agent_tools["kb_memory_recall"].invoke(query="q", state=state)
    agent_tools["kb_memory_store"].invoke(fact="f", kind="pitfall", assignment="elsewhere", state=state)
    (_, recall_args, recall_kwargs), (_, store_args, store_kwargs) = memory.calls
    assert recall_args == ("q", tools.LIMIT_DEFAULT)
    assert recall_kwargs["caller"] == Caller(org_id="o", assignment_id="a")
    assert store_args == ("f", None)
    assert (store_kwargs["kind"], store_kwargs["ttl_days"]) == ("pitfall", None)
    assert store_kwargs["caller"].assignment_id == "a"  # never the model's `assignment`
