"""What the strands-env and skyrl-gym adapters add to a rollout, against the same environment, native.

Both run strands-env's CalculatorEnv pieces on the zero-latency scripted engine (one calculator call, then
a boxed answer), one rollout at a time: the adapter (``strands-env:...CalculatorEnv``: a fresh strands-env
object, its reset/cleanup, the strands-env task and result built for its MathVerifyReward) and a native
agentboost Environment with the same prompt, the same strands-tools calculator and the same reward object
called directly. The difference per rollout is the adapter's overhead.

skyrl-gym: its GSM8kMultiTurnEnv through ``skyrl-gym:gsm8k_multi_turn`` (a fresh skyrl-gym object per
episode, its ``init``, each turn handed to ``step`` in a thread, the observation as the next user message)
against a native environment giving the same instruction and scoring with the same ``compute_score``
(two turns: a wrong answer, then the right one).

verifiers (``--verifiers PYTHON``, a virtual environment with verifiers 0.3.1): the test suite's
``vf.SingleTurnEnv`` (tests/integrations/verifiers_arithmetic.py) through ``verifiers:...`` (a gateway
session, the bridge subprocess importing verifiers and building the environment, its rubric) against a
native environment with the same prompt and the same exact-match reward. Use a few rollouts (``--rollouts
10``): each adapter rollout starts a Python process.

    python benchmarks/bench_adapters.py [--rollouts 200] [--skyrl-gym] [--verifiers PYTHON]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import Environment
from agentboost.envs.registry import make_environment
from agentboost.envs.task import Task
from agentboost.models.tokenizers import load_qwen3_tokenizer

CALCULATOR = "strands-env:strands_env.environments.calculator.env:CalculatorEnv"


class NativeCalculator(Environment):
    """CalculatorEnv's prompt, tool and reward as an agentboost environment."""

    name = "native-calculator"
    template = "qwen3"

    def __init__(self, system_prompt: str) -> None:
        from strands_env.environments.calculator.reward import MathVerifyReward
        from strands_tools.calculator import calculator

        self.system_prompt = system_prompt
        self.tool = calculator
        self.reward_object = MathVerifyReward()

    def tools(self, episode):
        return [self.tool]

    async def reward(self, trajectory, episode):
        from strands_env.core.types import RolloutResult
        from strands_env.core.types import Task as StrandsTask

        task = StrandsTask(id=episode.task.id, message=episode.task.text, context={"ground_truth": "42"})
        scored = await self.reward_object.compute(task, RolloutResult(messages=list(episode.messages)))
        return scored.reward


class NativeGSM8kMultiTurn(Environment):
    """GSM8kMultiTurnEnv's instruction and per-turn score as an agentboost environment."""

    name = "native-gsm8k-multi-turn"
    template = "qwen3"
    parser = "text"
    INSTRUCTION = (
        "Please provide your step-by-step reasoning, and also include a tentative numeric answer at the end "
        "in the exact format: '#### ANSWER'."
    )

    async def reset(self, task, *, sample=0):
        episode = await super().reset(task, sample=sample)
        episode.state["rewards"] = []
        return episode

    async def next_user_message(self, episode, messages):
        from skyrl_gym.envs.gsm8k.utils import compute_score

        reward = compute_score(messages[-1]["content"], "42", method="strict", format_score=0.04, score=1.0)
        episode.state["rewards"].append(reward)
        return None if reward == 1.0 else self.INSTRUCTION

    def reward(self, trajectory, episode):
        return float(sum(episode.state["rewards"]))


class NativeArithmetic(Environment):
    """verifiers_arithmetic.py's first row and exact-match rubric as an agentboost environment."""

    name = "native-arithmetic"
    template = "qwen3"
    system_prompt = "Answer with the number."

    def reward(self, trajectory, episode):
        return float(episode.task.ground_truth in trajectory.final_text)


def answer_script(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [[*tokenizer.encode("The answer is 42.", add_special_tokens=False), end]]


def gsm8k_script(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [[*tokenizer.encode(text, add_special_tokens=False), end] for text in ("#### 41", "#### 42")]


def script(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = {"name": "calculator", "arguments": {"expression": "12 + 30"}}
    turns = [f"<tool_call>\n{json.dumps(call)}\n</tool_call>", "The answer is \\boxed{42}."]
    return [[*tokenizer.encode(text, add_special_tokens=False), end] for text in turns]


async def per_rollout(
    environment, tokenizer, rollouts: int, turns=script, task=None, reward=1.0
) -> list[float]:
    engine = ScriptedEngine(turns(tokenizer), cycle=True)
    task = task or Task("add", "What is 12 + 30?", ground_truth="42")
    times = []
    for _ in range(rollouts):
        started = time.perf_counter()
        result = await environment.run_episode(task, engine, tokenizer)
        times.append(time.perf_counter() - started)
        assert result.reward == reward, result.trajectory.termination_detail
    return times


def compare(pairs, tokenizer, rollouts: int, **kwargs) -> None:
    """Median time per rollout of each (name, environment), the first native; the adapter's overhead."""
    for _, environment in pairs:  # warm both (imports, caches)
        asyncio.run(per_rollout(environment, tokenizer, 5, **kwargs))
    figures = {}
    for name, environment in pairs:
        times = asyncio.run(per_rollout(environment, tokenizer, rollouts, **kwargs))
        figures[name] = statistics.median(times)
        p90 = sorted(times)[int(0.9 * len(times))]
        print(f"{name:22s} median {figures[name] * 1e3:7.2f} ms/rollout  (p90 {p90 * 1e3:.2f} ms)")
    (native, _), (adapter, _) = pairs
    overhead = figures[adapter] - figures[native]
    load = os.getloadavg()[0]
    print(f"adapter overhead       {overhead * 1e3:7.2f} ms/rollout ({rollouts} rollouts; load {load:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--skyrl-gym", action="store_true", help="also measure the skyrl-gym adapter")
    parser.add_argument("--verifiers", metavar="PYTHON", help="also measure the verifiers adapter (its venv)")
    args = parser.parse_args()
    tokenizer = load_qwen3_tokenizer()
    with tempfile.TemporaryDirectory() as directory:
        tasks = os.path.join(directory, "tasks.jsonl")
        with open(tasks, "w") as file:
            file.write(
                json.dumps({"id": "add", "message": "What is 12 + 30?", "context": {"ground_truth": "42"}})
            )
        adapter = make_environment(CALCULATOR, {"tasks": tasks, "template": "qwen3"})
        native = NativeCalculator(adapter.system_prompt or "")
        compare([("native", native), ("strands-env adapter", adapter)], tokenizer, args.rollouts)
        if args.skyrl_gym:
            rows = os.path.join(directory, "gsm8k.jsonl")
            with open(rows, "w") as file:
                row = {"id": "q", "prompt": "6 * 7?", "reward_spec": {"ground_truth": "42"}, "extra_info": {}}
                file.write(json.dumps(row))
            adapter = make_environment("skyrl-gym:gsm8k_multi_turn", {"tasks": rows, "template": "qwen3"})
            pairs = [("native", NativeGSM8kMultiTurn()), ("skyrl-gym adapter", adapter)]
            compare(pairs, tokenizer, args.rollouts, turns=gsm8k_script, task=adapter.tasks()[0], reward=1.04)
    if args.verifiers:
        module = Path(__file__).parents[1] / "tests" / "integrations" / "verifiers_arithmetic.py"
        adapter = make_environment(f"verifiers:{module}", {"python": args.verifiers, "template": "qwen3"})
        task = adapter.tasks()[0]
        pairs = [("native", NativeArithmetic()), ("verifiers adapter", adapter)]
        compare(pairs, tokenizer, args.rollouts, turns=answer_script, task=task)


if __name__ == "__main__":
    main()
