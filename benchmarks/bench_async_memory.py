"""Peak memory of asynchronous training on the embedded engine vs synchronous: the update barrier's cost.

The embedded engine reads the very tensors the optimizer writes; asynchronous training keeps what it
reads consistent with an update barrier (``agentboost/train/async_collect.py``: its decoding pauses
during the update) instead of a second copy of the weights. This runs the real trainer (embedded engine,
runner, results files, update) for ``--steps`` steps in each mode, each mode in a process of its own
(a peak resident set, VmHWM, is per process), and prints each process's peak, the largest
``memory/peak_gib`` a step logged, and what one more copy of the weights (the design not taken) would
add. The asynchronous modes also hold the rollouts of the steps collected ahead.

    python benchmarks/bench_async_memory.py [--model tiny|DIR|smollm2-135m-instruct] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GIB = 2**30
MODES = {
    "sync": {},
    "async k=0": {"asynchronous": True, "max_staleness": 0},
    "async k=1": {"max_staleness": 1},
}


def child(args: argparse.Namespace) -> None:
    """One mode's run; prints its figures as one JSON line."""
    from bench_async_throughput import Talk, tiny_model

    from agentboost.agent.limits import RolloutLimits
    from agentboost.memory import peak_resident_bytes
    from agentboost.train.config import config_from_dict
    from agentboost.train.logging import read_metrics
    from agentboost.train.trainer import Trainer

    out = Path(args.out)
    model = str(tiny_model(out / "model")) if args.model == "tiny" else args.model
    environment = Talk()
    environment.limits = RolloutLimits(max_turns=1, max_new_tokens=args.new_tokens)
    config = config_from_dict(
        {
            "model": {"name_or_path": model},
            "environment": {"train_tasks": 64},
            "rollout": {
                "tasks_per_step": args.tasks,
                "group_size": args.group,
                "temperature": 1.0,
                **MODES[args.child],
            },
            "optimizer": {"lr": 1e-4},
            "eval": {"every": 0},
            "checkpoint": {"every": 0, "save_final_model": False},
            "logging": {"progress": False},
            "steps": args.steps,
            "output_dir": str(out / "run"),
        }
    )
    trainer = Trainer(config, environment=environment)
    weights = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    trainer.train()
    train = [r for r in read_metrics(out / "run" / "metrics.jsonl") if r["kind"] == "train"]
    print(
        json.dumps(
            {
                "vmhwm": peak_resident_bytes(),
                "step_peak_gib": max(r["memory/peak_gib"] for r in train),
                "weights": weights,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (a 1-layer random Qwen3), a directory or an id")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step")
    parser.add_argument("--group", type=int, default=4, help="rollouts per task")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens each rollout generates")
    parser.add_argument("--child", choices=list(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    print(
        f"{args.model}: {args.steps} steps x {args.tasks} tasks x {args.group} rollouts x {args.new_tokens} "
        f"tokens, embedded engine; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'mode':<12}{'peak GiB':>10}{'step peak GiB':>15}{'a weight copy GiB':>19}")
    passed = [
        f"--{name.replace('_', '-')}={value}"
        for name, value in vars(args).items()
        if name not in ("child", "out")
    ]
    for mode in MODES:
        with tempfile.TemporaryDirectory() as scratch:
            found = subprocess.run(
                [sys.executable, __file__, *passed, f"--child={mode}", f"--out={scratch}"],
                check=True,
                capture_output=True,
                text=True,
            )
        figures = json.loads(found.stdout.strip().splitlines()[-1])
        print(
            f"{mode:<12}{figures['vmhwm'] / GIB:>10.3f}{figures['step_peak_gib']:>15.3f}"
            f"{figures['weights'] / GIB:>19.3f}"
        )


if __name__ == "__main__":
    main()
