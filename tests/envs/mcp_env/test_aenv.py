"""The AEnvironment adapter against real ``python -m aenv.main`` servers (their own virtual environment).

Set AGENTBOOST_AENV_PYTHON to a Python with ``aenvironment==0.1.7`` (``.ci/run`` builds one); without it
these tests skip locally, and fail where AGENTBOOST_REQUIRE_AENV=1 (CI).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path

import psutil
import pytest
from mcp_support import STORE_SERVER, descendants

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.mcp.aenv import AEnvServer
from agentboost.envs.registry import make_environment
from agentboost.envs.task import Task
from agentboost.errors import ConfigError
from agentboost.tokens.trajectory import TerminationReason

PYTHON = os.environ.get("AGENTBOOST_AENV_PYTHON")
if not (PYTHON and Path(PYTHON).exists()):
    if os.environ.get("AGENTBOOST_REQUIRE_AENV") == "1":
        raise RuntimeError(f"AGENTBOOST_REQUIRE_AENV=1 but AGENTBOOST_AENV_PYTHON={PYTHON!r} is not a Python")
    pytest.skip("no AEnvironment venv: set AGENTBOOST_AENV_PYTHON (see .ci/run)", allow_module_level=True)

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings(
        "ignore:coroutine .MCPClient.stop:RuntimeWarning"
    ),  # Strands, on a dead server
]
DIRECTORY = STORE_SERVER.parent / "aenv_store"


def restock(k: int) -> Task:
    return Task(
        f"restock-{k}", f"Restock W-1 with {k} units.", metadata={"expected": {"stock": {"W-1": 10 + k}}}
    )


def restocker(qwen_tokenizer, say, before_call=None):
    def script(prompt_ids, index):
        text = qwen_tokenizer.decode(prompt_ids)
        if "<tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
            return say("Restocked.")
        if before_call is not None:
            before_call()
        amount = int(re.findall(r"Restock W-1 with (\d+) units", text)[-1])
        call = {"name": "restock", "arguments": {"sku": "W-1", "quantity": amount}}
        return say(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")

    return ScriptedEngine(script)


def environment(**kwargs):
    return make_environment(
        "aenv",
        {
            "python": PYTHON,
            "reset_function": "start_task",
            "template": "qwen3",
            "first_address": 40,
            **kwargs,
        },
    )


def aenv_servers() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "aenv.main" in " ".join(p.cmdline())]


def test_local_servers_one_per_concurrent_episode_reset_between_episodes(say, qwen_tokenizer):
    before = descendants()
    env = environment(directory=str(DIRECTORY), max_servers=2)
    engine = restocker(qwen_tokenizer, say)

    async def main():
        first = await asyncio.gather(*(env.run_episode(restock(k), engine, qwen_tokenizer) for k in (1, 2)))
        addresses = {" ".join(p.cmdline()).split("--host ")[1].split()[0] for p in aenv_servers()}
        # the same two servers serve two more episodes: the reset function gives each a fresh shop
        second = await asyncio.gather(*(env.run_episode(restock(k), engine, qwen_tokenizer) for k in (3, 4)))
        return first + second, addresses

    try:
        results, addresses = asyncio.run(main())
        assert addresses == {"127.0.0.40", "127.0.0.41"} and len(aenv_servers()) == 2
    finally:
        env.close()
    for k, result in zip((1, 2, 3, 4), results, strict=True):
        assert result.termination is TerminationReason.COMPLETED, result.trajectory.termination_detail
        (tool,) = [m for m in result.trajectory.messages if m["role"] == "tool"]
        assert (
            tool["content"] == f"W-1 now has {10 + k} units in stock" and tool["metadata"]["server"] == "aenv"
        )
        assert result.reward == 1.0 and result.reward_breakdown == {"stock:W-1": 1.0}
    assert descendants() - before == set()


def test_a_remote_instance_and_a_server_that_dies_mid_episode(say, qwen_tokenizer):
    server = AEnvServer.start(PYTHON, DIRECTORY.resolve(), "127.0.0.45", 8081, timeout_s=180)
    try:
        env = environment(url=server.base_url)
        result = asyncio.run(env.run_episode(restock(5), restocker(qwen_tokenizer, say), qwen_tokenizer))
        assert result.termination is TerminationReason.COMPLETED and result.reward == 1.0
        # the instance's process dies just before the model's tool call reaches it
        result = asyncio.run(
            env.run_episode(restock(6), restocker(qwen_tokenizer, say, server.process.kill), qwen_tokenizer)
        )
        assert result.termination is TerminationReason.ENV_ERROR and result.reward is None
        assert "was lost during tool 'restock'" in result.trajectory.termination_detail
    finally:
        server.stop()


def test_bad_configuration_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of 'directory'"):
        make_environment("aenv", {})
    with pytest.raises(ConfigError, match="AGENTBOOST_AENV_PYTHON"):
        make_environment("aenv", {"directory": str(DIRECTORY), "python": str(tmp_path / "nope")})


def test_a_built_in_environment_packaged_as_an_aenvironment_directory(tmp_path, say, qwen_tokenizer):
    """examples/mcp/aenv_arithmetic serves agentboost's arithmetic environment through aenv.main."""
    probe = subprocess.run(
        [PYTHON, "-c", "import agentboost.envs.mcp.serve"], capture_output=True, check=False
    )
    if probe.returncode and os.environ.get("AGENTBOOST_REQUIRE_AENV") != "1":
        pytest.skip("the AEnvironment venv cannot import agentboost (see .ci/run for its install)")
    from agentboost.envs.arithmetic import generate_tasks

    tasks = generate_tasks(2)
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task.to_dict()) + "\n" for task in tasks))
    env = environment(directory=str(DIRECTORY.parent / "aenv_arithmetic"), tasks=str(path), first_address=50)
    task = tasks[1]
    call = json.dumps({"name": "calculator", "arguments": {"expression": task.metadata["expression"]}})
    engine = ScriptedEngine([say(f"<tool_call>\n{call}\n</tool_call>"), say(f"Answer: {task.ground_truth}")])
    try:
        result = asyncio.run(env.run_episode(task, engine, qwen_tokenizer))
    finally:
        env.close()
    assert result.termination is TerminationReason.COMPLETED, result.trajectory.termination_detail
    (tool,) = [m for m in result.trajectory.messages if m["role"] == "tool"]
    assert tool["content"] == str(task.ground_truth)
    assert result.reward == 1.0  # the arithmetic environment's own reward, computed inside the aenv server
