"""An environment whose only tool is synchronous and never returns (importable as hung_tool_env:HungTool).

The tool writes the path in ``AGENTBOOST_TEST_MARKER`` when it starts, so a test knows it is stuck.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from strands import tool

from agentboost.envs.base import Environment, Reward, Task


@tool
def wait_forever() -> str:
    """Wait for an answer that never comes."""
    marker = os.environ.get("AGENTBOOST_TEST_MARKER")
    if marker:
        Path(marker).write_text("entered\n")
    threading.Event().wait()
    return "never"


class HungTool(Environment):
    name = "hung-tool"
    system_prompt = "Call wait_forever."
    template = "qwen3"

    def tools(self, episode):
        return [wait_forever]

    def tasks(self, n=None, *, seed=0, split="train"):
        return [Task(f"hang-{i}", "Please wait.") for i in range(2)][:n]

    def reward(self, trajectory, episode):
        return Reward(0.0)
