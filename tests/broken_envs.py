"""Environments whose own code fails, for the one-line-error tests (importable as broken_envs:...)."""

from __future__ import annotations

from agentboost.envs.base import Environment


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
