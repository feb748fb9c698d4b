"""The one training loop: GRPO/PPO (:class:`~agentboost.train.trainer.Trainer`) and SFT
(:class:`~agentboost.train.sft.SFTTrainer`) both run :meth:`TrainingLoop.train`.

Per step: a held-out evaluation when one is due, then the trainer's own ``train_step`` (gradient
accumulation and the learning-rate schedule live there), metrics to ``metrics.jsonl`` / TensorBoard /
wandb, a checkpoint every ``checkpoint.every`` steps and after the last. A run resumes from its
latest checkpoint (weights, optimizer, step, RNG states and the trainer's own state), stops early at
a wall-clock limit, evaluates once more at the end, and writes the final model.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentboost.models.precision import Precision
from agentboost.train.checkpoint import Checkpoints
from agentboost.train.distributed import Ranks, SilentLogger
from agentboost.train.logging import MetricsLogger


class TrainingLoop:
    """What a trainer supplies; :meth:`train` does the rest. Set in ``__init__``: ``config`` (with
    ``checkpoint``, ``logging`` and ``eval`` sections and ``to_dict``), ``run_dir``, ``model``,
    ``optimizer``, ``checkpointer``; the loop keeps ``step``, ``resumed_from`` and ``eval_rewards``."""

    config: Any
    run_dir: Path
    model: Any
    optimizer: Any
    checkpointer: Checkpoints
    precision: Precision
    """The run's precision policy (weights and compute dtypes), said at the start of the run."""
    ranks: Ranks = Ranks()
    """This process's place in a data-parallel run (:mod:`.distributed`); rank 0 alone writes files."""
    step: int = 0
    resumed_from: int | None = None
    eval_rewards: dict[int, float]
    total_steps: int
    """Steps the run makes (an attribute or a property of the trainer)."""
    progress_name = "train"
    """The progress bar's label."""

    # --- what each trainer defines -----------------------------------------------------------------

    @property
    def time_limit_s(self) -> float:
        """Stop after the step during which this much time has passed (then evaluate and save)."""
        return math.inf

    @property
    def evaluates(self) -> bool:
        """Whether held-out evaluations run (every ``config.eval.every`` steps and at the end)."""
        return bool(self.config.eval.every)

    def train_step(self, step: int, *, bar: Any = None) -> dict[str, float]:
        raise NotImplementedError

    def evaluate(self, step: int, *, bar: Any = None) -> dict[str, float]:
        raise NotImplementedError

    def save_model(self, directory: Path) -> None:
        raise NotImplementedError

    def checkpoint_state(self) -> dict[str, Any]:
        """The trainer's own state saved with each checkpoint (beyond weights, optimizer and step)."""
        return {}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Take back :meth:`checkpoint_state` when resuming."""

    def started(self, logger: MetricsLogger) -> None:
        """Called once the logger is open, before the first step (e.g. to log data statistics)."""

    def finished_step(self, step: int, metrics: dict[str, float]) -> None:
        """Called after each step's metrics are logged."""

    def postfix(self, metrics: dict[str, float]) -> str:
        """The progress bar's text after a step."""
        return ""

    def close(self) -> None:
        """Release engines and threads (always called, also on failure)."""

    def _phase(self, bar: Any, text: str, total: int | None = None) -> Callable[[Any], None]:
        """A callback that shows ``text done/total`` on the bar as rollouts finish (shown at once)."""
        counter = {"done": 0}
        if bar is not None:
            bar.set_description_str(f"{text} 0/{total}" if total else text, refresh=True)
        elif total and self.ranks.writes:
            print(f"agentboost: {text}: {total} held-out rollouts", file=sys.stderr)

        def on_result(_: Any) -> None:
            counter["done"] += 1
            if bar is not None:
                done = f"{counter['done']}/{total}" if total else str(counter["done"])
                bar.set_description_str(f"{text} {done}", refresh=True)

        return on_result

    # --- the loop ----------------------------------------------------------------------------------

    def summary(self) -> Any:
        """What :meth:`train` returns."""
        raise NotImplementedError

    def train(self) -> Any:
        """Run (or resume) every step, with evaluations and checkpoints; the final model at the end.
        Returns :meth:`summary`."""
        config = self.config
        self.step = self._resume()
        writes = self.ranks.writes
        if writes:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        logger = (
            MetricsLogger(
                self.run_dir,
                start_step=self.step,
                config=config.to_dict(),
                wandb_project=config.logging.wandb_project,
                wandb_run_name=config.logging.wandb_run_name,
                wandb_mode=config.logging.wandb_mode,
            )
            if writes
            else SilentLogger()
        )
        if writes:
            print(f"agentboost: precision: {self.precision.describe()}", file=sys.stderr)
        logger.log(self.step, "precision", self.precision.as_metrics())
        bar = self._progress_bar()
        began = time.monotonic()
        try:
            self.started(logger)
            total = self.total_steps
            out_of_time = False
            while self.step < total and not out_of_time:
                step = self.step
                if self._evaluation_due(step):
                    logger.log(step, "eval", self.evaluate(step, bar=bar))
                    logger.plot()
                    if bar is not None:
                        bar.set_description_str(self.progress_name, refresh=False)
                metrics = self.train_step(step, bar=bar)
                logger.log(step, "train", metrics)
                self.finished_step(step, metrics)
                self.step = step + 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(self.postfix(metrics), refresh=True)
                self.ranks.check_weights(self.model, self.step)
                every = config.checkpoint.every
                # every rank takes the same branch: the limit counts when any rank reached it
                out_of_time = self.ranks.any(time.monotonic() - began >= self.time_limit_s)
                if writes and ((every and self.step % every == 0) or self.step == total or out_of_time):
                    self.save_checkpoint()
            if self.step < total and writes:
                print(
                    f"agentboost: stopped after step {self.step} of {total}: "
                    f"time_limit_minutes={config.time_limit_minutes} reached",
                    file=sys.stderr,
                )
            if self.evaluates and self.step not in self.eval_rewards:
                logger.log(self.step, "eval", self.evaluate(self.step, bar=bar))
            if self.evaluates or self.plots_without_evaluation:
                logger.plot()
            if config.checkpoint.save_final_model and writes:
                self.save_model(self.run_dir / "final")
        finally:
            if bar is not None:
                bar.close()
            logger.close()
            self.close()
        return self.summary()

    plots_without_evaluation = True
    """Draw the reward curve at the end even when nothing was evaluated (the RL trainer's training
    rewards); SFT has no reward to draw without evaluations."""

    def _evaluation_due(self, step: int) -> bool:
        every = self.config.eval.every
        return self.evaluates and step % every == 0 and step not in self.eval_rewards

    def _progress_bar(self) -> Any:
        if not self.config.logging.progress or not self.ranks.writes:
            return None
        from tqdm import tqdm

        return tqdm(
            total=self.total_steps,
            initial=self.step,
            unit="step",
            desc=self.progress_name,
            file=sys.stderr,
            dynamic_ncols=True,
        )

    # --- checkpoints -------------------------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        return self.checkpointer.list()

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step_NNNNNN`` atomically (a killed save leaves no half checkpoint)."""
        state = {
            **self.checkpoint_state(),
            "eval_rewards": {str(k): v for k, v in self.eval_rewards.items()},
            "config": self.config.to_dict(),
        }
        return self.checkpointer.save(self.step, self.model, self.optimizer, state)

    def _resume(self) -> int:
        """Load the newest intact checkpoint when resuming (saying whether the run resumes or starts
        fresh, and naming a damaged checkpoint it passes over); returns the step to continue from."""
        latest = self.checkpointer.load_latest(
            self.model,
            self.optimizer,
            config=self.config.to_dict(),
            resume=self.config.checkpoint.resume,
            run_dir=self.run_dir,
        )
        step = 0 if latest is None else self._restore(latest[1])
        self.resumed_at(step)
        return step

    def resumed_at(self, step: int) -> None:
        """Called with the step the run continues from (0 for a fresh start), before any is run."""

    def load_checkpoint(self, path: Path) -> int:
        """Restore weights, optimizer, step, evaluations, RNG states and the trainer's state from
        ``path``; returns its step."""
        return self._restore(
            self.checkpointer.load(path, self.model, self.optimizer, config=self.config.to_dict())
        )

    def _restore(self, state: dict[str, Any]) -> int:
        """The run's own facts from a loaded checkpoint's state.json; returns its step."""
        self.eval_rewards = {int(k): v for k, v in state.get("eval_rewards", {}).items()}
        self.restore_state(state)
        self.resumed_from = int(state["step"])
        return int(state["step"])
