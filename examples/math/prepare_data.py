"""Write the math example's data: demonstrations for the SFT warm-up, and veRL parquet.

    python examples/math/prepare_data.py [--out data/math] [--demonstrations 256] [--verl]

Demonstrations are drawn from the TRAIN split only (never the held-out one): for each problem, the
conversation an agent should have, a calculator call on the problem's expression, the tool's real
result, then ``Answer: <result>``. They are chat JSONL rows ({"messages", "tools"}) that
``agentboost sft`` renders with the chat template, so the warm-up trains on exactly the tokens a
rollout of the same agent would produce. ``--verl`` also writes train/test parquet for
``train_verl.sh`` (through ``agentboost data to-verl``). Train and test sets that share a problem (by
id or text) are refused before anything is written, unless ``--allow-overlap``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from agentboost.envs.base import Episode
from agentboost.envs.math_problems import MathEnvironment
from agentboost.envs.splits import check_disjoint
from agentboost.tokens.templates import tool_specs_to_openai

VERL_COUNTS = {"train": 4096, "test": 256}
ENV_KWARGS = {"generators": "products", "config": {"min_digits": 3, "max_digits": 3}, "tool": "calculator"}


def demonstration(environment: MathEnvironment, task, tools: list) -> dict:
    """The conversation of an agent that uses the calculator and copies its result."""
    expression = task.metadata["entry"]["metadata"]["expression"]
    calculator = environment.tools(Episode(task, 0))[0]
    arguments = {"expression": expression}
    result = calculator(**arguments)  # the tool's own output, exactly as a rollout sees it
    return {
        "messages": [
            {"role": "system", "content": environment.system_prompt},
            {"role": "user", "content": task.prompt},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "calculator", "arguments": arguments}}
                ],
            },
            {"role": "tool", "name": "calculator", "content": result},
            {"role": "assistant", "content": f"Answer: {result}"},
        ],
        "tools": tools,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/math")
    parser.add_argument("--demonstrations", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verl", action="store_true", help="also write veRL parquet (needs pyarrow)")
    parser.add_argument(
        "--allow-overlap", action="store_true", help="write train and test sets even if they share problems"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    environment = MathEnvironment(**ENV_KWARGS)
    episode = Episode(environment.tasks(1)[0], 0)
    tools = tool_specs_to_openai([tool.tool_spec for tool in environment.tools(episode)])
    tasks = environment.tasks(args.demonstrations, seed=args.seed, split="train")
    train_sets = [tasks]
    if args.verl:
        train_sets.append(environment.tasks(VERL_COUNTS["train"], seed=args.seed, split="train"))
    held_out = environment.tasks(VERL_COUNTS["test"], seed=args.seed, split="test")
    for train in train_sets:  # refused (SplitOverlapError) before anything is written
        warning = check_disjoint(
            [(t.id, t.prompt) for t in train], [(t.id, t.prompt) for t in held_out], allow=args.allow_overlap
        )
        if warning:
            print(warning, file=sys.stderr)
    with open(out / "demonstrations.jsonl", "w", encoding="utf-8") as handle:
        for task in tasks:
            handle.write(json.dumps(demonstration(environment, task, tools)) + "\n")
    print(f"{len(tasks)} demonstrations (train split) -> {out / 'demonstrations.jsonl'}")
    if args.verl:
        for split, count in VERL_COUNTS.items():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "agentboost.cli",
                    "data",
                    "to-verl",
                    "--env",
                    "math",
                    "--env-kwargs",
                    json.dumps(ENV_KWARGS),
                    "--split",
                    split,
                    "-n",
                    str(count),
                    "--seed",
                    str(args.seed),
                    "--out",
                    str(out / f"{split}.parquet"),
                    "--force",  # this script's own data directory
                ],
                check=True,
            )


if __name__ == "__main__":
    main()
