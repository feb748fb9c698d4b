"""Where training metrics go: JSONL and TensorBoard always, wandb when configured, and a reward-curve PNG.

Every record is one line of ``metrics.jsonl``: ``{"step": int, "kind": "train" | "eval", "time": float,
<metric>: float, ...}`` (and one ``"precision"`` record when a run starts or resumes: the dtypes the run
picked). ``step`` is the number of training steps completed before the rollouts the record describes were
made, so a train record and an eval record with the same step measure the same weights. Metric names are
listed in docs/training.md and are kept stable.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentboost.errors import ConfigError

_MISSING = "the trainer needs {package}: pip install 'agentboost[train]'"


class MetricsLogger:
    """Append metrics to ``metrics.jsonl`` and TensorBoard (and wandb); draw ``reward_curve.png``."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        start_step: int = 0,
        config: Mapping[str, Any] | None = None,
        wandb_project: str | None = None,
        wandb_run_name: str | None = None,
        wandb_mode: str | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self.png = self.run_dir / "reward_curve.png"
        self._drop_records_from(start_step)
        if start_step == 0:  # a fresh run: no curves of an earlier run in the same directory
            shutil.rmtree(self.run_dir / "tensorboard", ignore_errors=True)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ConfigError(_MISSING.format(package="tensorboard")) from error

        # purge_step hides events a killed run wrote past the checkpoint we resume from
        self._tensorboard = SummaryWriter(
            str(self.run_dir / "tensorboard"), purge_step=start_step if start_step else None
        )
        self._wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError as error:
                raise ConfigError(
                    "logging.wandb_project is set but wandb is not installed: `pip install wandb`, "
                    "or unset logging.wandb_project"
                ) from error
            self._wandb = wandb.init(
                project=wandb_project,
                name=wandb_run_name,
                mode=wandb_mode,
                config=dict(config or {}),
                dir=str(self.run_dir),
                id=self._wandb_id(),
                resume="allow",
            )

    def _wandb_id(self) -> str:
        """One wandb run per run directory, so a resumed run continues the same wandb run."""
        path = self.run_dir / "wandb_id"
        if path.exists():
            return path.read_text().strip()
        run_id = f"agentboost-{int(time.time())}-{os.getpid()}"
        path.write_text(run_id + "\n")
        return run_id

    def _drop_records_from(self, step: int) -> None:
        """On resume, forget records of steps a killed run logged after its last checkpoint."""
        if not self.path.exists():
            return
        kept = [record for record in read_metrics(self.path) if record["step"] < step]
        temporary = self.path.with_suffix(".jsonl.tmp")
        temporary.write_text("".join(json.dumps(record) + "\n" for record in kept), encoding="utf-8")
        os.replace(temporary, self.path)

    def log(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        record = {
            "step": step,
            "kind": kind,
            "time": time.time(),
            **{k: float(v) for k, v in metrics.items()},
        }
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        for name, value in metrics.items():
            self._tensorboard.add_scalar(name, float(value), step)
        self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def plot(self) -> Path | None:
        """Write ``reward_curve.png`` from ``metrics.jsonl``; None when there is nothing to plot yet."""
        records = read_metrics(self.path) if self.path.exists() else []
        if not records:
            return None
        return plot_reward_curve(records, self.png)

    def close(self) -> None:
        self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (a torn last line from a killed run is skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def plot_reward_curve(records: list[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Training reward per step (and its moving average) with held-out evaluations, as a PNG."""
    try:
        import matplotlib
    except ImportError as error:
        raise ConfigError(_MISSING.format(package="matplotlib")) from error

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    train = [(r["step"], r["reward/mean"]) for r in records if r["kind"] == "train" and "reward/mean" in r]
    evals = [
        (r["step"], r["eval/reward_mean"]) for r in records if r["kind"] == "eval" and "eval/reward_mean" in r
    ]
    figure, axes = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        steps, rewards = zip(*train, strict=True)
        window = len(rewards) // 10
        alpha = 0.35 if window > 1 else 1.0
        axes.plot(steps, rewards, color="tab:blue", alpha=alpha, label="train reward (per step)")
        if window > 1:
            smooth = [
                sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
                for i in range(len(rewards))
            ]
            axes.plot(steps, smooth, color="tab:blue", label=f"train reward (mean of {window})")
    if evals:
        steps, rewards = zip(*evals, strict=True)
        axes.plot(steps, rewards, "o-", color="tab:orange", label="held-out reward")
    axes.set_xlabel("training step")
    axes.set_ylabel("mean reward")
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    figure.tight_layout()
    output = Path(path)
    temporary = output.with_name(output.name + ".tmp.png")
    figure.savefig(temporary)
    plt.close(figure)
    os.replace(temporary, output)
    return output


def step_line(metrics: Mapping[str, float]) -> str:
    """One training step in a few words, for the progress bar and the closing line: the reward, the
    optimizer updates made (and why there were none), the loss, the KL and the gradient norm."""
    parts = [f"reward {metrics.get('reward/mean', float('nan')):.3f}"]
    updates = int(metrics.get("optim/updates", 0))
    if updates == 0:
        if metrics.get("groups/zero_signal_fraction", 0.0) >= 1.0:
            parts.append("0 updates: every group had zero signal (equal rewards, or under two scored)")
        else:
            parts.append("0 updates")
        return " | ".join(parts)
    parts.append(f"{updates} update{'s' if updates != 1 else ''}")
    if "policy/loss" in metrics:
        parts.append(f"loss {metrics['policy/loss']:.4f}")
    kl_name = "policy/kl_ref" if "policy/kl_ref" in metrics else "policy/approx_kl"
    if kl_name in metrics:
        parts.append(f"kl {metrics[kl_name]:.2e}")
    if "optim/grad_norm" in metrics:
        parts.append(f"grad {metrics['optim/grad_norm']:.3f}")
    if metrics.get("groups/zero_signal_fraction", 0.0) >= 1.0:
        parts.append("every group had zero signal")
    return " | ".join(parts)


def steps_line(records: list[dict[str, Any]]) -> str | None:
    """The closing line's account of a run's training steps (``metrics.jsonl`` records): the last
    step in :func:`step_line`'s words, and how many steps made no optimizer update."""
    steps = [record for record in records if record.get("kind") == "train"]
    if not steps:
        return None
    idle = sum(1 for record in steps if not record.get("optim/updates"))
    line = f"last step: {step_line(steps[-1])}"
    if idle:
        line += f" | {idle} of {len(steps)} steps made no update (see groups/zero_signal_fraction)"
    return line
