"""Environments whose tasks() is a generator, for the memory-bound tests (importable as stream_envs:...)."""

from __future__ import annotations

from agentboost.envs.arithmetic import ArithmeticEnvironment, generate_tasks, iter_tasks


class Endless(ArithmeticEnvironment):
    """Yields arithmetic tasks without end, whatever ``n`` is: the run takes ``-n`` of them."""

    def tasks(self, n=None, *, seed=0, split="train"):
        yield from iter_tasks(seed=seed)


class Repeats(ArithmeticEnvironment):
    """Yields a task id twice."""

    def tasks(self, n=None, *, seed=0, split="train"):
        first, second = generate_tasks(2, seed=seed)
        yield first
        yield second
        yield first
