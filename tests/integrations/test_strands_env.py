"""strands-env's own CalculatorEnv (its prompt, the strands-tools calculator, its math-verify reward) run
through ``--env strands-env:...`` on agentboost's agent loop: rollout, eval, a GRPO step."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import train_one_grpo_step
from exactness_support import RecordingEngine

pytest.importorskip("strands_env")

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.registry import environment_reference, make_environment
from agentboost.errors import ConfigError
from agentboost.eval.evaluate import evaluate
from agentboost.integrations.strands_env import TERMINATIONS
from agentboost.rollout.results import read_results
from agentboost.tokens.trajectory import TerminationReason

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CALCULATOR = "strands-env:strands_env.environments.calculator.env:CalculatorEnv"
ROWS = [
    {"id": "add", "message": "What is 12 + 30?", "context": {"ground_truth": "42"}},
    {"id": "mul", "message": "What is 6 * 7 * 2?", "context": {"ground_truth": "84"}},
]


@pytest.fixture
def kwargs(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return {"tasks": str(tasks), "config": {"max_tool_iters": 2}, "template": "qwen3"}


def calculator_user(qwen_tokenizer, say):
    """Calls the calculator on the question's expression, then answers with the tool's number boxed."""

    def script(prompt_ids, index):
        text = qwen_tokenizer.decode(prompt_ids)
        last_user = text.rsplit("<|im_start|>user", 1)[-1]
        if "<tool_response>" in last_user:
            answer = last_user.split("<tool_response>", 1)[1].split("</tool_response>", 1)[0]
            return say(f"The answer is \\boxed{{{answer.split(':')[-1].strip()}}}.")
        expression = text.rsplit("What is ", 1)[1].split("?", 1)[0]
        call = {"name": "calculator", "arguments": {"expression": expression}}
        return say(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")

    return script


def test_a_strands_env_environment_runs_token_exact_with_its_tools_prompt_and_reward(
    kwargs, qwen_tokenizer, say
):
    env = make_environment(CALCULATOR, kwargs)
    assert "calculator tool" in env.system_prompt and env.limits.max_turns == 3
    assert environment_reference(env) == "agentboost.integrations.strands_env:StrandsEnvEnvironment"
    tasks = env.tasks()
    engine = RecordingEngine(ScriptedEngine(calculator_user(qwen_tokenizer, say)))
    result = asyncio.run(env.run_episode(tasks[0], engine, qwen_tokenizer))
    trajectory = result.trajectory
    assert result.termination is TerminationReason.COMPLETED, trajectory.termination_detail
    assert result.reward == 1.0  # strands-env's MathVerifyReward on \boxed{42}
    tool = next(message for message in trajectory.messages if message["role"] == "tool")
    assert "42" in tool["content"]  # the strands-tools calculator really ran
    # token-exact: every prompt extends the previous one, and the loss mask covers exactly what was generated
    assert len(engine.prompts) == 2
    for earlier, later in zip(engine.prompts, [*engine.prompts[1:], trajectory.token_ids], strict=True):
        assert later[: len(earlier)] == earlier
    generated = [trajectory.token_ids[i] for i, bit in enumerate(trajectory.loss_mask) if bit]
    assert qwen_tokenizer.decode(generated).count("<|im_end|>") == 2
    assert all(
        value is not None for value, bit in zip(trajectory.logprobs, trajectory.loss_mask, strict=True) if bit
    )


def test_limits_terminations_and_bad_configuration(kwargs, qwen_tokenizer, say):
    env = make_environment(CALCULATOR, {**kwargs, "config": {"max_tool_iters": 0}})
    looping = ScriptedEngine(
        [say('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>')],
        cycle=True,
    )
    result = asyncio.run(env.run_episode(env.tasks()[0], looping, qwen_tokenizer))
    assert result.termination is TerminationReason.MAX_TURNS
    assert TERMINATIONS[TerminationReason.MAX_TURNS] == "max_tool_iterations_reached"
    from strands_env.core.types import TerminationReason as StrandsTermination

    assert {StrandsTermination(value) for value in TERMINATIONS.values()} <= set(StrandsTermination)
    with pytest.raises(ConfigError, match=r"not a strands_env\.core\.Environment subclass"):
        make_environment("strands-env:json:JSONDecoder", kwargs)
    with pytest.raises(ConfigError, match="needs what to run"):
        make_environment("strands-env:", kwargs)
    with pytest.raises(ConfigError, match="not a strands-env task"):
        bad = {**kwargs, "tasks": kwargs["tasks"] + ".bad"}
        with open(bad["tasks"], "w") as file:
            file.write('{"id": "x"}\n')
        make_environment(CALCULATOR, bad).tasks()
    with pytest.raises(ConfigError, match="max_parallel_tool_calls"):
        make_environment(CALCULATOR, {**kwargs, "config": {"max_parallel_tool_calls": 2}})


def test_eval_and_a_grpo_step_on_a_strands_env_environment(kwargs, qwen_tokenizer, say, tmp_path):
    env = make_environment(CALCULATOR, kwargs)
    engine = ScriptedEngine(calculator_user(qwen_tokenizer, say))
    report, summary = asyncio.run(
        evaluate(env, engine, qwen_tokenizer, env.tasks(), out=tmp_path / "eval.jsonl", progress=False)
    )
    assert summary.completed == 2 and report["pass@k"]["1"] == 1.0

    rollouts = train_one_grpo_step(qwen_tokenizer, tmp_path, CALCULATOR, kwargs, train_tasks=2)
    results = [r for path in rollouts.glob("*.jsonl") for r in read_results(path)]
    assert len(results) == 4 and {r.trajectory.info["environment"] for r in results} == {"strands-env"}
