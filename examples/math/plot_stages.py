"""One curve for a warm-up and the RL run after it: train and held-out reward per step, both stages.

    python examples/math/plot_stages.py runs/math-sft runs/math-grpo --out runs/math_curve.png

Reads each run's ``metrics.jsonl``; the RL stage's steps are drawn after the warm-up's. Draws the
warm-up's loss, the RL train reward, the held-out reward and the held-out tool-use rate (share of
rollouts calling a tool). Prints the held-out rewards: untrained (warm-up step 0), after warm-up, after RL.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agentboost.train.logging import read_metrics


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sft_run")
    parser.add_argument("rl_run")
    parser.add_argument("--out", default="runs/math_curve.png")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sft = read_metrics(Path(args.sft_run) / "metrics.jsonl")
    rl = read_metrics(Path(args.rl_run) / "metrics.jsonl")
    sft_steps = max([r["step"] for r in sft if r["kind"] == "train"], default=-1) + 1
    figure, (loss_axes, reward_axes) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    loss = [(r["step"], r["sft/loss"]) for r in sft if r["kind"] == "train"]
    if loss:
        loss_axes.plot(*zip(*loss, strict=True), color="tab:green", label="warm-up loss (assistant tokens)")
    loss_axes.set_ylabel("SFT loss")
    loss_axes.legend(loc="best")
    sft_eval = sorted((r["step"], r["eval/reward_mean"]) for r in sft if r["kind"] == "eval")
    rl_eval = sorted((r["step"] + sft_steps, r["eval/reward_mean"]) for r in rl if r["kind"] == "eval")
    rl_train = sorted((r["step"] + sft_steps, r["reward/mean"]) for r in rl if r["kind"] == "train")
    if rl_train:
        reward_axes.plot(*zip(*rl_train, strict=True), color="tab:blue", alpha=0.6, label="RL train reward")
    if sft_eval:
        reward_axes.plot(*zip(*sft_eval, strict=True), "s-", color="tab:green", label="held-out (warm-up)")
    if rl_eval:
        reward_axes.plot(*zip(*rl_eval, strict=True), "o-", color="tab:orange", label="held-out (RL)")
    tool_use = sorted(
        (r["step"] + offset, r["eval/tool_use_rate"])
        for offset, run in ((0, sft), (sft_steps, rl))
        for r in run
        if r["kind"] == "eval" and "eval/tool_use_rate" in r
    )
    if tool_use:
        reward_axes.plot(*zip(*tool_use, strict=True), "x--", color="tab:purple", label="held-out tool use")
    reward_axes.axvline(sft_steps, color="grey", linestyle=":", label="warm-up ends")
    reward_axes.set_xlabel("step (warm-up, then RL)")
    reward_axes.set_ylabel("mean reward / rate")
    reward_axes.set_ylim(-0.02, 1.02)
    reward_axes.legend(loc="best")
    figure.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=110)
    rates = dict(tool_use)
    if sft_eval:
        first, last = sft_eval[0], sft_eval[-1]
        print(
            f"held-out reward, untrained: {first[1]:.3f} (tool use {rates.get(first[0], float('nan')):.3f}); "
            f"after warm-up: {last[1]:.3f} (tool use {rates.get(last[0], float('nan')):.3f})"
        )
    if rl_eval:
        last = rl_eval[-1]
        print(
            f"held-out reward after RL: {last[1]:.3f} (tool use {rates.get(last[0], float('nan')):.3f}); "
            f"RL gain {last[1] - rl_eval[0][1]:+.3f}"
        )
    print(f"curve -> {args.out}")


if __name__ == "__main__":
    main()
