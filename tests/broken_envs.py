"""Environments whose own code fails, for the one-line-error tests and the failing-reward tests
(importable as broken_envs:...)."""

from __future__ import annotations

from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.envs.base import Environment
from agentboost.errors import UnscorableError


class FailsToBuild(Environment):
    name = "fails-to-build"

    def __init__(self) -> None:
        raise RuntimeError("the database is not reachable")

    def tasks(self, n=None, *, seed=0, split="train"):
        return []


class TasksRaise(Environment):
    name = "tasks-raise"

    def tasks(self, n=None, *, seed=0, split="train"):
        raise KeyError("split file missing")


class JudgeHasABug(ArithmeticEnvironment):
    """Arithmetic whose reward raises (a bug in the environment: ``reward_error``)."""

    name = "judge-has-a-bug"

    def reward(self, trajectory, episode):
        raise RuntimeError("the judge has a bug")


class JudgeIsDown(ArithmeticEnvironment):
    """Arithmetic whose reward cannot be computed (``unscorable``)."""

    name = "judge-is-down"

    def reward(self, trajectory, episode):
        raise UnscorableError("the judge is down")
