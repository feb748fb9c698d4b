"""Run a strands-env environment (PyPI ``strands-env``) on agentboost's engines, runner and trainer.

``--env strands-env:package.module:Class`` builds :class:`StrandsEnvEnvironment` around that
``strands_env.core.Environment`` subclass. What the environment defines is used as it is: its system
prompt, its tools (``get_tools``), its hooks (``get_hooks``), its per-episode ``reset``/``cleanup`` and
its reward function (``reward_fn.compute(task, result)``). What strands-env's own ``rollout`` does (build
a model, run an agent, collect SGLang tokens) is agentboost's job here: the agent runs in agentboost's
loop on agentboost's engine, so the trajectory is token-exact and its termination is one of
agentboost's reasons; the reward function receives a strands-env ``RolloutResult`` built from the same
conversation, with the termination translated by :data:`TERMINATIONS`.

A strands-env environment object is one episode, so each episode builds a fresh one (strands-env keeps
``__init__`` light by design) and calls its ``reset`` and ``cleanup``. Written against strands-env 0.5.1.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import Any

from agentboost.agent.limits import RolloutLimits
from agentboost.envs.base import Environment, Episode
from agentboost.envs.mcp.environment import split_tasks
from agentboost.envs.task import Task
from agentboost.errors import ConfigError
from agentboost.outcomes import Reward
from agentboost.tokens.trajectory import TerminationReason, Trajectory

__all__ = ["TERMINATIONS", "StrandsEnvEnvironment", "task_from_strands_env"]

TERMINATIONS: dict[TerminationReason, str] = {
    TerminationReason.COMPLETED: "task_complete",
    TerminationReason.USER_ENDED: "task_complete",
    TerminationReason.ENV_STOPPED: "task_complete",
    TerminationReason.MAX_TURNS: "max_tool_iterations_reached",
    TerminationReason.MAX_TOOL_CALLS: "max_tool_calls_reached",
    TerminationReason.CONTEXT_FULL: "context_window_overflow",
    TerminationReason.MAX_TOKENS: "max_tokens_reached",
    TerminationReason.TIMEOUT: "timeout",
    TerminationReason.ENGINE_TIMEOUT: "timeout",
    TerminationReason.ENGINE_ERROR: "connection_error",
}
"""agentboost's termination -> strands-env's ``TerminationReason`` value, as the reward function reads
it; every other reason (an error) is ``unclassified_error``. Failed rollouts are not scored at all."""

_TASK_KEY = "strands_env_task"
"""Task metadata key holding the strands-env task as JSON (what the reward function receives)."""


def task_from_strands_env(row: Any) -> Task:
    """An agentboost Task from one strands-env task JSON row (``{"id", "message", "context"}``)."""
    from strands_env.core.types import Task as StrandsTask

    try:
        task = StrandsTask.model_validate(row)
    except Exception as error:  # pydantic's ValidationError: one line naming what is wrong
        raise ConfigError(
            f"not a strands-env task ({error.__class__.__name__}): {str(error)[:300]}"
        ) from error
    message = task.message if isinstance(task.message, str) else task.message.get("content")
    if not isinstance(message, str):
        raise ConfigError(f"strands-env task {task.id!r}: only a text message is supported, got {message!r}")
    if task.context.conversation_history:
        raise ConfigError(
            f"strands-env task {task.id!r} has a conversation_history; the adapter runs tasks that start "
            "from their message (write the history into the message)"
        )
    return Task(
        task.id,
        message,
        ground_truth=task.context.ground_truth,
        metadata={_TASK_KEY: task.model_dump(mode="json")},
    )


def _import(reference: str, what: str) -> Any:
    module_name, _, attribute = reference.partition(":")
    if not attribute:
        raise ConfigError(f"{what} must be an import reference 'package.module:Name', got {reference!r}")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"cannot import {what} {reference!r}: {error}") from error


def _no_model() -> Any:
    raise ConfigError(
        "agentboost's strands-env adapter runs the agent on agentboost's engine; the environment asked its "
        "model_factory for a model (override get_tools/get_hooks/reward, not rollout)"
    )


class StrandsEnvEnvironment(Environment):
    """A strands-env environment's prompt, tools, hooks, lifecycle and reward on agentboost's agent loop."""

    name = "strands-env"

    def __init__(
        self,
        environment: str,
        tasks: str | Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        reward: str | None = None,
        limits: Mapping[str, Any] | None = None,
        template: str | None = None,
        parser: str = "hermes",
    ) -> None:
        """``environment``: ``package.module:Class`` (a ``strands_env.core.Environment`` subclass);
        ``tasks``: a JSONL file of strands-env tasks (or one per split); ``config``: the class's keyword
        arguments (``system_prompt``, ``max_tool_iters``, ...); ``reward``: ``package.module:Class`` of a
        strands-env ``RewardFunction`` replacing the environment's own; ``limits``: agentboost's limits
        (override those derived from ``max_tool_iters`` / ``max_tool_calls``)."""
        try:
            from strands_env.core import Environment as StrandsEnvironment
        except ImportError as error:
            raise ConfigError(
                f"the strands-env adapter needs the strands-env package ({error}); "
                "pip install 'agentboost[strands-env]'"
            ) from error

        self.environment_class = _import(environment, "strands-env environment")
        if not (
            isinstance(self.environment_class, type)
            and issubclass(self.environment_class, StrandsEnvironment)
        ):
            raise ConfigError(f"{environment!r} is not a strands_env.core.Environment subclass")
        self.reference = environment
        self.config = dict(config or {})
        self.reward_class = _import(reward, "strands-env reward function") if reward is not None else None
        probe = self._build()  # the class's own checks run now, not in the first episode
        if probe.reward_fn is None:
            raise ConfigError(
                f"{environment} has no reward function; pass 'reward': 'package.module:RewardClass'"
            )
        if probe.max_parallel_tool_calls is not None:
            raise ConfigError(
                "max_parallel_tool_calls is not supported by agentboost's agent loop; leave it unset"
            )
        self.system_prompt = probe.system_prompt
        derived: dict[str, Any] = {}
        if probe.max_tool_iters is not None:  # N turns that call tools, then one that answers
            derived["max_turns"] = probe.max_tool_iters + 1
        if probe.max_tool_calls is not None:
            derived["max_tool_calls"] = probe.max_tool_calls
        try:
            self.limits = RolloutLimits(**{**derived, **dict(limits or {})})
        except TypeError as error:
            raise ConfigError(f"bad 'limits' {dict(limits or {})}: {error}") from error
        self.task_files = tasks
        self.template = template
        self.parser = parser
        self._tasks: dict[str, list[Task]] = {}

    def _build(self) -> Any:
        """A fresh strands-env environment object (one per episode)."""
        kwargs: dict[str, Any] = {"model_factory": _no_model, **self.config}
        if self.reward_class is not None:
            kwargs["reward_fn"] = self.reward_class()
        try:
            return self.environment_class(**kwargs)
        except TypeError as error:
            raise ConfigError(f"cannot build {self.reference} with config {self.config}: {error}") from error

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        return split_tasks(self.task_files, self._tasks, split, task_from_strands_env)[:n]

    async def reset(self, task: Task, *, sample: int = 0) -> Episode:
        episode = Episode(task, sample)
        inner = self._build()
        await inner.reset()
        episode.state["strands_env"] = inner
        return episode

    def tools(self, episode: Episode) -> list[Any]:
        return list(episode.state["strands_env"].get_tools())

    def hooks(self, episode: Episode) -> list[Any]:
        return list(episode.state["strands_env"].get_hooks())

    async def reward(self, trajectory: Trajectory, episode: Episode) -> Reward:
        from strands_env.core.types import RolloutResult as StrandsResult
        from strands_env.core.types import Task as StrandsTask
        from strands_env.core.types import TerminationReason as StrandsTermination

        row = episode.task.metadata.get(_TASK_KEY)  # absent for tasks that came from elsewhere
        if row is None:
            row = {"id": episode.task.id, "message": episode.task.text}
            row["context"] = {"ground_truth": episode.task.ground_truth}
        task = StrandsTask.model_validate(row)
        result = StrandsResult(
            messages=list(episode.messages),
            metrics=dict(trajectory.metrics),
            termination_reason=StrandsTermination(
                TERMINATIONS.get(trajectory.termination, "unclassified_error")
            ),
        )
        scored = await episode.state["strands_env"].reward_fn.compute(task, result)
        info = json.loads(json.dumps(scored.info, default=str))  # JSON facts, whatever the function kept
        return Reward(float(scored.reward), info=info)

    async def cleanup(self, episode: Episode) -> None:
        inner = episode.state.get("strands_env")
        if inner is not None:
            await inner.cleanup()
