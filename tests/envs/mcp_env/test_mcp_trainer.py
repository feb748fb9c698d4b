"""The local trainer runs a GRPO step on an MCP environment: stdio servers per episode, a hidden reward."""

from __future__ import annotations

import pytest
from conftest import tiny_qwen3
from mcp_support import STORE_KWARGS, descendants

from agentboost.rollout.results import read_results
from agentboost.train.config import config_from_dict
from agentboost.train.trainer import Trainer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_a_training_step_on_an_mcp_environment(qwen_tokenizer, tmp_path):
    model_dir = tmp_path / "tiny"
    tiny_qwen3(seed=0, hidden=64).save_pretrained(model_dir)
    qwen_tokenizer.save_pretrained(model_dir)
    config = config_from_dict(
        {
            "model": {"name_or_path": str(model_dir)},
            "environment": {"name": "mcp", "kwargs": STORE_KWARGS, "train_tasks": 8},
            "rollout": {"tasks_per_step": 2, "group_size": 2, "max_turns": 2, "max_new_tokens": 8},
            "eval": {"every": 0},
            "checkpoint": {"every": 1, "save_final_model": False},
            "logging": {"progress": False},
            "steps": 1,
            "output_dir": str(tmp_path / "run"),
        }
    )
    before = descendants()
    summary = Trainer(config).train()
    assert summary.steps == 1
    results = [
        result for path in (tmp_path / "run" / "rollouts").glob("*.jsonl") for result in read_results(path)
    ]
    assert len(results) == 4 and all(result.reward is not None for result in results)
    assert all(result.trajectory.info["mcp_episode"] for result in results)
    assert descendants() - before == set()
