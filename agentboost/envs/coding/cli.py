"""``agentboost data prepare-coding``: dataset rows -> normalized coding task JSONL (+ veRL parquet)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentboost.io_safety import add_force_argument


def _cmd_prepare_coding(args: argparse.Namespace) -> int:
    from agentboost.envs.coding.data import prepare_tasks, write_tasks
    from agentboost.io_safety import claim_output

    claim_output(args.out, option="--out", force=args.force, inputs=args.sources)
    if args.verl_out:
        claim_output(args.verl_out, option="--verl-out", force=args.force, inputs=[args.out])
    report = prepare_tasks(
        args.sources,
        split=args.split,
        config=args.hf_config,
        public_count=args.public_tests,
        limit=args.limit,
    )
    print(report.summary(), file=sys.stderr)
    if not report.tasks:
        print("agentboost: no task could be prepared; see the reasons above", file=sys.stderr)
        return 1
    path = write_tasks(report.tasks, args.out)
    print(f"{len(report.tasks)} coding tasks -> {path}")
    if args.verl_out:
        from agentboost.integrations.verl.data import write_verl_dataset

        parquet, count = write_verl_dataset(
            "coding",
            args.verl_out,
            environment_kwargs={"data": str(Path(path).resolve())},
            split=args.split,
        )
        print(f"{count} rows -> {parquet}")
    return 0


def register_prepare_coding(data_commands: argparse._SubParsersAction) -> None:
    """Add ``prepare-coding`` under ``agentboost data``."""
    parser = data_commands.add_parser(
        "prepare-coding",
        help="normalize coding datasets (DeepCoder, TACO, PrimeIntellect, LiveCodeBench, HumanEval) "
        "to task JSONL",
    )
    parser.add_argument(
        "sources",
        nargs="+",
        help="JSONL / JSON / parquet files, 'humaneval' (the PyPI package), or Hugging Face dataset names",
    )
    parser.add_argument("--out", required=True, help="task JSONL to write")
    parser.add_argument(
        "--split", default="train", help="hub split to load, and the split name (default: train)"
    )
    parser.add_argument("--hf-config", default=None, help="hub dataset configuration name")
    parser.add_argument(
        "--public-tests",
        type=int,
        default=1,
        help="for single-list datasets: how many leading tests the model may run (default: 1)",
    )
    parser.add_argument("--limit", type=int, default=None, help="stop after this many tasks")
    parser.add_argument(
        "--verl-out", default=None, help="also write veRL parquet (PATH.parquet) for these tasks"
    )
    add_force_argument(parser, "--out and --verl-out")
    parser.set_defaults(func=_cmd_prepare_coding)
