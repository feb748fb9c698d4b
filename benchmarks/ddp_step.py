"""A data-parallel training step (2 gloo ranks) vs one process, on this machine's CPU cores.

Runs the real command twice on the trainer tests' toy task (a tiny random Qwen3 with the Qwen3
vocabulary, tests/train/train_toy_env.py): ``agentboost train ...`` with ``threads=CORES`` and
``agentboost train ... --nproc 2`` with ``threads=CORES/2`` per rank, and prints the median
per-step times rank 0 logged (rollouts, update, whole step; the first step, a warm-up, is left out),
the whole command's wall clock (start-up included) and the load average before and after each.

    python benchmarks/ddp_step.py                       # LongReply: replies of up to 192 tokens
    python benchmarks/ddp_step.py --env FirstToken      # one generated token: the update dominates
    python benchmarks/ddp_step.py --hidden 256 --steps 4

Two ranks split the step's groups: each collects and back-propagates half of them and the gradients
are all-reduced; on a machine whose cores one process already keeps busy, that is no faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def save_model(directory: Path, hidden: int) -> None:
    sys.path[:0] = [str(TESTS), str(TESTS / "train")]
    import torch
    from conftest import tiny_qwen3

    from agentboost.models.tokenizers import load_qwen3_tokenizer

    model = tiny_qwen3(seed=0, hidden=hidden)
    with torch.no_grad():  # as train_toy_env.save_toy_model: a model that prefers some tokens
        model.get_input_embeddings().weight.mul_(9.0)
    model.save_pretrained(directory)
    load_qwen3_tokenizer().save_pretrained(directory)


def run(args: argparse.Namespace, model: Path, output: Path, ranks: int) -> dict[str, float]:
    cores = os.cpu_count() or 1
    overrides = [
        f"model.name_or_path={model}",
        f"environment.name=train_toy_env:{args.env}",
        "environment.kwargs={target_id: 198}",
        "environment.train_tasks=64",
        f"rollout.tasks_per_step={args.tasks_per_step}",
        f"rollout.group_size={args.group_size}",
        "rollout.temperature=1.0",
        "eval.every=0",
        "checkpoint.every=0",
        "checkpoint.save_final_model=false",
        "logging.progress=false",
        f"threads={max(1, cores // ranks)}",
        f"steps={args.steps}",
        f"output_dir={output}",
    ]
    pythonpath = os.pathsep.join([str(ROOT), str(TESTS), str(TESTS / "train")])
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentboost.cli",
            "train",
            *overrides,
            *(["--nproc", str(ranks)] if ranks > 1 else []),
        ],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": pythonpath,
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": str(max(1, cores // ranks)),
        },
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{ranks} rank(s) failed:\n{done.stderr[-3000:]}")
    from agentboost.train.logging import read_metrics

    records = [r for r in read_metrics(output / "metrics.jsonl") if r["kind"] == "train"][1:]
    return {
        "step_s": statistics.median(r["time/step_s"] for r in records),
        "rollout_s": statistics.median(r["time/rollout_s"] for r in records),
        "update_s": statistics.median(r["time/update_s"] for r in records),
        "wall_s": wall,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="LongReply", choices=["LongReply", "FirstToken"])
    parser.add_argument("--hidden", type=int, default=64, help="the tiny Qwen3's hidden size")
    parser.add_argument(
        "--steps", type=int, default=3, help="training steps per run (the first is a warm-up)"
    )
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch) / "model"
        save_model(model, args.hidden)
        print(
            f"{args.env}, tiny Qwen3 hidden={args.hidden}, {args.tasks_per_step} tasks x {args.group_size} "
            f"samples per step, {args.steps} steps, {os.cpu_count()} cores"
        )
        print("ranks | step s (median) | rollouts s | update s | command wall s | load before -> after")
        for ranks in (1, 2):
            figures = run(args, model, Path(scratch) / f"run-{ranks}", ranks)
            print(
                f"{ranks} | {figures['step_s']:.2f} | {figures['rollout_s']:.2f} | "
                f"{figures['update_s']:.2f} | {figures['wall_s']:.1f} | "
                f"{figures['load_before']:.1f} -> {figures['load_after']:.1f}"
            )


if __name__ == "__main__":
    main()
