"""``agentboost train CONFIG.yaml [key=value ...]``: train with the local trainer.

Every setting of :class:`~agentboost.train.config.TrainConfig` can be given in the YAML file and
overridden on the command line with a dotted key, e.g. ``optimizer.lr=2e-5 lora.enabled=true``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any


def _load(args: argparse.Namespace, cls: type, extra: list[str] = ()) -> Any:
    """The settings of ``train`` / ``sft``: CONFIG (a first argument with ``=`` is an override, not a
    file), then the KEY=VALUE overrides, then ``extra``."""
    from agentboost.train.config import load_config

    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config:  # only overrides were given
        config, overrides = None, [config, *overrides]
    return load_config(config, [*overrides, *extra], cls=cls)


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default=None, help="YAML config file (omit for the defaults)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="setting overrides, dotted keys")
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved settings as JSON and exit"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the settings, build the environment and find the model and engine; train nothing",
    )


def _dry_run(config: Any, *, environment: str | None, kwargs: dict[str, Any]) -> int:
    """What a run would start from, checked without loading a model or training: the settings, the
    environment and its tasks, the data files (SFT), the model's location and the rollout server.
    Problems raise the typed error a real run would raise at its start."""
    from pathlib import Path

    from agentboost.errors import ConfigError, ModelNotFoundError
    from agentboost.models.weights import DEFAULT_MODEL, resolve_model

    config.validate()
    lines = ["settings: OK"]
    if environment:
        from agentboost.envs.registry import make_environment

        built = make_environment(str(environment), kwargs)
        counts = []
        section = getattr(config, "environment", None)  # the RL trainer's; SFT only evaluates
        if section is not None:
            train = list(built.tasks(section.train_tasks, seed=section.task_seed, split="train"))
            counts.append(f"{len(train)} train tasks")
            if len(train) < config.rollout.tasks_per_step:
                raise ConfigError(
                    f"the environment gave {len(train)} training tasks but rollout.tasks_per_step "
                    f"is {config.rollout.tasks_per_step}; lower it or raise environment.train_tasks"
                )
        if config.eval.every:
            counts.append(f"{len(list(built.tasks(config.eval.tasks, seed=0, split='test')))} held-out tasks")
        lines.append(f"environment {built.name}: " + (", ".join(counts) or "builds"))
    for path in getattr(getattr(config, "data", None), "paths", []) or []:
        if not Path(path).is_file():
            raise ConfigError(f"data.paths: {path} is not a file")
        lines.append(f"data {path}: found")
    model = str(config.model.name_or_path)
    try:
        lines.append(f"model {model}: {resolve_model(model, pull=False)}")
    except ModelNotFoundError as error:
        if model.lower() not in {DEFAULT_MODEL, "default"}:
            raise
        lines.append(f"model {model}: not cached yet, pulled on first use ({error})")
    url = getattr(getattr(config, "rollout", None), "vllm_url", None)
    if url:
        import asyncio

        from agentboost.engines.factory import check_engine_args

        asyncio.run(check_engine_args("vllm", model=model, urls=(url,)))
        lines.append(f"engine: the vLLM server at {url} answers")
    else:
        lines.append("engine: embedded (this process)")
    for line in lines:
        print(f"agentboost: {line}")
    print(f"dry run: nothing trained; a run would write {config.output_dir}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from agentboost.train.config import TrainConfig

    config = _load(args, TrainConfig)
    if args.print_config:
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    if args.dry_run:
        return _dry_run(config, environment=config.environment.name, kwargs=config.environment.kwargs)
    if args.nproc < 1:
        from agentboost.errors import ConfigError

        raise ConfigError(f"--nproc {args.nproc}: the number of training ranks is at least 1")
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return _launch_ranks(args)
    from agentboost.train.trainer import Trainer

    summary = Trainer(config).train()
    if int(os.environ.get("RANK", "0")) != 0:  # rank 0 reports for the data-parallel run
        return 0
    from agentboost.train.logging import read_metrics, steps_line

    metrics_file = summary.output_dir / "metrics.jsonl"
    steps = steps_line(read_metrics(metrics_file)) if metrics_file.exists() else None
    if steps:
        print(steps)
    evaluations = sorted(summary.eval_rewards.items())
    if evaluations:
        (first_step, first), (last_step, last) = evaluations[0], evaluations[-1]
        print(
            f"held-out mean reward: {first:.3f} at step {first_step} -> {last:.3f} at step {last_step} "
            f"({last - first:+.3f}) | {summary.output_dir}"
        )
    else:
        print(f"trained {summary.steps} steps | {summary.output_dir}")
    return 0


def _launch_ranks(args: argparse.Namespace) -> int:
    """``agentboost train ... --nproc N``: the same command as N data-parallel ranks on this machine,
    through torchrun (:mod:`agentboost.train.distributed`); its exit status."""
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.nproc}",
        "-m",
        "agentboost.cli",
        "train",
        *([args.config] if args.config is not None else []),
        *args.overrides,
    ]
    return subprocess.run(command, check=False).returncode


def register_train_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``train`` to the ``agentboost`` command's subparsers."""
    parser = subparsers.add_parser(
        "train",
        help="train a policy on an environment with the local GRPO/PPO trainer",
        description=(
            "Collect group rollouts with the current weights, compute advantages, update, repeat. "
            "Settings come from CONFIG (YAML) and then from KEY=VALUE overrides with dotted keys, "
            "e.g. optimizer.lr=2e-5 rollout.group_size=8 lora.enabled=true. A run started again in "
            "the same output_dir resumes from its latest checkpoint."
        ),
    )
    _add_config_arguments(parser)
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        metavar="N",
        help="train with N data-parallel ranks on this machine (runs the command under torchrun; "
        "gloo on CPU, NCCL on GPUs; docs/scaling.md)",
    )
    parser.set_defaults(func=_cmd_train)
    return parser


def _cmd_sft(args: argparse.Namespace) -> int:
    from agentboost.train.sft import SFTConfig

    config = _load(args, SFTConfig, [f"data.paths={json.dumps(args.data)}"] if args.data else [])
    if args.print_config:
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    if args.dry_run:
        return _dry_run(config, environment=config.eval.environment, kwargs=config.eval.kwargs)
    from agentboost.train.sft import SFTTrainer

    trainer = SFTTrainer(config)
    report = trainer.data_report
    print(
        f"agentboost sft: {report.kept} examples ({report.low_reward} below min_reward, "
        f"{report.failed} failed, {report.too_long} too long), "
        f"{trainer.total_steps} steps of {trainer.batch_size}"
    )
    summary = trainer.train()
    losses = sorted(summary.losses.items())
    line = f"trained {summary.steps} steps"
    if losses:
        (first_step, first), (last_step, last) = losses[0], losses[-1]
        line += f" | loss {first:.3f} at step {first_step} -> {last:.3f} at step {last_step}"
    evaluations = sorted(summary.eval_rewards.items())
    if evaluations:
        line += f" | held-out reward {evaluations[0][1]:.3f} -> {evaluations[-1][1]:.3f}"
    print(f"{line} | {summary.output_dir}")
    return 0


def register_sft_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sft`` to the ``agentboost`` command's subparsers."""
    parser = subparsers.add_parser(
        "sft",
        help="supervised fine-tuning on rollout results (filtered by reward) or chat JSONL",
        description=(
            "Train on the assistant tokens of trajectories: results JSONL written by `agentboost rollout` or "
            "`agentboost train` (token ids and loss mask used as stored; keep the good ones with "
            'data.min_reward=1.0) or chat JSONL ({"messages": [...], "tools": [...]}, rendered with '
            "agentboost's chat template). Settings as for `agentboost train`: CONFIG (YAML) then dotted "
            "KEY=VALUE overrides, e.g. optimizer.lr=5e-5 batch_size=16 lora.enabled=true."
        ),
    )
    _add_config_arguments(parser)
    parser.add_argument(
        "--data", action="append", default=[], metavar="JSONL", help="a data file (repeatable; = data.paths)"
    )
    parser.set_defaults(func=_cmd_sft)
    return parser
