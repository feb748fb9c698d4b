"""Environments: a system prompt, tools, how a task becomes a prompt, limits, and a reward.

A new environment is a subclass that fills in ``tasks``, ``prompt`` and ``reward`` (and usually
``system_prompt`` and ``tools``)::

    class Capitals(Environment):
        system_prompt = "Answer with the capital city only."
        def tasks(self, n=None, *, seed=0, split="train"):
            return [{"id": "fr", "country": "France", "capital": "Paris"}][:n]
        def prompt(self, task):
            return f"What is the capital of {task['country']}?"
        def reward(self, trajectory, task):
            return float(trajectory.final_text.strip() == task["capital"])

``tools()`` is called once per rollout: return fresh tool objects when a tool keeps state, so that
concurrent rollouts never see each other's state. It may also return Strands tool providers such
as an ``MCPClient``. A reward may be sync or async and may return a float or a :class:`Reward` with
a breakdown; a reward that raises is recorded as a failed reward with its error, never a crash.
"""

from __future__ import annotations

import dataclasses
import inspect
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentboost.agent.provider import RolloutLimits
from agentboost.agent.rollout import run_agent
from agentboost.engines.base import Engine, SamplingParams
from agentboost.errors import ConfigError
from agentboost.tokens.templates import ChatTemplate
from agentboost.tokens.trajectory import TerminationReason, Trajectory


@dataclass
class Reward:
    """A reward with the parts it was made of (e.g. ``{"correct": 1.0, "format": 0.2}``)."""

    value: float
    breakdown: dict[str, float] = field(default_factory=dict)


@dataclass
class RolloutResult:
    """One rollout of one task: its trajectory and its reward (or why the reward failed)."""

    task_id: str
    sample: int
    trajectory: Trajectory
    reward: float | None
    """None when the reward function failed; see ``reward_error``."""
    reward_breakdown: dict[str, float] = field(default_factory=dict)
    reward_error: str | None = None
    attempts: int = 1
    """How many times the rollout ran (engine errors are retried by the runner)."""

    @property
    def termination(self) -> TerminationReason:
        return self.trajectory.termination

    @property
    def failed(self) -> bool:
        """An engine, template or agent error, or a failed reward: the sample carries no usable signal."""
        return self.reward is None or self.termination in _FAILURES

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "sample": self.sample,
            "reward": self.reward,
            "reward_breakdown": self.reward_breakdown,
            "reward_error": self.reward_error,
            "attempts": self.attempts,
            "termination": self.termination.value,
            "trajectory": self.trajectory.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutResult:
        return cls(
            task_id=data["task_id"],
            sample=int(data["sample"]),
            trajectory=Trajectory.from_dict(data["trajectory"]),
            reward=data.get("reward"),
            reward_breakdown=dict(data.get("reward_breakdown") or {}),
            reward_error=data.get("reward_error"),
            attempts=int(data.get("attempts", 1)),
        )


_FAILURES = frozenset(
    {
        TerminationReason.ENGINE_ERROR,
        TerminationReason.TEMPLATE_ERROR,
        TerminationReason.AGENT_ERROR,
        TerminationReason.WORKER_CRASHED,
    }
)


class Environment:
    """Subclass it: set ``system_prompt`` (and ``limits``); implement ``tasks``, ``prompt``, ``reward``."""

    name: ClassVar[str] = "environment"
    system_prompt: str | None = None
    limits: RolloutLimits = RolloutLimits()
    template: str | None = None
    """Chat template name (``qwen3``, ``chatml``, ``tokenizer``); None picks one from the tokenizer."""
    parser: str = "hermes"
    """Tool-call format (see :mod:`agentboost.tokens.parsers`)."""

    def tools(self) -> list[Any]:
        """Strands tools for ONE rollout. Return fresh objects when a tool keeps state."""
        return []

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> Sequence[Any]:
        raise NotImplementedError(f"{type(self).__name__} does not define tasks()")

    def prompt(self, task: Any) -> str:
        raise NotImplementedError(f"{type(self).__name__} does not define prompt()")

    def reward(self, trajectory: Trajectory, task: Any) -> Any:
        """A float, a :class:`Reward`, or an awaitable of either."""
        raise NotImplementedError(f"{type(self).__name__} does not define reward()")

    # --- tasks as plain data (for result files, worker processes, veRL parquet) -----------------

    def task_id(self, task: Any) -> str:
        if isinstance(task, Mapping) and "id" in task:
            return str(task["id"])
        return str(getattr(task, "id", task))

    def task_to_dict(self, task: Any) -> dict[str, Any]:
        if dataclasses.is_dataclass(task) and not isinstance(task, type):
            return dataclasses.asdict(task)
        if isinstance(task, Mapping):
            return dict(task)
        raise ConfigError(
            f"{type(self).__name__}: override task_to_dict() for tasks of type {type(task).__name__}"
        )

    def task_from_dict(self, data: Mapping[str, Any]) -> Any:
        return dict(data)

    # --- running ----------------------------------------------------------------------------------

    async def score(
        self, trajectory: Trajectory, task: Any
    ) -> tuple[float | None, dict[str, float], str | None]:
        """Run the reward; a reward that raises or returns garbage becomes (None, {}, error)."""
        try:
            outcome = self.reward(trajectory, task)
            if inspect.isawaitable(outcome):
                outcome = await outcome
            if isinstance(outcome, Reward):
                return float(outcome.value), {k: float(v) for k, v in outcome.breakdown.items()}, None
            if isinstance(outcome, bool) or not isinstance(outcome, int | float):
                raise TypeError(f"reward() returned {type(outcome).__name__}; return a float or a Reward")
            return float(outcome), {}, None
        except Exception as error:
            detail = "".join(traceback.format_exception_only(type(error), error)).strip()
            return None, {}, f"{detail} (in {type(self).__name__}.reward)"

    async def rollout(
        self,
        task: Any,
        engine: Engine,
        tokenizer: Any = None,
        *,
        sampling: SamplingParams | None = None,
        limits: RolloutLimits | None = None,
        template: ChatTemplate | str | None = None,
        sample: int = 0,
    ) -> RolloutResult:
        """Run one task once and score it. Never raises for a failed rollout or a failed reward."""
        tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        if tokenizer is None:
            raise ConfigError(
                "no tokenizer: pass one, or use an engine that carries one (LocalEngine.from_pretrained)"
            )
        task_id = self.task_id(task)
        trajectory = await run_agent(
            engine,
            tokenizer,
            self.prompt(task),
            system_prompt=self.system_prompt,
            tools=self.tools(),
            template=template if template is not None else self.template,
            parser=self.parser,
            sampling=sampling,
            limits=limits or self.limits,
            task_id=task_id,
            info={"environment": self.name, "sample": sample},
        )
        reward, breakdown, error = await self.score(trajectory, task)
        trajectory.reward = reward
        return RolloutResult(task_id, sample, trajectory, reward, breakdown, error)
