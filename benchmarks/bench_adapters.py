"""What the strands-env adapter adds to a rollout, against the same environment written natively.

Both run strands-env's CalculatorEnv pieces on the zero-latency scripted engine (one calculator call, then
a boxed answer), one rollout at a time: the adapter (``strands-env:...CalculatorEnv``: a fresh strands-env
object, its reset/cleanup, the strands-env task and result built for its MathVerifyReward) and a native
agentboost Environment with the same prompt, the same strands-tools calculator and the same reward object
called directly. The difference per rollout is the adapter's overhead.

    python benchmarks/bench_adapters.py [--rollouts 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time

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


def script(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = {"name": "calculator", "arguments": {"expression": "12 + 30"}}
    turns = [f"<tool_call>\n{json.dumps(call)}\n</tool_call>", "The answer is \\boxed{42}."]
    return [[*tokenizer.encode(text, add_special_tokens=False), end] for text in turns]


async def per_rollout(environment, tokenizer, rollouts: int) -> list[float]:
    engine = ScriptedEngine(script(tokenizer), cycle=True)
    task = Task("add", "What is 12 + 30?", ground_truth="42")
    times = []
    for _ in range(rollouts):
        started = time.perf_counter()
        result = await environment.run_episode(task, engine, tokenizer)
        times.append(time.perf_counter() - started)
        assert result.reward == 1.0, result.trajectory.termination_detail
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
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
        asyncio.run(per_rollout(native, tokenizer, 5))  # warm both (imports, sympy caches)
        asyncio.run(per_rollout(adapter, tokenizer, 5))
        figures = {}
        for name, environment in (("native", native), ("strands-env adapter", adapter)):
            times = asyncio.run(per_rollout(environment, tokenizer, args.rollouts))
            figures[name] = statistics.median(times)
            p90 = sorted(times)[int(0.9 * len(times))]
            print(f"{name:22s} median {figures[name] * 1e3:7.2f} ms/rollout  (p90 {p90 * 1e3:.2f} ms)")
    overhead = figures["strands-env adapter"] - figures["native"]
    load = os.getloadavg()[0]
    print(
        f"adapter overhead       {overhead * 1e3:7.2f} ms/rollout ({args.rollouts} rollouts; load {load:.2f})"
    )


if __name__ == "__main__":
    main()
