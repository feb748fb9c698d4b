"""PNG plots of rollout results: reward by step, tool calls per rollout, termination shares."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

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
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o")
        axes.set_xlabel("step")
        axes.set_ylabel("mean reward (scored rollouts)")
        axes.set_title("Reward by step")
    else:
        rewards = [r.reward for r in everything if r.reward is not None]
        running, total = [], 0.0
        for index, reward in enumerate(rewards, start=1):
            total += reward
            running.append(total / index)
        axes.plot(range(1, len(running) + 1), running)
        axes.set_xlabel("rollout (file order, scored only)")
        axes.set_ylabel("running mean reward")
        axes.set_title("Reward over rollouts")
        points = running
    values = [p[1] for p in points] if len(groups) > 1 else points
    if values:  # the whole reward range, not a +-0.04 zoom on a flat line
        axes.set_ylim(min(0.0, min(values)) - 0.05, max(1.0, max(values)) + 0.05)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and rollouts are counts
    axes.grid(alpha=0.3)
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


def _save(figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
