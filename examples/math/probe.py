"""Probe a model on the math environment: how often it calls the tool, gets the format, gets the answer.

    python examples/math/probe.py [MODEL] [--tasks 32] [--split test] [--temperature 0]

Prints one line per problem kind of outcome and the rates; writes the results JSONL next to OUT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import torch

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.envs.math_problems import extract_answer
from agentboost.envs.registry import make_environment
from agentboost.models.tokenizers import load_tokenizer


def tool_calls(result) -> int:
    return sum(
        len(m.get("tool_calls") or []) for m in result.trajectory.messages if m.get("role") == "assistant"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    parser.add_argument(
        "--env-kwargs",
        default='{"generators": "products", "config": {"min_digits": 3, '
        '"max_digits": 3}, "tool": "calculator"}',
    )
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--split", default="test")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default="runs/probe.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(2)
    environment = make_environment("math", json.loads(args.env_kwargs))
    engine = LocalEngine.from_pretrained(args.model, max_batch_size=64)
    tokenizer = load_tokenizer(args.model)
    tasks = environment.tasks(args.tasks, split=args.split)
    limits = RolloutLimits(max_turns=3, max_new_tokens=args.max_new_tokens)
    sampling = SamplingParams(temperature=args.temperature)
    started = time.perf_counter()
    results = await asyncio.gather(
        *(
            environment.run_episode(task, engine, tokenizer, sampling=sampling, limits=limits)
            for task in tasks
        )
    )
    seconds = time.perf_counter() - started
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as handle:
        for result in results:
            handle.write(json.dumps(result.to_dict()) + "\n")
    n = len(results)
    used_tool = sum(tool_calls(r) > 0 for r in results)
    formatted = sum(extract_answer(r.trajectory.final_text) is not None for r in results)
    correct = sum(r.reward or 0.0 for r in results)
    tokens = sum(r.trajectory.generated_tokens for r in results)
    print(
        f"{args.model}: tool use {used_tool}/{n}, answer line {formatted}/{n}, correct {correct:.0f}/{n} "
        f"| {seconds:.1f} s, {tokens} generated tokens"
    )
    for result in results[:4]:
        print("---", [m.get("content") or m.get("tool_calls") for m in result.trajectory.messages[2:]])
    engine.close()


if __name__ == "__main__":
    asyncio.run(main())
