"""Find environments by name or import reference, so any process can rebuild the same one.

A reference is a registered name (``arithmetic``) or ``package.module:ClassName``. Worker processes
and veRL workers receive the reference and its keyword arguments, never a pickled object.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from agentboost.envs.base import Environment
from agentboost.errors import AgentBoostError, ConfigError

_REGISTRY: dict[str, str] = {
    "arithmetic": "agentboost.envs.arithmetic:ArithmeticEnvironment",
    "math": "agentboost.envs.math_problems:MathEnvironment",
    "coding": "agentboost.envs.coding.environment:CodingEnvironment",
    "tau2": "agentboost.envs.tau2.environment:Tau2Environment",
    "gateway": "agentboost.gateway.environment:GatewayEnvironment",
    "mcp": "agentboost.envs.mcp.environment:MCPEnvironment",
    "aenv": "agentboost.envs.mcp.aenv:AEnvEnvironment",
}


_ADAPTERS: dict[str, tuple[str, str]] = {
    "strands-env": ("agentboost.integrations.strands_env:StrandsEnvEnvironment", "environment"),
    "skyrl-gym": ("agentboost.integrations.skyrl_gym:SkyRLGymEnvironment", "environment"),
    "verifiers": ("agentboost.integrations.verifiers_env:VerifiersEnvironment", "environment"),
}
"""``KIND:REST`` references: the adapter class that runs an outside environment catalog's environment,
and the keyword argument that receives ``REST`` (e.g. ``strands-env:package.module:Class``)."""


def _adapter(reference: str) -> tuple[str, dict[str, str]]:
    """The class reference and extra keyword arguments an adapter reference means (``{}`` otherwise)."""
    kind, _, rest = reference.partition(":")
    if kind in _ADAPTERS:
        target, argument = _ADAPTERS[kind]
        if not rest:
            raise ConfigError(
                f"{kind!r} needs what to run after the colon, e.g. '{kind}:package.module:Class'"
            )
        return target, {argument: rest}
    return _REGISTRY.get(reference, reference), {}


def register_environment(name: str, reference: str) -> None:
    """Make ``name`` mean ``reference`` (``module:Class``) in this process."""
    _REGISTRY[name] = reference


def environment_names() -> list[str]:
    return sorted(_REGISTRY)


def parse_json_object(text: object, what: str) -> dict[str, Any]:
    """Parse JSON text that must be an object (e.g. ``--env-kwargs``); ConfigError naming ``what``."""
    if not isinstance(text, str):
        raise ConfigError(f"{what} must be JSON object text, got {type(text).__name__}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{what} is not valid JSON ({error.msg}): {text[:200]!r}") from error
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object such as '{{\"difficulty\": 2}}', got {text[:200]!r}")
    return value


def environment_class_named(name: str) -> type[Environment] | None:
    """The environment class whose ``name`` is ``name``: a registered one, else an Environment
    subclass this process has imported; None when there is none (no module is imported for an
    unknown name, so a results file cannot make this process import code)."""
    if name in _REGISTRY:
        try:
            return environment_class(name)
        except ConfigError:
            return None
    pending = [Environment]
    while pending:
        cls = pending.pop()
        if cls is not Environment and getattr(cls, "name", None) == name:
            return cls
        pending.extend(cls.__subclasses__())
    return None


def environment_class(reference: str) -> type[Environment]:
    """The Environment subclass a registered name or ``module:Class`` reference names."""
    target, _ = _adapter(reference)
    module_name, _, attribute = target.partition(":")
    if not attribute:
        raise ConfigError(
            f"unknown environment {reference!r}; use one of {', '.join(environment_names())}, "
            "an import reference such as 'my_package.envs:MyEnvironment', or an adapter: "
            f"{', '.join(kind + ':...' for kind in _ADAPTERS)}"
        )
    if os.getcwd() not in sys.path:  # as `python -m` does: my_package/ in the working directory imports
        sys.path.append(os.getcwd())
    try:
        cls = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"cannot import environment {target!r}: {error}") from error
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ConfigError(f"{target!r} is not an agentboost Environment subclass")
    return cls


def make_environment(reference: str, kwargs: Mapping[str, Any] | None = None) -> Environment:
    """Build an environment from a registered name or ``module:Class`` reference."""
    cls = environment_class(reference)
    target, adapted = _adapter(reference)
    try:
        return cls(**{**dict(kwargs or {}), **adapted})
    except TypeError as error:
        raise ConfigError(f"cannot build {target!r} with {dict(kwargs or {})}: {error}") from error
    except AgentBoostError:
        raise
    except Exception as error:  # the environment's own code failed: one line naming it
        raise ConfigError(
            f"environment {target!r} raised {type(error).__name__} while being built: {error}"
        ) from error


def environment_tasks(environment: Environment, n: int | None, *, seed: int, split: str) -> Iterable[Any]:
    """``environment.tasks(...)``; an exception from the environment's code becomes one ConfigError."""
    try:
        return environment.tasks(n, seed=seed, split=split)
    except AgentBoostError:
        raise
    except Exception as error:
        name = type(environment).__name__
        raise ConfigError(f"{name}.tasks() raised {type(error).__name__}: {error}") from error


def environment_reference(environment: Environment) -> str:
    """The ``module:Class`` reference that rebuilds ``environment``'s class in another process."""
    cls = type(environment)
    for name, target in _REGISTRY.items():
        if target == f"{cls.__module__}:{cls.__qualname__}":
            return name
    return f"{cls.__module__}:{cls.__qualname__}"
