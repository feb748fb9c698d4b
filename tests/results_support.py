"""Results files for the eval / stats / export / view tests: real rollouts, and hand-built ones.

``scripted_results`` runs real agents (real Qwen3 tokenizer and template, real Strands tools, real
parse errors) against scripted model output, including output that tries to break an HTML page.
``ToolEnvironment`` is importable as ``results_support:ToolEnvironment`` for CLI runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from strands import tool

from agentboost.agent.provider import RolloutLimits
from agentboost.agent.rollout import run_agent
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import Environment, Reward, RolloutResult
from agentboost.rollout.results import ResultStore

QUESTION = "What is (12 + 30) * 2?"
SYSTEM = "You are a careful calculator agent."
HOSTILE = "</textarea></script><script>window.__pwned = 1; console.error('pwned')</script><b>bold</b>"


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


class ToolEnvironment(Environment):
    """Two tasks asking the memorised question; reward 1 for ``Answer: 84``."""

    name = "tooltest"
    system_prompt = SYSTEM
    template = "qwen3"
    limits = RolloutLimits(max_turns=6, max_new_tokens=96)

    def tools(self):
        return [add, multiply]

    def tasks(self, n=None, *, seed=0, split="train"):
        return [{"id": f"{split}-{i}", "question": QUESTION} for i in range(2)][:n]

    def prompt(self, task):
        return task["question"]

    def reward(self, trajectory, task):
        correct = "Answer: 84" in trajectory.final_text
        return Reward(float(correct), {"correct": float(correct)})


GOOD = [
    'I will add first.\n<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>',
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 42, "b": 2}}\n</tool_call>',
    "The result is 84.\nAnswer: 84",
]
SCRIPTS = {
    # task -> sample -> the model's turns
    "t-good": [GOOD, GOOD, ["<think>Just guess.</think>Answer: 80"]],
    "t-bad": [
        ['<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>', "Answer: 84"],  # parse error
        [HOSTILE],
        ['<tool_call>\n{"name": "divide", "arguments": {"a": 1}}\n</tool_call>', "I give up."],
    ],
}


def _one(tokenizer, im_end: int, turns: list[str], task_id: str, sample: int) -> RolloutResult:
    environment = ToolEnvironment()
    engine = ScriptedEngine(
        [[*tokenizer.encode(text, add_special_tokens=False), im_end] for text in turns],
        logprob=-0.25,
    )
    trajectory = asyncio.run(
        run_agent(
            engine,
            tokenizer,
            QUESTION,
            system_prompt=SYSTEM,
            tools=[add, multiply],
            template="qwen3",
            limits=RolloutLimits(max_turns=6),
            task_id=task_id,
            info={"environment": "results_support:ToolEnvironment", "sample": sample},
        )
    )
    reward, breakdown, error = asyncio.run(environment.score(trajectory, {"id": task_id}))
    if task_id == "t-bad" and sample == 2:  # a reward that could not be computed: unscored
        reward, breakdown, error = None, {}, "RuntimeError: grader unavailable"
    trajectory.reward = reward
    return RolloutResult(task_id, sample, trajectory, reward, breakdown, error)


def scripted_results(tokenizer, path: Path) -> Path:
    """Six real rollouts (2 tasks x 3 samples) written through the runner's ResultStore."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with ResultStore(path, resume=False) as store:
        for task_id, samples in SCRIPTS.items():
            for sample, turns in enumerate(samples):
                store.write(_one(tokenizer, im_end, turns, task_id, sample))
    return path
