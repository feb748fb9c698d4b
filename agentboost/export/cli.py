"""``agentboost export``: results JSONL to the chat form, an SFT dataset, parquet or a ``datasets`` dir."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentboost.cli_args import finite_float
from agentboost.errors import ConfigError
from agentboost.io_safety import add_force_argument, claim_output
from agentboost.tokens.trajectory import TerminationReason

FORMATS = ("chat", "sft", "parquet", "hf")


def _cmd_export(args: argparse.Namespace) -> int:
    from agentboost.envs.registry import parse_json_object
    from agentboost.export.formats import (
        ExportFilter,
        ToolSchemas,
        write_chat,
        write_hf_dataset,
        write_parquet,
        write_sft,
    )
    from agentboost.rollout.results import read_header, read_results

    if args.min_reward is not None and args.max_reward is not None and args.min_reward > args.max_reward:
        raise ConfigError(
            f"--min-reward {args.min_reward:g} is above --max-reward {args.max_reward:g}, so nothing "
            "could be kept; swap them"
        )
    sft = args.format == "sft"
    keep = ExportFilter(
        min_reward=args.min_reward,
        max_reward=args.max_reward,
        terminations=frozenset(args.termination) if args.termination else None,
        scored_only=args.scored_only or sft,
        skip_failed=not args.keep_failed if sft else args.skip_failed,
        skip_parse_errors=sft and not args.keep_parse_errors,
    )
    claim_output(
        args.out, option="-o", force=args.force, inputs=[args.results], directory=args.format == "hf"
    )
    read = kept = 0

    def counted():
        nonlocal read, kept
        for result in read_results(args.results):
            read += 1
            if keep.accepts(result):
                kept += 1
                yield result

    results = counted()
    if args.format == "chat":
        count = write_chat(results, args.out)
    elif sft:
        explicit = None
        if args.tools:
            try:
                explicit = json.loads(Path(args.tools).read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as error:
                raise ConfigError(
                    f"--tools {args.tools}: cannot read a JSON list of schemas ({error})"
                ) from error
            if not isinstance(explicit, list):
                raise ConfigError(f"--tools {args.tools} must hold a JSON list of OpenAI function schemas")
        kwargs = parse_json_object(args.env_kwargs, "--env-kwargs") if args.env_kwargs else {}
        header = read_header(args.results) or {}
        recorded = header.get("run") if isinstance(header.get("run"), dict) else None
        schemas = ToolSchemas(explicit, args.env, kwargs, recorded=recorded)
        count = write_sft(results, args.out, schemas, reasoning=not args.no_reasoning)
    elif args.format == "parquet":
        count = write_parquet(results, args.out)
    else:
        count = write_hf_dataset(results, args.out)
    dropped = f"; {read - kept} of {read} left out by the filters" if read != kept else ""
    rows = f" in {count} rows (forked gateway sessions)" if count != kept else ""
    print(f"{kept} rollouts{rows} -> {args.out} ({args.format}{dropped})")
    return 0


def register_export_command(commands: argparse._SubParsersAction) -> None:
    """Add ``export`` to the ``agentboost`` command's subparsers."""
    export = commands.add_parser(
        "export",
        help="write results as the chat form, an SFT dataset, parquet or a Hugging Face datasets directory",
        description=(
            "chat: one JSON line per rollout ({task_id, reward, termination, messages}); a .json path "
            "writes one indented list. sft: {messages, tools} per rollout (TRL's format); scored, "
            "non-failed rollouts without malformed tool calls only. parquet / hf: token ids, loss mask, "
            "logprobs and segments per rollout."
        ),
    )
    export.add_argument("results", help="results JSONL written by agentboost rollout / eval")
    export.add_argument("-o", "--out", required=True, help="output file (a directory for --format hf)")
    export.add_argument("--format", choices=FORMATS, default="chat", help="default: chat")
    export.add_argument(
        "--min-reward", type=finite_float, default=None, help="keep rollouts with reward >= this"
    )
    export.add_argument(
        "--max-reward", type=finite_float, default=None, help="keep rollouts with reward <= this"
    )
    export.add_argument(
        "--termination",
        action="append",
        choices=[reason.value for reason in TerminationReason],
        metavar="REASON",
        help="keep only this termination reason (repeatable; one of the termination table's reasons)",
    )
    export.add_argument("--scored-only", action="store_true", help="drop rollouts whose reward failed")
    export.add_argument(
        "--skip-failed",
        action="store_true",
        help="drop failed rollouts (engine, template, agent, environment errors, crashed workers)",
    )
    export.add_argument("--keep-failed", action="store_true", help="sft: keep failed rollouts too")
    export.add_argument(
        "--keep-parse-errors", action="store_true", help="sft: keep rollouts with malformed tool calls"
    )
    export.add_argument("--no-reasoning", action="store_true", help="sft: drop reasoning_content")
    export.add_argument("--env", default=None, help="sft: environment whose tool schemas to list")
    export.add_argument("--env-kwargs", default=None, help="sft: JSON keyword arguments for --env")
    export.add_argument("--tools", default=None, help="sft: a JSON file with the OpenAI function schemas")
    add_force_argument(export)
    export.set_defaults(func=_cmd_export)
