"""PNG plots of rollout results: reward by step, tool calls per rollout, termination shares."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentboost.envs.base import RolloutResult
from agentboost.errors import ConfigError


def step_of(path: str | os.PathLike[str], position: int) -> int:
    """The training step of a results file: the last number in its name (``step_000012.jsonl``)."""
    numbers = re.findall(r"\d+", Path(path).stem)
    return int(numbers[-1]) if numbers else position


def plot_results(
    groups: Sequence[tuple[int, Sequence[RolloutResult]]], directory: str | os.PathLike[str]
) -> list[Path]:
    """Write ``reward_by_step.png``, ``tool_calls_per_rollout.png`` and ``terminations.png``.

    ``groups`` are (step, results) pairs: one per results file. With several files (a training run's
    ``rollouts/step_*.jsonl``) the first plot is the mean reward per step; with one file it is the
    running mean reward over the rollouts in file order.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError as error:
        raise ConfigError("plots need matplotlib: pip install 'agentboost[inspect]'") from error
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    everything = [result for _, results in groups for result in results]
    written = []

    figure, axes = plt.subplots(figsize=(6, 3.5))
    if len(groups) > 1:
        points = [
            (step, sum(rewards) / len(rewards))
            for step, results in sorted(groups)
            if (rewards := [r.reward for r in results if r.reward is not None])
        ]
        draw_reward_curve(axes, [p[0] for p in points], [p[1] for p in points])
        axes.set_xlabel("step")
        axes.set_ylabel("mean reward (scored rollouts)")
        axes.set_title("Reward by step")
    else:
        rewards = [r.reward for r in everything if r.reward is not None]
        running, total = [], 0.0
        for index, reward in enumerate(rewards, start=1):
            total += reward
            running.append(total / index)
        draw_reward_curve(axes, list(range(1, len(running) + 1)), running)
        axes.set_xlabel("rollout (file order, scored only)")
        axes.set_ylabel("running mean reward")
        axes.set_title("Reward over rollouts")
    written.append(_save(figure, out / "reward_by_step.png"))

    figure, axes = plt.subplots(figsize=(6, 3.5))
    calls = Counter(int(r.trajectory.metrics.get("tool_calls") or 0) for r in everything)
    top = max(calls) if calls else 0
    axes.bar(range(top + 1), [calls.get(n, 0) for n in range(top + 1)], color="#4c72b0")
    axes.set_xlabel("tool calls in the rollout")
    axes.set_ylabel("rollouts")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title(f"Tool calls per rollout ({len(everything)} rollouts)")
    written.append(_save(figure, out / "tool_calls_per_rollout.png"))

    figure, axes = plt.subplots(figsize=(6, 3.5))
    endings = Counter(r.termination.value for r in everything).most_common()
    total_count = max(1, len(everything))
    axes.barh([name for name, _ in endings][::-1], [count / total_count for _, count in endings][::-1])
    axes.set_xlim(0, 1)
    axes.set_xlabel("share of rollouts")
    axes.set_title("Termination reasons")
    written.append(_save(figure, out / "terminations.png"))
    return written


def draw_reward_curve(axes: Any, xs: Sequence[int], ys: Sequence[float]) -> None:
    """A reward curve on whole-number x (steps, rollouts) over the whole reward range: a single point is
    drawn as a marker centred on an axis one unit either side, not on matplotlib's +-0.04 around it."""
    from matplotlib.ticker import MaxNLocator

    axes.plot(xs, ys, marker="o" if len(xs) <= 20 else None)
    if ys:  # the whole reward range, not a +-0.04 zoom on a flat line
        axes.set_ylim(min(0.0, min(ys)) - 0.05, max(1.0, max(ys)) + 0.05)
    if xs and min(xs) == max(xs):
        axes.set_xlim(xs[0] - 1, xs[0] + 1)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and rollouts are counts
    axes.grid(alpha=0.3)


def _save(figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
