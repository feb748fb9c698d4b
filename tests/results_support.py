"""Results files for the eval / stats / export / view tests: real rollouts, and hand-built ones.

``scripted_results`` runs real agents (real Qwen3 tokenizer and template, real Strands tools, real
parse errors) against scripted model output, including output that tries to break an HTML page.
``ToolEnvironment`` is importable as ``results_support:ToolEnvironment`` for CLI runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from strands import tool

from agentboost.agent.episode import run_agent
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import Environment, Episode, Reward, RewardFailure, RolloutResult, Task
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

    def tools(self, episode):
        return [add, multiply]

    def tasks(self, n=None, *, seed=0, split="train"):
        return [Task(f"{split}-{i}", QUESTION) for i in range(2)][:n]

    def reward(self, trajectory, episode):
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
    outcome = asyncio.run(environment.score(trajectory, Episode(Task(task_id, QUESTION), sample)))
    if task_id == "t-bad" and sample == 2:  # the grader was down: unscorable
        outcome = RewardFailure("UnscorableError: grader unavailable", unscorable=True)
    if isinstance(outcome, RewardFailure):
        return RolloutResult(
            task_id, sample, trajectory, None, reward_error=outcome.detail, unscorable=outcome.unscorable
        )
    return RolloutResult(task_id, sample, trajectory, outcome.value, outcome.breakdown, outcome.info)


def scripted_results(tokenizer, path: Path) -> Path:
    """Six real rollouts (2 tasks x 3 samples) written through the runner's ResultStore."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with ResultStore(path, resume=False) as store:
        for task_id, samples in SCRIPTS.items():
            for sample, turns in enumerate(samples):
                store.write(_one(tokenizer, im_end, turns, task_id, sample))
    return path


# --- hand-built coding-style rollouts with known counts (the stats fixture) ----------------------


def _hand(
    task_id, sample, *, reward, calls=(), breakdown=None, info=None, ending="completed", parse=(), turns=1
):
    """A rollout built by hand: ``calls`` are (tool, status | None, error, duration_s | None)."""
    from agentboost.tokens.trajectory import Segment, Trajectory

    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Solve it."}]
    for number, (name, status, error, duration) in enumerate(calls):
        call_id = f"call_{task_id}_{sample}_{number}"
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": {}}}
                ],
            }
        )
        tool_message = {"role": "tool", "tool_call_id": call_id, "name": name, "content": f"{status}"}
        metadata = {}
        if status is not None:
            metadata["status"] = status
        if duration is not None:
            metadata["duration_s"] = duration
        if metadata:
            tool_message["metadata"] = metadata
        if error:
            tool_message["error"] = True
        messages.append(tool_message)
    for _kind in parse:
        messages.append({"role": "assistant", "content": "<tool_call>oops</tool_call>"})
        messages.append(
            {"role": "tool", "tool_call_id": "x", "name": None, "content": "Error", "error": True}
        )
    messages.append({"role": "assistant", "content": "```python\nprint(1)\n```"})
    segments = [Segment("prompt", 0, 4, 0), Segment("assistant", 4, 8, 1, "stop", list(parse))]
    trajectory = Trajectory(
        task_id=task_id,
        messages=messages,
        token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
        loss_mask=[0, 0, 0, 0, 1, 1, 1, 1],
        logprobs=[None] * 4 + [-0.1, -2.5, -0.01, -7.0],
        segments=segments,
        termination=ending,
        metrics={
            "turns": turns,
            "tool_calls": len(calls),
            "parse_errors": len(parse),
            "generated_tokens": 4,
            "prompt_tokens": 4,
            "total_tokens": 8,
            "latency_s": 1.0 + sample,
        },
        info={"environment": "coding"},
    )
    error = "grader crashed" if reward is None else None
    return RolloutResult(task_id, sample, trajectory, reward, dict(breakdown or {}), dict(info or {}), error)


def coding_fixture() -> list[RolloutResult]:
    """Six rollouts; the counts each table must show are written out in tests/eval/test_stats.py."""

    def coding(submitted, tested, passed, total):
        return {
            "submitted": float(submitted),
            "tested_before_submit": float(tested),
            "tests_passed": float(passed),
            "tests_total": float(total),
        }

    return [
        _hand(
            "a",
            0,
            reward=1.0,
            turns=3,
            calls=[("run_tests", "wrong_output", False, 0.5), ("run_tests", "passed", False, 1.5)],
            breakdown=coding(1, 1, 5, 5),
        ),
        _hand(
            "a", 1, reward=0.0, breakdown=coding(1, 0, 2, 5), info={"first_failure_status": "wrong_output"}
        ),
        _hand(
            "b",
            0,
            reward=0.0,
            ending="max_turns",
            calls=[("run_tests", "compile_error", True, None)],
            breakdown=coding(0, 0, 0, 4),
            parse=["bad_json"],
        ),
        _hand(
            "b",
            1,
            reward=1.0,
            calls=[
                ("run_tests", "timeout", False, None),
                ("run_tests", "runtime_error", False, None),
                ("read_file", None, False, None),
                ("run_tests", "passed", False, None),
            ],
            breakdown=coding(1, 1, 3, 3),
        ),
        _hand("c", 0, reward=None, ending="engine_error"),
        _hand(
            "c",
            1,
            reward=0.0,
            calls=[("read_file", None, True, None)],
            breakdown=coding(1, 0, 0, 4),
            info={"first_failure_status": "runtime_error"},
            parse=["bad_json", "unknown_tool"],
        ),
    ]
