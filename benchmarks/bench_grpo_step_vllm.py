"""One GRPO step with rollouts from a real vLLM server vs the embedded engine, side by side.

The same trainer settings (SmolLM2 fp32, the arithmetic environment, ``--tasks`` tasks x ``--group``
samples at T=1, ``--max-new-tokens`` per turn, full fine-tuning or ``--lora``), one run each way, in
turns, in one process: first the embedded engine (``LocalEngine``), then vLLM (``rollout.vllm_url``:
each step's first rollout pushes the previous step's weights). Prints per step the rollout time (for
vLLM it includes the weight push), the update time and the whole step, then the medians over the steps
after the first (step 0 also warms caches and, for vLLM, overwrites the server's weights).

    python benchmarks/bench_grpo_step_vllm.py --python /path/to/vllm-venv/bin/python [--steps 3] [--lora]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from agentboost.engines.servers.vllm_server import VLLMServer, VLLMServerConfig
from agentboost.models.weights import pull_default_model
from agentboost.train.config import config_from_dict
from agentboost.train.logging import read_metrics
from agentboost.train.trainer import Trainer

PARTS = ("time/rollout_s", "time/update_s", "time/step_s")


def run(args: argparse.Namespace, model: str, output: Path, vllm_url: str | None) -> list[dict]:
    config = config_from_dict(
        {
            # the math example's memory settings: without them one update peaked at 14 GiB here
            "model": {"name_or_path": model, "gradient_checkpointing": True},
            "environment": {"name": "arithmetic", "train_tasks": 64},
            "rollout": {
                "tasks_per_step": args.tasks,
                "group_size": args.group,
                "temperature": 1.0,
                "max_new_tokens": args.max_new_tokens,
                "vllm_url": vllm_url,
            },
            "optimizer": {"lr": 1e-5, "micro_batch_tokens": 2048},
            # a 135M model earns no reward here: keep the groups so that every step updates and pushes
            "algorithm": {"drop_zero_signal_groups": False},
            "lora": {"enabled": args.lora},
            "eval": {"every": 0},
            "checkpoint": {"every": 0, "save_final_model": False},
            "logging": {"progress": False},
            "steps": args.steps,
            "seed": 0,
            "output_dir": str(output),
        }
    )
    trainer = Trainer(config)
    trainer.train()
    pushes = getattr(getattr(trainer.engine, "sync", None), "version", None)
    rows = [r for r in read_metrics(output / "metrics.jsonl") if r["kind"] == "train"]
    for row in rows:
        row["pushes"] = pushes
    assert all(row["optim/updates"] >= 1 for row in rows), "a step did not update the weights"
    return rows


def main(args: argparse.Namespace) -> None:
    model = str(pull_default_model(quiet=True))
    config = VLLMServerConfig(model=model, python=args.python, weight_sync=True, ready_timeout_s=900)
    with VLLMServer(config) as server, tempfile.TemporaryDirectory() as scratch:
        results = {
            "embedded": run(args, model, Path(scratch) / "embedded", None),
            "vLLM": run(args, model, Path(scratch) / "vllm", server.url),
        }
    kind = "LoRA" if args.lora else "full"
    print(f"{kind} fine-tuning, {args.tasks} tasks x {args.group} samples, {args.max_new_tokens} new tokens")
    for engine, rows in results.items():
        print(f"{engine}: {rows[-1]['pushes'] or 0} weight pushes")
        for row in rows:
            parts = "  ".join(f"{p.split('/')[1]} {row[p]:.2f} s" for p in PARTS)
            print(f"{engine:8s} step {row['step']}  {parts}  tokens/s {row['rollout/tokens_per_second']:.1f}")
    medians = {
        engine: {p: statistics.median(r[p] for r in rows[1:] or rows) for p in PARTS}
        for engine, rows in results.items()
    }
    for engine, values in medians.items():
        print(f"{engine:8s} median over steps 1..: " + "  ".join(f"{p} {v:.2f} s" for p, v in values.items()))
    ratio = medians["embedded"]["time/step_s"] / medians["vLLM"]["time/step_s"]
    print(f"step time embedded / vLLM = {ratio:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=None, help="Python with vLLM (default: $AGENTBOOST_VLLM_PYTHON)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--lora", action="store_true")
    main(parser.parse_args())
