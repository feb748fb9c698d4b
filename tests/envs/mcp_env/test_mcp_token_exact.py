"""Rollouts whose tool results come from a real MCP server pass the checks built-in tools pass."""

from __future__ import annotations

import asyncio

import pytest
import torch
from conftest import QUESTION, SYSTEM, TOOL_SCRIPT, memorize
from exactness_support import RecordingEngine, check_exactness
from mcp_support import FAULT_SERVER, http_server, stdio
from transformers import AutoModelForCausalLM

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.registry import make_environment
from agentboost.envs.task import Task
from agentboost.tokens.trajectory import TerminationReason

# slow: a tiny model memorises the MCP conversation first (minutes on a busy 2-core machine)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def environment(server):
    return make_environment(
        "mcp",
        {
            "servers": [server],
            "system_prompt": SYSTEM,
            "template": "qwen3",
            "reward": {"tool": "secret_reward"},
            "limits": {"max_turns": 8, "max_new_tokens": 64},
        },
    )


@pytest.fixture(scope="module")
def mcp_scripted(qwen_tokenizer, say):
    """The tool conversation of the built-in tests, with add and multiply served over MCP (stdio)."""
    engine = ScriptedEngine([say(text) for text in TOOL_SCRIPT])
    result = asyncio.run(
        environment(stdio(FAULT_SERVER)).run_episode(Task("q", QUESTION), engine, qwen_tokenizer)
    )
    assert result.termination is TerminationReason.COMPLETED
    return result.trajectory


@pytest.fixture(scope="module")
def mcp_memorized(mcp_scripted, tmp_path_factory):
    return memorize(mcp_scripted, tmp_path_factory.mktemp("mcp-memorized"))


@pytest.mark.parametrize("transport, temperature", [("stdio", 0.0), ("stdio", 0.7), ("http", 0.0)])
def test_mcp_tool_rollouts_are_token_exact(
    transport, temperature, mcp_memorized, mcp_scripted, qwen_tokenizer
):
    model = AutoModelForCausalLM.from_pretrained(mcp_memorized, dtype=torch.float32)
    engine = RecordingEngine(LocalEngine(model))
    sampling = SamplingParams(temperature=temperature, top_p=0.95, top_k=50, seed=11)

    def run(server):
        return asyncio.run(
            environment(server).run_episode(Task("q", QUESTION), engine, qwen_tokenizer, sampling=sampling)
        )

    if transport == "stdio":
        result = run(stdio(FAULT_SERVER))
    else:
        with http_server(FAULT_SERVER) as (url, _):
            result = run({"name": "tools", "url": url})
    trajectory = result.trajectory
    check_exactness(model, engine, trajectory, temperature=temperature)
    if temperature == 0:  # greedy: the model really calls the MCP tools and reads their answers
        assert [m["content"] for m in trajectory.messages if m["role"] == "tool"] == ["42", "84"]
        assert trajectory.token_ids == mcp_scripted.token_ids
        assert result.reward == 0.5
