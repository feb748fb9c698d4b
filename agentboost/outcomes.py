"""What a rollout came to: its reward (or why there is none), its outcome, and the one reward summary.

This is the outcome model every layer above the agent reads: environments score into it
(:class:`Reward`, :class:`RewardFailure`), :func:`rollout_result` records a rollout in it
(:class:`RolloutResult`), and the runner, the evaluator and the trainers summarise it
(:func:`reward_summary`). It imports nothing above :mod:`agentboost.tokens`, so none of those layers
reaches up into another to name it.

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

Failures are split by who caused them (:class:`FailureRule`, one per environment): a failed ending the
policy can provoke (by default ``agent_error`` after the policy generated: an agent that crashed on tool
arguments the model wrote) is SCORED with the environment's failure reward, so a crash is never an exit
from the reward; every other failed ending (an engine that never answered, a dead server, a crashed
worker, an environment bug) is infrastructure's: FAILED, masked out of training, run again on resume.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from agentboost.errors import ConfigError
from agentboost.tokens.trajectory import TerminationReason, Trajectory

__all__ = [
    "MEAN_REWARD_DEFINITION",
    "POLICY_FAILURES",
    "REWARD_ERROR",
    "FailureRule",
    "Outcome",
    "Reward",
    "RewardFailure",
    "RewardSummary",
    "RolloutResult",
    "reward_summary",
    "rollout_result",
]


@dataclass
class Reward:
    """A reward with the parts it was made of.

    ``breakdown`` holds numbers that reports aggregate (``{"correct": 1.0, "format": 0.2}``); ``info``
    holds other JSON facts about how the reward was reached (``{"first_failure_status": "timeout"}``).
    """

    value: float
    breakdown: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardFailure:
    """Why :meth:`~agentboost.envs.base.Environment.score` has no reward: the error text, and whether
    it was unscorable (the reward raised :class:`~agentboost.errors.UnscorableError`)."""

    detail: str
    unscorable: bool


class Outcome(str, Enum):
    """What a rollout's reward is worth to a report or a trainer: every rollout is exactly one."""

    SCORED = "scored"
    """A reward was computed. Whatever the policy wrote ends here (a malformed answer scores 0)."""
    UNSCORABLE = "unscorable"
    """The reward could not be computed for a reason outside the policy's control: the reward raised
    :class:`~agentboost.errors.UnscorableError` (a judge down, a simulated user that broke)."""
    FAILED = "failed"
    """Infrastructure failed: the engine, a worker, the environment (a failed termination), or the
    reward function itself raised another exception, which is a bug in the environment
    (:attr:`RolloutResult.failure` ``reward_error``)."""


POLICY_FAILURES: frozenset[TerminationReason] = frozenset({TerminationReason.AGENT_ERROR})
"""The failed endings the default :class:`FailureRule` blames on the policy (once it generated)."""

_INFRASTRUCTURE = frozenset(
    {TerminationReason.ENGINE_ERROR, TerminationReason.ENGINE_TIMEOUT, TerminationReason.WORKER_CRASHED}
)
"""Failed endings no rule may blame on the policy: the engine or the worker process failed."""

POLICY_FAILURE = "policy_failure"
"""The ``reward_info`` key of a rollout scored by the failure rule: the termination it blamed."""


@dataclass(frozen=True)
class FailureRule:
    """Which failed endings are the policy's, and what they score: the one rule every builder applies.

    A failed ending (:attr:`~agentboost.tokens.trajectory.TerminationReason.failed`) is the POLICY's when
    its reason is in :attr:`policy` and the policy generated at least one token before it: the model
    could have provoked it (tool arguments that crash a gateway agent, a malformed call that breaks the
    agent). It is scored :attr:`reward`, counted in the mean, trained on with its real loss mask and
    kept on resume; ``reward_info["policy_failure"]`` names the termination. Every other failed ending
    is infrastructure's (an engine that never answered, a dead server, a crashed worker, an environment
    bug, a crash before the model acted): no reward, masked out of its GRPO group, run again on resume.

    Set an environment's ``failure_rule`` to change it: ``FailureRule(reward=-1.0)`` to punish crashes
    below a wrong answer, ``FailureRule(policy=frozenset())`` to mask every failure (the old behaviour,
    which lets a policy escape a low reward by crashing its agent).
    """

    reward: float = 0.0
    """What a failure the policy caused scores (the environment's lowest reward is a safe choice)."""
    policy: frozenset[TerminationReason] = POLICY_FAILURES
    """The failed endings that are the policy's once it has generated."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.reward, bool)
            or not isinstance(self.reward, int | float)
            or not math.isfinite(self.reward)
        ):
            raise ConfigError(f"FailureRule.reward must be a finite number, got {self.reward!r}")
        try:
            reasons = frozenset(TerminationReason(reason) for reason in self.policy)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"FailureRule.policy must be termination reasons: {error}") from error
        refused = sorted(reason.value for reason in reasons if not reason.failed or reason in _INFRASTRUCTURE)
        if refused:
            allowed = sorted(r.value for r in TerminationReason if r.failed and r not in _INFRASTRUCTURE)
            raise ConfigError(
                f"FailureRule.policy lists {refused}: normal endings are scored by the reward and "
                f"engine or worker failures are never the policy's; choose among {allowed}"
            )
        object.__setattr__(self, "reward", float(self.reward))
        object.__setattr__(self, "policy", reasons)

    def blames_policy(self, trajectory: Trajectory) -> bool:
        """The trajectory failed in a way its policy caused (see the class docstring)."""
        termination = trajectory.termination
        generated = any(row.generated_tokens for row in trajectory.training_rows)  # a forked session's too
        return termination.failed and termination in self.policy and generated

    def score(self, trajectory: Trajectory) -> Reward:
        """The reward of a failure the policy caused, saying why."""
        return Reward(self.reward, info={POLICY_FAILURE: trajectory.termination.value})


DEFAULT_FAILURE_RULE = FailureRule()
"""Every environment's rule unless it sets its own ``failure_rule``: ``agent_error`` after the policy
generated scores 0.0; every other failure is masked."""

REWARD_ERROR = "reward_error"
"""The failure reason of a rollout whose reward function raised (a bug in the environment)."""


@dataclass
class RolloutResult:
    """One rollout of one task: its trajectory and its reward (or why the reward failed).

    The result owns the reward: a trajectory holds tokens and messages only. :attr:`outcome` says
    whether it was scored, unscorable or failed; only scored rollouts carry a reward. Build one with
    :func:`rollout_result`.
    """

    task_id: str
    sample: int
    trajectory: Trajectory
    reward: float | None
    """None when no reward was computed (a failed rollout or reward function); see ``reward_error``."""
    reward_breakdown: dict[str, float] = field(default_factory=dict)
    reward_info: dict[str, Any] = field(default_factory=dict)
    reward_error: str | None = None
    attempts: int = 1
    """How many times the rollout ran (retryable failures are run again by the runner)."""
    unscorable: bool = False
    """The reward raised :class:`~agentboost.errors.UnscorableError` (see :attr:`outcome`)."""

    @property
    def termination(self) -> TerminationReason:
        return self.trajectory.termination

    @property
    def outcome(self) -> Outcome:
        """Scored, unscorable or failed (the one rule every report and trainer reads)."""
        if self.reward is not None:
            return Outcome.SCORED  # a failed ending carries a reward only when the policy caused it
        if self.termination.failed:
            return Outcome.FAILED
        return Outcome.UNSCORABLE if self.unscorable else Outcome.FAILED

    @property
    def policy_failure(self) -> bool:
        """A failed ending the :class:`FailureRule` blamed on the policy: scored with the environment's
        failure reward (``reward_info["policy_failure"]`` names the termination)."""
        return self.termination.failed and self.reward is not None

    @property
    def failure(self) -> str | None:
        """Why a failed rollout failed: its termination (``engine_error``...) or ``reward_error``.
        None for a scored rollout, a policy failure included."""
        if self.reward is not None:
            return None
        if self.termination.failed:
            return self.termination.value
        if not self.unscorable:
            return REWARD_ERROR
        return None

    @property
    def failed(self) -> bool:
        """Not scored (failed or unscorable): the sample carries no reward; resume runs it again."""
        return self.outcome is not Outcome.SCORED

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "sample": self.sample,
            "reward": self.reward,
            "reward_breakdown": self.reward_breakdown,
            "reward_info": self.reward_info,
            "reward_error": self.reward_error,
            "attempts": self.attempts,
            "outcome": self.outcome.value,
            "failure": self.failure,
            "termination": self.termination.value,
            "trajectory": self.trajectory.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutResult:
        return cls(
            task_id=data["task_id"],
            sample=int(data["sample"]),
            trajectory=Trajectory.from_dict(data["trajectory"]),
            reward=data.get("reward"),
            reward_breakdown=dict(data.get("reward_breakdown") or {}),
            reward_info=dict(data.get("reward_info") or {}),
            reward_error=data.get("reward_error"),
            attempts=int(data.get("attempts", 1)),
            unscorable=data.get("outcome") == Outcome.UNSCORABLE.value,
        )


def rollout_result(
    trajectory: Trajectory,
    reward: Reward | RewardFailure | None = None,
    *,
    sample: int = 0,
    failure_rule: FailureRule | None = None,
) -> RolloutResult:
    """Record one rollout: its trajectory and what scoring it gave. The one way every rollout is recorded.

    A trajectory whose termination failed (``engine_error``, ``agent_error``...) is never scored by
    ``reward`` (pass None): ``failure_rule`` (the environment's; default :class:`FailureRule`) scores
    it with its failure reward when the policy caused it, else it is recorded failed. A
    :class:`RewardFailure` is recorded unscorable or ``reward_error``; a :class:`Reward` is recorded scored.
    """
    task_id = trajectory.task_id
    rule = failure_rule if failure_rule is not None else DEFAULT_FAILURE_RULE
    if rule.blames_policy(trajectory):
        scored = rule.score(trajectory)
        return RolloutResult(
            task_id, sample, trajectory, scored.value, dict(scored.breakdown), dict(scored.info)
        )
    if trajectory.termination.failed:
        detail = trajectory.termination_detail
        ended = f"no reward: the rollout ended {trajectory.termination.value}" + (
            f" ({detail})" if detail else ""
        )
        return RolloutResult(task_id, sample, trajectory, None, reward_error=ended)
    if isinstance(reward, RewardFailure):
        return RolloutResult(
            task_id, sample, trajectory, None, reward_error=reward.detail, unscorable=reward.unscorable
        )
    if isinstance(reward, Reward):
        return RolloutResult(
            task_id, sample, trajectory, reward.value, dict(reward.breakdown), dict(reward.info)
        )
    raise TypeError(
        f"rollout_result() needs a Reward or a RewardFailure for a rollout that ended "
        f"{trajectory.termination.value}, got {type(reward).__name__}"
    )


# --- the one reward summary -----------------------------------------------------------------------

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
    policy_failures: int = 0
    """Scored rollouts that failed in a way the policy caused (their reward is the failure rule's)."""

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
        ``scored``, ``unscorable``, ``failed``, ``coverage``, ``failed/<reason>`` per reason and
        ``policy_failures`` (scored, at the failure reward)."""
        values = {
            "reward_mean": math.nan if self.mean is None else self.mean,
            "reward_std": math.nan if self.std is None else self.std,
            "scored": float(self.scored),
            "unscorable": float(self.unscorable),
            "failed": float(self.failed),
            "coverage": math.nan if self.coverage is None else self.coverage,
            "policy_failures": float(self.policy_failures),
        }
        values.update({f"failed/{reason}": float(count) for reason, count in sorted(self.failures.items())})
        return values


def reward_summary(results: Iterable[RolloutResult], *, threshold: float = 1.0) -> RewardSummary:
    """Summarise ``results`` by outcome; the mean and success rate are over the scored ones."""
    rewards: list[float] = []
    unscorable = policy_failures = 0
    failures: Counter[str] = Counter()
    total = 0
    for result in results:
        total += 1
        outcome = result.outcome
        if outcome is Outcome.SCORED:
            rewards.append(float(result.reward))  # type: ignore[arg-type]
            policy_failures += result.policy_failure
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
        policy_failures=policy_failures,
    )
