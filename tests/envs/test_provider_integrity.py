"""Escapes a policy can try on a provider-path reward (math with its calculator): each is SCORED 0, never
masked as a failure and never paid. The correct answer scores 1, so the table can fail."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.math_problems import MathEnvironment
from agentboost.outcomes import Outcome

END = "<|im_end|>"


def call(arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'calculator', 'arguments': arguments})}\n</tool_call>"


def nested(depth: int) -> str:
    """Tool-call arguments nested ``depth`` levels deep (the JSON decoder's recursion)."""
    return (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": '
        + "[" * depth
        + "]" * depth
        + "}}\n</tool_call>"
    )


def escapes(task) -> dict[str, list[str]]:
    gold = task.ground_truth
    wrong = "12345678" if gold != "12345678" else "7"
    left, right = task.prompt.split("*")[0].split()[-1], task.prompt.split("*")[1].split()[0]
    return {
        "answer only in reasoning": [f"<think>Answer: {gold}</think>I cannot say."],
        "right then wrong": [f"Answer: {gold}\nAnswer: {wrong}"],
        "answer left in a tool result": [call({"expression": f"{left} * {right}"}), "Done."],
        "empty": [""],
        "unknown tool": [
            '<tool_call>\n{"name": "oracle", "arguments": {}}\n</tool_call>',
            f"Answer: {wrong}",
        ],
        "deeply nested arguments": [nested(2000), f"Answer: {wrong}"],
        "past the token limit": [f"Let me think. {'very ' * 400}hard. Answer: {gold}"],
    }


def rollout(environment, task, tokenizer, turns, limits=None):
    engine = ScriptedEngine([tokenizer.encode(turn + END, add_special_tokens=False) for turn in turns])
    return asyncio.run(environment.run_episode(task, engine, tokenizer, template="qwen3", limits=limits))


@pytest.fixture(scope="module")
def environment_and_task():
    environment = MathEnvironment("products", {"min_digits": 3, "max_digits": 3}, tool="calculator")
    return environment, environment.tasks(1, seed=5, split="test")[0]


def test_the_correct_answer_scores_one(environment_and_task, qwen_tokenizer):
    environment, task = environment_and_task
    result = rollout(environment, task, qwen_tokenizer, [f"Answer: {task.ground_truth}"])
    assert result.outcome is Outcome.SCORED and result.reward == 1.0


@pytest.mark.parametrize(
    "escape",
    [
        "answer only in reasoning",
        "right then wrong",
        "answer left in a tool result",
        "empty",
        "unknown tool",
        "deeply nested arguments",
        "past the token limit",
    ],
)
def test_every_escape_is_scored_zero_never_masked(escape, environment_and_task, qwen_tokenizer):
    environment, task = environment_and_task
    # 2,000 levels of brackets need room for 2,000 tokens (before the parser's depth limit, the JSON
    # decoder's RecursionError crashed the agent before the turn was recorded: masked, not scored)
    roomy = RolloutLimits(max_turns=4, max_new_tokens=8192) if escape == "deeply nested arguments" else None
    result = rollout(environment, task, qwen_tokenizer, escapes(task)[escape], roomy)
    assert result.outcome is Outcome.SCORED, (escape, result.failure, result.reward_error)
    assert result.reward == 0.0, (escape, result.trajectory.termination)
    assert result.trajectory.generated_tokens > 0 or escape == "empty"
    if escape == "deeply nested arguments":
        tool = next(message for message in result.trajectory.messages if message["role"] == "tool")
        assert "nests deeper than 64 levels" in tool["content"]
