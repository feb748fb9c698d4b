"""Environments that misbehave inside worker processes (imported by the workers of test_workers.py)."""

from __future__ import annotations

import os
import time

from strands import tool

from agentboost.envs.base import Environment, Task


def _in_a_worker() -> bool:
    return "AGENTBOOST_RESULT_FD" in os.environ


class HangsAtStart(Environment):
    """Never finishes building in a worker (a model load on a dead mount, a blocking network call)."""

    name = "hangs_at_start"

    def __init__(self) -> None:
        if _in_a_worker():
            time.sleep(3600)

    def tasks(self, n=None, *, seed=0, split="train"):
        return [Task("a", "a")]


class CrashAtStart(Environment):
    """Dies while a worker builds it, as a native crash or the OOM killer would."""

    name = "crash_at_start"

    def __init__(self) -> None:
        if _in_a_worker():
            os._exit(7)

    def tasks(self, n=None, *, seed=0, split="train"):
        return [Task("a", "a")]


class WritesToTheResultPipe(Environment):
    """A tool (of task 'a') that writes a line of its own on the worker's result pipe, once per run."""

    name = "writes_to_the_result_pipe"
    system_prompt = "Call the tool."

    def __init__(self, line: str, marker: str) -> None:
        self.line = line.encode()
        self.marker = marker

    def tasks(self, n=None, *, seed=0, split="train"):
        return [Task(name, f"task {name}") for name in ("a", "b", "c")]

    def tools(self, episode):
        line, marker = self.line, self.marker

        @tool
        def scribble() -> str:
            """Do the thing."""
            if not os.path.exists(marker):
                open(marker, "w").close()
                os.write(int(os.environ["AGENTBOOST_RESULT_FD"]), line + b"\n")
            return "done"

        return [scribble]

    def reward(self, trajectory, episode):
        return 1.0
