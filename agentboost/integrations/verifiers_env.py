"""Run a verifiers environment (PyPI ``verifiers``) with agentboost's gateway as its model client.

``--env verifiers:MODULE`` (an installed verifiers environment module) or ``--env verifiers:path/env.py``
builds :class:`VerifiersEnvironment`: the module's ``load_environment(**env_args)`` is the environment,
its dataset rows (``get_dataset`` for ``train``, ``get_eval_dataset`` for ``test``) are the tasks, its
own rollout logic runs each episode against a gateway session (so every model turn is token-exact and
one append-only conversation is one training row), and its rubric's score is the reward.

verifiers cannot share agentboost's Python: every release pins ``mcp<2`` or ``mcp==2.0.0`` (agentboost
needs ``mcp>=2.1``), and 0.4.0 also needs ``openai<3``. So verifiers runs in its own virtual environment
(``python``, or ``AGENTBOOST_VERIFIERS_PYTHON``), driven through
:mod:`agentboost.integrations.verifiers_bridge`, one subprocess per rollout, exactly as any gateway
agent command. Written against verifiers 0.3.1, whose classic environments (``vf.SingleTurnEnv``,
``vf.MultiTurnEnv``, ``vf.ToolEnv`` with a ``vf.Rubric``) run offline; 0.4.0 ships only ``verifiers.v1``,
whose harnesses install their dependencies with uv at run time (network).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentboost.envs.base import Episode
from agentboost.envs.task import Task
from agentboost.errors import ConfigError, UnscorableError
from agentboost.gateway.environment import GatewayEnvironment
from agentboost.outcomes import Reward
from agentboost.tokens.trajectory import TerminationReason, Trajectory

__all__ = ["STOPS", "VERIFIERS_PYTHON_VARIABLE", "VerifiersEnvironment"]

VERIFIERS_PYTHON_VARIABLE = "AGENTBOOST_VERIFIERS_PYTHON"
"""The Python of a virtual environment with ``verifiers`` installed."""
BRIDGE = str(Path(__file__).with_name("verifiers_bridge.py"))
_ROW_KEY = "verifiers_row"

STOPS: dict[str | None, TerminationReason] = {
    "max_turns_reached": TerminationReason.MAX_TURNS,
    "prompt_too_long": TerminationReason.CONTEXT_FULL,
}
"""verifiers' ``stop_condition`` -> agentboost's termination, for a rollout verifiers ended itself.
``max_turns_reached`` counts only when the model's last turn still called tools (a ``SingleTurnEnv``
always ends on it, by design); any other condition (``no_tools_called``, ``has_final_env_response``, an
environment's own ``@vf.stop``) is ``completed``, unless a model turn was cut by its token limit
(``is_truncated``): ``max_tokens``."""


class VerifiersEnvironment(GatewayEnvironment):
    """A verifiers environment's dataset, rollout logic and rubric, its model served by the gateway."""

    name = "verifiers"

    def __init__(
        self,
        environment: str,
        env_args: Mapping[str, Any] | None = None,
        python: str | None = None,
        limits: Mapping[str, Any] | None = None,
        template: str | None = None,
        parser: str = "hermes",
        tasks_timeout_s: float = 300.0,
    ) -> None:
        """``environment``: a module (or ``.py`` file) defining ``load_environment``; ``env_args``: its
        keyword arguments; ``python``: the verifiers virtual environment's interpreter (default
        ``$AGENTBOOST_VERIFIERS_PYTHON``); ``limits``: agentboost's limits on the session."""
        python = python or os.environ.get(VERIFIERS_PYTHON_VARIABLE)
        if not python:
            raise ConfigError(
                f"the verifiers adapter runs verifiers in its own virtual environment: pass 'python' or set "
                f"{VERIFIERS_PYTHON_VARIABLE} (python3 -m venv V && V/bin/pip install verifiers==0.3.1)"
            )
        if not Path(python).exists():
            raise ConfigError(f"the verifiers Python {python!r} does not exist")
        self.reference = environment
        self.env_args = dict(env_args or {})
        self.python = python
        arguments = [python, BRIDGE, "rollout", environment, json.dumps(self.env_args)]
        super().__init__(command=arguments, limits=limits)
        self.template, self.parser = template, parser
        self.tasks_timeout_s = tasks_timeout_s
        self._tasks: dict[str, list[Task]] = {}

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> Sequence[Task]:
        if split not in ("train", "test"):
            raise ConfigError(f"a verifiers environment has the splits train and test, not {split!r}")
        if split not in self._tasks:
            self._tasks[split] = self._list_tasks(split)
        return self._tasks[split][:n]

    def _list_tasks(self, split: str) -> list[Task]:
        arguments = [self.python, BRIDGE, "tasks", self.reference, json.dumps(self.env_args), split]
        try:
            done = subprocess.run(
                arguments, capture_output=True, text=True, timeout=self.tasks_timeout_s, check=False
            )
        except subprocess.TimeoutExpired as error:
            raise ConfigError(
                f"listing the {split} rows of {self.reference} took over {error.timeout} s"
            ) from error
        if done.returncode != 0:
            raise ConfigError(
                f"cannot load the verifiers environment {self.reference!r} with {self.env_args}: "
                f"{done.stderr.strip()[-1500:]}"
            )
        tasks = []
        for line in done.stdout.splitlines():
            row = json.loads(line)
            prompt = row["prompt"]
            if not isinstance(prompt, list) or not all(isinstance(m.get("content"), str) for m in prompt):
                raise ConfigError(
                    f"verifiers row {row['example_id']}: only chat prompts of text messages are supported, "
                    f"got {prompt!r:.200}"
                )
            tasks.append(
                Task(str(row["example_id"]), prompt, ground_truth=row.get("answer"), metadata={_ROW_KEY: row})
            )
        if not tasks:
            raise ConfigError(f"the verifiers environment {self.reference!r} has no {split} rows")
        return tasks

    async def reset(self, task: Task, *, sample: int = 0) -> Episode:
        if _ROW_KEY not in task.metadata:
            raise ConfigError(f"task {task.id!r} is not a verifiers dataset row (it has no {_ROW_KEY!r})")
        return Episode(task, sample)

    async def act(self, episode: Episode) -> Trajectory:
        """The gateway session's trajectory, its ending translated from verifiers' (:data:`STOPS`)."""
        trajectory = await super().act(episode)
        if trajectory.termination is TerminationReason.COMPLETED:
            scored = _scored(episode)
            condition = scored.get("stop_condition")
            if condition == "max_turns_reached" and not _ended_on_tool_calls(trajectory):
                condition = None  # the environment's planned last turn, not a cut
            stop = STOPS.get(condition) or (
                TerminationReason.MAX_TOKENS if scored.get("is_truncated") else None
            )
            if stop is not None:
                trajectory.termination = stop
                trajectory.termination_detail = f"verifiers ended the rollout: {condition or 'is_truncated'}"
        return trajectory

    def reward(self, trajectory: Trajectory, episode: Episode) -> Reward:
        """The rubric's score, as the bridge printed it on its last line."""
        scored = _scored(episode)
        try:
            value = float(scored["reward"])
        except (KeyError, ValueError, TypeError) as error:
            raise UnscorableError(f"the verifiers rollout printed no score: {scored!r:.300}") from error
        metrics = {
            key: float(v) for key, v in scored.get("metrics", {}).items() if isinstance(v, int | float)
        }
        return Reward(value, metrics, {"is_truncated": bool(scored.get("is_truncated"))})


def _ended_on_tool_calls(trajectory: Trajectory) -> bool:
    assistant = [message for message in trajectory.messages if message.get("role") == "assistant"]
    return bool(assistant and assistant[-1].get("tool_calls"))


def _scored(episode: Episode) -> dict[str, Any]:
    """The bridge's last stdout line (``{"reward", "metrics", "is_truncated"}``); {} when it printed none."""
    lines = str(episode.info.get("agent_output") or "").strip().splitlines()
    try:
        scored = json.loads(lines[-1])
    except (IndexError, ValueError):
        return {}
    return scored if isinstance(scored, dict) else {}
