"""The one reward summary: how many rollouts were scored, unscorable or failed, and the mean reward.

Every report and log reads :func:`reward_summary` (``agentboost eval``, ``agentboost stats``, the
trainer's ``reward/*`` and ``rollout/*`` metrics, its held-out ``eval/*`` metrics and ``agentboost
sft``'s), so "mean reward" means one thing everywhere:

    mean reward    the mean of the rewards of the SCORED rollouts
    coverage       scored / total: the share of rollouts the mean (and every rate) is over

Unscorable rollouts (the reward raised :class:`~agentboost.errors.UnscorableError`: a judge down) and
failed ones (engine, worker or environment errors, and rewards that raised anything else, which are
environment bugs: failure ``reward_error``) are counted beside the mean, never averaged in as 0 and
never dropped silently. Nothing a policy writes can leave a rollout unscored (rewards are total over
model output), so a coverage below 100% is an infrastructure or environment problem to look at, and a
rate whose coverage is below 100% is marked as such in reports.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from agentboost.envs.base import Outcome, RolloutResult

MEAN_REWARD_DEFINITION = "mean over scored rollouts; unscorable and failed rollouts are counted, not averaged"


@dataclass(frozen=True)
class RewardSummary:
    """Counts by outcome and the reward statistics of the scored rollouts."""

    total: int
    scored: int
    unscorable: int
    failed: int
    failures: dict[str, int] = field(default_factory=dict)
    """Failed rollouts by reason: a failed termination (``engine_error``...) or ``reward_error``."""
    mean: float | None = None
    """Mean reward over the scored rollouts (None when none was scored)."""
    std: float | None = None
    """Sample standard deviation of the scored rewards (0 for one, None for none)."""
    successes: int = 0
    """Scored rollouts whose reward reached the threshold."""
    threshold: float = 1.0

    @property
    def coverage(self) -> float | None:
        """Scored / total (None for no rollouts)."""
        return self.scored / self.total if self.total else None

    @property
    def complete(self) -> bool:
        """Every rollout was scored (a rate over them is over all of them)."""
        return self.scored == self.total

    @property
    def success_rate(self) -> float | None:
        """Scored rollouts with reward >= threshold, over the scored rollouts."""
        return self.successes / self.scored if self.scored else None

    @property
    def failed_fraction(self) -> float:
        """Failed / total (0 for no rollouts): what the trainer's ``max_failed_fraction`` bounds."""
        return self.failed / self.total if self.total else 0.0

    def metrics(self) -> dict[str, float]:
        """Flat numbers for training logs: ``reward_mean`` (NaN when nothing was scored), ``reward_std``,
        ``scored``, ``unscorable``, ``failed``, ``coverage`` and ``failed/<reason>`` per reason."""
        values = {
            "reward_mean": math.nan if self.mean is None else self.mean,
            "reward_std": math.nan if self.std is None else self.std,
            "scored": float(self.scored),
            "unscorable": float(self.unscorable),
            "failed": float(self.failed),
            "coverage": math.nan if self.coverage is None else self.coverage,
        }
        values.update({f"failed/{reason}": float(count) for reason, count in sorted(self.failures.items())})
        return values


def reward_summary(results: Iterable[RolloutResult], *, threshold: float = 1.0) -> RewardSummary:
    """Summarise ``results`` by outcome; the mean and success rate are over the scored ones."""
    rewards: list[float] = []
    unscorable = 0
    failures: Counter[str] = Counter()
    total = 0
    for result in results:
        total += 1
        outcome = result.outcome
        if outcome is Outcome.SCORED:
            rewards.append(float(result.reward))  # type: ignore[arg-type]
        elif outcome is Outcome.UNSCORABLE:
            unscorable += 1
        else:
            failures[result.failure or "failed"] += 1
    mean = sum(rewards) / len(rewards) if rewards else None
    std = None
    if mean is not None:
        std = (
            math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) if len(rewards) > 1 else 0.0
        )
    return RewardSummary(
        total=total,
        scored=len(rewards),
        unscorable=unscorable,
        failed=sum(failures.values()),
        failures=dict(failures.most_common()),
        mean=mean,
        std=std,
        successes=sum(r >= threshold for r in rewards),
        threshold=threshold,
    )
