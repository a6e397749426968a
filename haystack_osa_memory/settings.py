"""The one reader of the process environment: `load_config` builds a `MemoryConfig` from ``PG_CONN_STR``
and the ``OSA_MEMORY_*`` variables (`MemoryConfig.from_env()` calls it).

Only the command line, `serve` and its workers, the stdio bridge and a bare `Memory()` load settings this
way; a `MemoryConfig` built in code never sees the environment. Variables are read as text by
pydantic-settings (exact names, empty counts as unset) and checked by `MemoryConfig` itself, so a value
means the same from the environment as given in code (``OSA_MEMORY_REDACTION_OFF=jwt,secret``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from functools import cache
from typing import Any

from pydantic import Field, ValidationError, create_model
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from haystack_osa_memory.config import ENVIRONMENT, MemoryConfig
from haystack_osa_memory.errors import ConfigurationError


class _Environment(BaseSettings):
    """The settings variables as text; one field per `MemoryConfig` field, named by its variable."""

    model_config = SettingsConfigDict(case_sensitive=True, env_ignore_empty=True, extra="ignore", frozen=True)


class _Given(_Environment):
    """The same variables from a mapping given to the loader, never from the process environment."""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource, *_: Any, **__: Any
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


@cache
def _environment_model(base: type[_Environment]) -> type[_Environment]:
    fields: dict[str, Any] = {
        name: (str | None, Field(default=None, validation_alias=variable)) for variable, name in ENVIRONMENT.items()
    }
    return create_model(base.__name__.lstrip("_"), __base__=base, **fields)


def read_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings that are set, as text, keyed by `MemoryConfig` field (``environ``: instead of the
    process environment)."""
    if environ is None:
        raw = _environment_model(_Environment)()  # pydantic-settings reads the process environment
    else:
        given = {variable: environ[variable] for variable in ENVIRONMENT if environ.get(variable)}
        raw = _environment_model(_Given)(**given)
    return {name: value for name, value in raw.model_dump().items() if value is not None}


def load_config(
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    *,
    only: Collection[str] | None = None,
) -> MemoryConfig:
    """A `MemoryConfig` from the environment, then ``overrides`` (``None`` values are skipped).

    :param environ: Read instead of the process environment.
    :param only: Read just these fields (the others keep their defaults): a process that needs one
        setting is not stopped by another's value.
    :raises ConfigurationError: a value is not allowed; the message names its variable and setting.
    """
    values: dict[str, object] = dict(read_environment(environ))
    if only is not None:
        values = {name: value for name, value in values.items() if name in only}
    from_environment = set(values)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    variables = {name: variable for variable, name in ENVIRONMENT.items()}
    try:
        return MemoryConfig.model_validate(values)
    except ValidationError as e:

        def where(loc: tuple[int | str, ...]) -> str:
            name = ".".join(map(str, loc))
            return f"{variables[name]} ({name})" if name in from_environment and name in variables else name

        problems = "; ".join(f"{where(err['loc'])}: {err['msg']}" for err in e.errors())
        msg = f"invalid osa-memory settings: {problems}"
        raise ConfigurationError(msg) from None
