"""The local trainer on a CUDA GPU: does the toy task train there, and how far apart are the logprobs?

The tests' toy task (tests/train/train_toy_env.py: reward 1 when the reply's first token is a line
break) and their tiny random Qwen3 with the real Qwen3 vocabulary, trained by the whole loop
(embedded engine rollouts, GRPO update, evaluation, checkpoints) in four set-ups: full fine-tuning in
float32, full fine-tuning of float32 master weights in bfloat16 autocast compute (what ``auto`` picks on
a GPU), full fine-tuning of bfloat16 weights, and LoRA in bfloat16 with the truncated importance-sampling
correction. Each prints held-out reward before and after, the engine-vs-trainer logprob mismatch
(``mismatch/logprob_abs_diff`` and its max, ``mismatch/kl``), seconds a step and peak GPU memory.

    python benchmarks/bench_train_cuda.py [--steps 12] [--device cuda]

``--device cpu`` runs the same set-ups on the CPU (to check the script, or to compare).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "train")]

from train_toy_env import FirstToken, save_toy_model  # noqa: E402  (the trainer tests' toy task)

from agentboost.models.tokenizers import load_qwen3_tokenizer  # noqa: E402
from agentboost.train.config import config_from_dict  # noqa: E402
from agentboost.train.logging import read_metrics  # noqa: E402
from agentboost.train.trainer import Trainer  # noqa: E402

SETUPS = {
    "float32, full": {"model": {"dtype": "float32", "compute_dtype": "float32"}},
    "float32 weights, bfloat16 compute, full (auto on a GPU)": {"model": {"compute_dtype": "bfloat16"}},
    "bfloat16 weights, full (warns)": {"model": {"dtype": "bfloat16"}},
    "bfloat16, LoRA + TIS": {
        "model": {"dtype": "bfloat16"},
        "lora": {
            "enabled": True,
            "rank": 8,
            "alpha": 16,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        },
        "algorithm": {"tis_cap": 2.0},
        "optimizer": {"lr": 1e-2},
    },
}


def run(name: str, sections: dict, model_dir: Path, out: Path, steps: int, device: str, target: int) -> None:
    data = {
        "model": {"name_or_path": str(model_dir), "device": device},
        "environment": {"train_tasks": 16},
        "rollout": {"tasks_per_step": 4, "group_size": 8, "temperature": 1.0},
        "optimizer": {"lr": 1e-2},
        "eval": {"every": steps, "tasks": 16, "samples": 4, "temperature": 1.0},
        "checkpoint": {"every": steps, "save_final_model": False},
        "logging": {"progress": False},
        "steps": steps,
        "seed": 0,
        "output_dir": str(out),
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    summary = Trainer(config_from_dict(data), environment=FirstToken(target)).train()
    wall = time.perf_counter() - started
    train = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    step_s = [r["time/rollout_s"] + r["time/update_s"] for r in train]
    peak = f", peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB" if device != "cpu" else ""
    print(
        f"[{name}] held-out {summary.eval_rewards[0]:.3f} -> {summary.eval_rewards[steps]:.3f} "
        f"in {steps} steps ({wall:.1f} s, median step {statistics.median(step_s):.2f} s{peak})"
    )
    rewards = ", ".join(f"{r['reward/mean']:.2f}" for r in train)
    updates = sum(int(r["optim/updates"]) for r in train)
    print(
        f"[{name}]   train reward by step: {rewards}; {updates} updates "
        "(none in a step whose groups all score alike)"
    )
    tis = [r["mismatch/tis_weight_mean"] for r in train if "mismatch/tis_weight_mean" in r]
    print(
        f"[{name}]   mismatch: mean |diff| up to {max(r['mismatch/logprob_abs_diff'] for r in train):.2e}, "
        f"max |diff| up to {max(r['mismatch/logprob_abs_diff_max'] for r in train):.2e}, "
        f"kl up to {max(r['mismatch/kl'] for r in train):.2e}"
        + (f", TIS weight mean {statistics.mean(tis):.3f} over {len(tis)} steps" if tis else "")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", nargs="+", choices=list(SETUPS), default=list(SETUPS))
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here; this benchmark needs one (or --device cpu)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if args.device != "cpu" else "cpu"
    print(f"device: {name}, torch {torch.__version__}")
    tokenizer = load_qwen3_tokenizer()
    (target,) = tokenizer.encode("\n", add_special_tokens=False)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = save_toy_model(Path(scratch) / "tiny-qwen3", tokenizer)
        for index, setup in enumerate(args.only):
            run(
                setup,
                SETUPS[setup],
                model_dir,
                Path(scratch) / f"run{index}",
                args.steps,
                args.device,
                target,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
