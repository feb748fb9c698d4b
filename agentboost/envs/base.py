"""Environments: a system prompt, tools, how a task becomes a prompt, limits, and a reward.

This is the minimal form the rollout command needs; subclass it and fill in four things.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentboost.agent.provider import RolloutLimits
from agentboost.agent.rollout import run_agent
from agentboost.engines.base import Engine, SamplingParams
from agentboost.tokens.templates import ChatTemplate
from agentboost.tokens.trajectory import Trajectory


class Environment:
    """Subclass and set ``name`` and ``system_prompt``; implement ``tasks``, ``prompt``, ``reward``."""

    name: str = "environment"
    system_prompt: str | None = None
    limits: RolloutLimits = RolloutLimits()

    def tools(self) -> list[Any]:
        """Strands tools for one rollout. Return fresh objects if a tool keeps state."""
        return []

    def tasks(self, n: int, *, seed: int = 0) -> Sequence[Any]:
        raise NotImplementedError

    def task_id(self, task: Any) -> str:
        return str(getattr(task, "id", task))

    def prompt(self, task: Any) -> str:
        raise NotImplementedError

    def reward(self, trajectory: Trajectory, task: Any) -> float:
        raise NotImplementedError

    async def rollout(
        self,
        task: Any,
        engine: Engine,
        tokenizer: Any,
        *,
        sampling: SamplingParams | None = None,
        limits: RolloutLimits | None = None,
        template: ChatTemplate | str | None = None,
        parser: str = "hermes",
    ) -> Trajectory:
        """Run one task and score it; the reward is stored on the trajectory."""
        trajectory = await run_agent(
            engine,
            tokenizer,
            self.prompt(task),
            system_prompt=self.system_prompt,
            tools=self.tools(),
            template=template,
            parser=parser,
            sampling=sampling,
            limits=limits or self.limits,
            task_id=self.task_id(task),
            info={"environment": self.name},
        )
        trajectory.reward = float(self.reward(trajectory, task))
        return trajectory
