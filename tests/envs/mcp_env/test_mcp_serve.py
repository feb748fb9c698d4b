"""``agentboost mcp serve``: a built-in environment served over MCP, used by agentboost's MCP environment."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp_support import free_port, wait_until_up
from strands.tools.mcp import MCPClient

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import generate_tasks
from agentboost.envs.registry import make_environment
from agentboost.outcomes import REWARD_ERROR, Outcome
from agentboost.tokens.trajectory import TerminationReason

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
SERVE = [sys.executable, "-m", "agentboost.cli", "mcp", "serve", "--env", "arithmetic"]


def test_the_arithmetic_environment_served_over_stdio_trains_like_the_built_in_one(
    tmp_path, say, qwen_tokenizer
):
    tasks = generate_tasks(2)  # the served environment's first train tasks: the same ids and answers
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task.to_dict()) + "\n" for task in tasks))
    env = make_environment(
        "mcp",
        {
            "servers": [{"name": "arithmetic", "command": SERVE}],
            "tasks": str(path),
            "reset_tool": "start_task",
            "reward": {"tool": "end_task"},
            "template": "qwen3",
        },
    )
    task = tasks[1]
    expression = task.metadata["expression"]
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    engine = ScriptedEngine([say(f"<tool_call>\n{call}\n</tool_call>"), say(f"Answer: {task.ground_truth}")])
    result = asyncio.run(env.run_episode(task, engine, qwen_tokenizer))
    assert result.termination is TerminationReason.COMPLETED, result.trajectory.termination_detail
    (tool,) = [m for m in result.trajectory.messages if m["role"] == "tool"]
    assert tool["content"] == str(task.ground_truth) and tool["metadata"]["server"] == "arithmetic"
    assert result.reward == 1.0  # the served environment's own reward, on the answer given to end_task
    prompt = qwen_tokenizer.decode(result.trajectory.token_ids[: result.trajectory.segments[0].end])
    assert '"name": "calculator"' in prompt and "end_task" not in prompt and "start_task" not in prompt


def test_http_sessions_are_separate_episodes_and_an_unnamed_session_is_refused():
    port = free_port()
    process = subprocess.Popen([*SERVE, "--http", f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    tasks = generate_tasks(2)

    def text(result):
        return result["content"][0]["text"]

    async def main():
        clients = [MCPClient(url=url, meta={"agentboost/episode": name}) for name in ("a", "b")]
        anonymous = MCPClient(url=url)
        for client in [*clients, anonymous]:
            client.start()
        try:
            assert sorted(tool.tool_name for tool in clients[0].list_tools_sync()) == [
                "calculator",
                "end_task",
                "start_task",
            ]
            for client, task in zip(clients, tasks, strict=True):
                started = await client.call_tool_async("s", "start_task", {"task_id": task.id})
                assert text(started) == task.text
            rewards = []
            for client, task in zip(clients, tasks, strict=True):  # each scored on its own task
                ended = await client.call_tool_async(
                    "e", "end_task", {"final_text": f"Answer: {task.ground_truth}"}
                )
                rewards.append(json.loads(text(ended))["reward"])
            refused = await anonymous.call_tool_async("x", "calculator", {"expression": "1 + 1"})
            return rewards, refused
        finally:
            for client in [*clients, anonymous]:
                client.stop(None, None, None)

    try:
        wait_until_up(url, process)
        rewards, refused = asyncio.run(main())
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert rewards == [1.0, 1.0]
    assert refused["status"] == "error" and "one episode per session" in text(refused)


@pytest.mark.parametrize(
    ("served", "outcome", "failure", "says"),
    [
        ("JudgeHasABug", Outcome.FAILED, REWARD_ERROR, "RuntimeError: the judge has a bug"),
        ("JudgeIsDown", Outcome.UNSCORABLE, None, "UnscorableError: the judge is down"),
    ],
)
def test_a_failing_reward_behind_mcp_serve_is_recorded_as_such_on_both_sides(
    tmp_path, say, qwen_tokenizer, served, outcome, failure, says
):
    """The served environment's reward raises: ``end_task`` says so, and the client records the same."""
    tests = Path(__file__).parents[2]
    python_path = os.pathsep.join([str(tests.parent), str(tests), os.environ.get("PYTHONPATH", "")])
    task = generate_tasks(1)[0]
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task.to_dict()) + "\n")
    command = [*SERVE[:-1], f"broken_envs:{served}"]
    env = make_environment(
        "mcp",
        {
            "servers": [{"name": "served", "command": command, "env": {"PYTHONPATH": python_path}}],
            "tasks": str(path),
            "reset_tool": "start_task",
            "reward": {"tool": "end_task"},
            "template": "qwen3",
        },
    )
    result = asyncio.run(env.run_episode(task, ScriptedEngine([say("Answer: 3")]), qwen_tokenizer))
    assert result.termination is TerminationReason.COMPLETED and result.reward is None
    assert (result.outcome, result.failure) == (outcome, failure)
    assert says in result.reward_error and "end_task" in result.reward_error
