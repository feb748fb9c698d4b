"""The local trainer runs a GRPO step on an MCP environment: stdio servers per episode, a hidden reward."""

from __future__ import annotations

import pytest
from conftest import train_one_grpo_step
from mcp_support import STORE_KWARGS, descendants

from agentboost.rollout.results import read_results

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_a_training_step_on_an_mcp_environment(qwen_tokenizer, tmp_path):
    before = descendants()
    rollouts = train_one_grpo_step(qwen_tokenizer, tmp_path, "mcp", STORE_KWARGS, train_tasks=8)
    results = [result for path in rollouts.glob("*.jsonl") for result in read_results(path)]
    assert len(results) == 4 and all(result.reward is not None for result in results)
    assert all(result.trajectory.info["mcp_episode"] for result in results)
    assert descendants() - before == set()
