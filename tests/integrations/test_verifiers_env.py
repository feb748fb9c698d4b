"""verifiers environments (``vf.SingleTurnEnv`` and ``vf.ToolEnv`` with a ``vf.Rubric``, written in
verifiers' style in verifiers_arithmetic.py) run through ``--env verifiers:...``: verifiers' own rollout
logic in its virtual environment, agentboost's gateway as its model client, its rubric as the reward.

Needs a virtual environment with verifiers 0.3.1 (verifiers pins an mcp that agentboost's cannot share):
``python3 -m venv V && V/bin/pip install verifiers==0.3.1`` and ``AGENTBOOST_VERIFIERS_PYTHON=V/bin/python``.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from conftest import train_one_grpo_step
from exactness_support import RecordingEngine

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.registry import make_environment
from agentboost.errors import ConfigError
from agentboost.eval.evaluate import evaluate
from agentboost.integrations.verifiers_env import VERIFIERS_PYTHON_VARIABLE
from agentboost.rollout.results import read_results
from agentboost.tokens.trajectory import TerminationReason

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get(VERIFIERS_PYTHON_VARIABLE),
        reason=f"set {VERIFIERS_PYTHON_VARIABLE} (see the docstring)",
    ),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

ARITHMETIC = f"verifiers:{Path(__file__).with_name('verifiers_arithmetic.py')}"


def generated_text(qwen_tokenizer, trajectory) -> str:
    return qwen_tokenizer.decode(
        [token for token, bit in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if bit]
    )


def test_a_single_turn_environment_is_scored_by_its_rubric(qwen_tokenizer, say):
    env = make_environment(ARITHMETIC, {"template": "qwen3"})
    tasks = env.tasks()
    assert [task.id for task in tasks] == ["0", "1"] and tasks[0].ground_truth == "42"
    assert [task.id for task in env.tasks(split="test")] == ["0"]
    result = asyncio.run(
        env.run_episode(tasks[0], ScriptedEngine([say("The answer is 42.")]), qwen_tokenizer)
    )
    trajectory = result.trajectory
    assert result.termination is TerminationReason.COMPLETED, trajectory.termination_detail
    assert result.reward == 1.0 and result.reward_breakdown["exact"] == 1.0  # verifiers' Rubric scored it
    assert generated_text(qwen_tokenizer, trajectory) == "The answer is 42.<|im_end|>"
    system = qwen_tokenizer.decode(trajectory.token_ids[: trajectory.segments[0].end])
    assert "Answer with the number." in system and "What is 12 + 30?" in system  # verifiers' own prompt
    wrong = asyncio.run(env.run_episode(tasks[0], ScriptedEngine([say("It is 41.")]), qwen_tokenizer))
    assert wrong.reward == 0.0


def test_a_tool_environment_runs_its_tools_through_the_gateway_in_one_exact_row(qwen_tokenizer, say):
    env = make_environment(ARITHMETIC, {"template": "qwen3", "env_args": {"kind": "tools"}})

    def script(prompt_ids, index):
        if "<tool_response>" in qwen_tokenizer.decode(prompt_ids).rsplit("<|im_start|>user", 1)[-1]:
            return say("The answer is 42.")
        call = {"name": "add", "arguments": {"a": 12, "b": 30}}
        return say(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")

    call = {"name": "add", "arguments": {"a": 12, "b": 30}}
    engine = RecordingEngine(ScriptedEngine(script))
    result = asyncio.run(env.run_episode(env.tasks()[0], engine, qwen_tokenizer))
    trajectory = result.trajectory
    assert result.termination is TerminationReason.COMPLETED, trajectory.termination_detail
    assert result.reward == 1.0
    assert [m["content"] for m in trajectory.messages if m["role"] == "tool"] == ["42"]  # verifiers ran add
    assert len(engine.prompts) == 2  # one session, one row: each prompt extends the one before
    for earlier, later in zip(engine.prompts, [*engine.prompts[1:], trajectory.token_ids], strict=True):
        assert later[: len(earlier)] == earlier
    assert generated_text(qwen_tokenizer, trajectory).count("<|im_end|>") == 2
    assert all(
        (logprob is None) == (bit == 0)
        for logprob, bit in zip(trajectory.logprobs, trajectory.loss_mask, strict=True)
    )
    # a model that only calls tools meets the ToolEnv's max_turns (3): agentboost's max_turns
    looping = ScriptedEngine([say(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")], cycle=True)
    result = asyncio.run(env.run_episode(env.tasks()[0], looping, qwen_tokenizer))
    assert result.termination is TerminationReason.MAX_TURNS and result.trajectory.metrics["turns"] == 3
    assert "max_turns_reached" in result.trajectory.termination_detail and result.reward == 0.0


def test_eval_a_grpo_step_and_bad_configuration(qwen_tokenizer, say, tmp_path, monkeypatch):
    env = make_environment(ARITHMETIC, {"template": "qwen3"})
    engine = ScriptedEngine([say("The answer is 42.")], cycle=True)
    report, summary = asyncio.run(
        evaluate(
            env, engine, qwen_tokenizer, env.tasks(split="test"), out=tmp_path / "eval.jsonl", progress=False
        )
    )
    assert summary.completed == 1 and report["pass@k"]["1"] == 1.0

    rollouts = train_one_grpo_step(qwen_tokenizer, tmp_path, ARITHMETIC, {"template": "qwen3"}, train_tasks=2)
    results = [r for path in rollouts.glob("*.jsonl") for r in read_results(path)]
    assert len(results) == 4 and {r.trajectory.info["environment"] for r in results} == {"verifiers"}

    with pytest.raises(ConfigError, match="cannot load the verifiers environment"):
        make_environment("verifiers:no_such_module", {}).tasks()
    monkeypatch.delenv(VERIFIERS_PYTHON_VARIABLE)
    with pytest.raises(ConfigError, match=VERIFIERS_PYTHON_VARIABLE):
        make_environment(ARITHMETIC, {})
