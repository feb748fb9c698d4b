"""What each step sees and at which learning rate: functions of the step alone, so a resumed run
draws exactly the data and rates the uninterrupted one would."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import torch

from agentboost.train.config import OptimizerConfig

Item = TypeVar("Item")


def items_for_step(pool: Sequence[Item], step: int, per_step: int, seed: int) -> list[Item]:
    """A new permutation of ``pool`` each epoch, ``per_step`` items at a time.

    The tail of an epoch that does not fill a step is skipped.
    """
    steps_per_epoch = max(1, len(pool) // per_step)
    epoch, offset = divmod(step, steps_per_epoch)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(pool), generator=generator).tolist()
    return [pool[i] for i in order[offset * per_step : (offset + 1) * per_step]]


def learning_rate(optimizer: OptimizerConfig, step: int, total_steps: int) -> float:
    """Linear warm-up for ``warmup_steps``, then constant, linear or cosine decay to lr * min_lr_ratio."""
    if step < optimizer.warmup_steps:
        return optimizer.lr * (step + 1) / (optimizer.warmup_steps + 1)
    if optimizer.schedule == "constant":
        return optimizer.lr
    span = max(1, total_steps - optimizer.warmup_steps - 1)
    progress = min(1.0, (step - optimizer.warmup_steps) / span)
    linear = optimizer.schedule == "linear"
    factor = 1.0 - progress if linear else 0.5 * (1.0 + math.cos(math.pi * progress))
    return optimizer.lr * (optimizer.min_lr_ratio + (1.0 - optimizer.min_lr_ratio) * factor)
