"""``agentboost data to-verl`` and ``agentboost doctor`` (listed in ``agentboost.cli``'s command table)."""

from __future__ import annotations

import argparse

from agentboost.cli_args import MAX_TASKS, TASKS_WHY, count
from agentboost.io_safety import add_force_argument


def _cmd_data_to_verl(args: argparse.Namespace) -> int:
    from agentboost.envs.registry import parse_json_object
    from agentboost.integrations.verl.data import write_verl_dataset
    from agentboost.io_safety import claim_output

    claim_output(args.out, option="--out", force=args.force)
    path, count = write_verl_dataset(
        args.env,
        args.out,
        environment_kwargs=parse_json_object(args.env_kwargs, "--env-kwargs") if args.env_kwargs else {},
        n=args.n,
        seed=args.seed,
        split=args.split,
        agent_name=args.agent_name,
        data_source=args.data_source,
    )
    print(f"{count} {args.split} tasks of {args.env} -> {path}")
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from agentboost.integrations.verl.doctor import doctor_report

    report, ready = doctor_report()
    print(report)
    return 0 if ready else 1


def register_to_verl(data_commands: argparse._SubParsersAction) -> None:
    """Add ``to-verl`` to ``agentboost data``."""
    to_verl = data_commands.add_parser(
        "to-verl",
        help="write an environment's tasks as veRL parquet (one row per task, for agentboost's agent loop)",
    )
    to_verl.add_argument(
        "--env", default="arithmetic", help="registered name or module:Class (default: arithmetic)"
    )
    to_verl.add_argument(
        "--env-kwargs", default=None, help="JSON object of constructor arguments, e.g. '{\"difficulty\": 2}'"
    )
    to_verl.add_argument(
        "-n",
        "--n",
        type=count(1, MAX_TASKS, TASKS_WHY),
        default=None,
        help="number of tasks (default: the environment's)",
    )
    to_verl.add_argument("--seed", type=int, default=0, help="task seed (default: 0)")
    to_verl.add_argument("--split", default="train", help="task split, e.g. train or test (default: train)")
    to_verl.add_argument("--out", required=True, help="parquet file to write (PATH.parquet)")
    to_verl.add_argument(
        "--agent-name", default="agentboost", help="agent loop rows run with (default: agentboost)"
    )
    to_verl.add_argument(
        "--data-source", default=None, help="veRL data_source column (default: the environment's name)"
    )
    add_force_argument(to_verl)
    to_verl.set_defaults(func=_cmd_data_to_verl)


def register_doctor(commands: argparse._SubParsersAction) -> None:
    """Add ``doctor`` to the ``agentboost`` command's subparsers."""
    doctor = commands.add_parser(
        "doctor", help="check verl, vllm, sglang, torch, transformers and strands-agents for veRL training"
    )
    doctor.set_defaults(func=_cmd_doctor)
