"""Rollouts on the current weights: the step's groups and the held-out evaluations, through the runner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentboost.agent.limits import RolloutLimits, resolve_limits
from agentboost.engines.base import SamplingParams
from agentboost.envs.base import Environment, Outcome, RolloutResult
from agentboost.errors import TooManyFailuresError
from agentboost.rollout.outcomes import reward_summary
from agentboost.rollout.results import ResultStore, read_results
from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs
from agentboost.train.config import EvalConfig, RolloutConfig


class CountingStore(ResultStore):
    """A ResultStore that reports each written result (to move the step's progress bar)."""

    def __init__(self, path: Path, on_write: Callable[[RolloutResult], None]) -> None:
        super().__init__(path, resume=True)
        self._on_write = on_write

    def write(self, result: RolloutResult) -> None:
        super().write(result)
        self._on_write(result)


def result_metrics(results: Sequence[RolloutResult]) -> dict[str, float]:
    """What the trainer and ``agentboost sft`` log about a set of rollouts.

    The :func:`~agentboost.rollout.outcomes.reward_summary` numbers (``reward_mean`` and
    ``reward_std`` over the scored rollouts; ``scored``, ``unscorable``, ``failed``, ``coverage``,
    ``failed/<reason>``), plus ``generated_tokens_mean`` and ``tool_use_rate`` (the share of
    rollouts with at least one tool call).
    """
    count = max(1, len(results))
    return {
        **reward_summary(results).metrics(),
        "generated_tokens_mean": sum(r.trajectory.generated_tokens for r in results) / count,
        "tool_use_rate": sum(1 for r in results if r.trajectory.metrics.get("tool_calls")) / count,
    }


def step_results(
    results: Sequence[RolloutResult], *, max_failed_fraction: float
) -> tuple[list[RolloutResult], dict[str, float]]:
    """The rule for a training step's unscored rollouts: the scored ones, and the step's metrics.

    A failed or unscorable group member is MASKED: left out of the update and of its group's
    statistics, so the group's baseline (mean, std) is over its scored members only; a group left with
    fewer than two scored members carries no signal (counted in ``groups/zero_signal_fraction`` like a
    group of equal rewards). An unscored member is never given reward 0: that would teach the policy
    from an infrastructure failure. ``groups/with_unscored`` counts the groups that lost members.
    A failure the policy caused (:class:`~agentboost.outcomes.FailureRule`: an agent that crashed after
    a model turn) is not unscored: it carries the environment's failure reward and trains like any
    scored member, so crashing the agent is never an exit from the reward.

    Raises TooManyFailuresError when more than ``max_failed_fraction`` of the rollouts failed.
    """
    rewards = reward_summary(results)
    if rewards.failed_fraction > max_failed_fraction:
        reasons = ", ".join(f"{reason} {count}" for reason, count in rewards.failures.items())
        first = next(r for r in results if r.outcome is Outcome.FAILED)
        raise TooManyFailuresError(
            f"{rewards.failed} of {rewards.total} rollouts of the step failed ({reasons}), more than "
            f"rollout.max_failed_fraction={max_failed_fraction:g} allows; the first: task {first.task_id!r}: "
            f"{first.reward_error or first.trajectory.termination_detail}; fix it and resume the run"
        )
    summary = result_metrics(results)
    metrics = {
        "reward/mean": summary.pop("reward_mean"),
        "reward/std": summary.pop("reward_std"),
        "rollout/truncated_fraction": sum(r.termination.truncated for r in results) / max(1, len(results)),
        **{f"rollout/{name}": value for name, value in summary.items()},
        "groups/with_unscored": float(len({r.task_id for r in results if r.failed})),
    }
    return [r for r in results if not r.failed], metrics


def rollout_limits(
    rollout: RolloutConfig, defaults: RolloutLimits, *, eval_config: EvalConfig | None = None
) -> RolloutLimits:
    """The environment's limits with the config's overrides (``eval_config`` for evaluations)."""
    max_new_tokens = rollout.max_new_tokens
    if eval_config is not None and eval_config.max_new_tokens is not None:
        max_new_tokens = eval_config.max_new_tokens
    return resolve_limits(
        defaults,
        {
            "max_turns": rollout.max_turns,
            "max_new_tokens": max_new_tokens,
            "max_total_tokens": rollout.max_total_tokens,
            "timeout_s": rollout.timeout_s,
        },
    )


def collect_rollouts(
    environment: Environment,
    engine: Any,
    tokenizer: Any,
    path: Path,
    tasks: Sequence[Any],
    *,
    samples: int,
    sampling: SamplingParams,
    limits: RolloutLimits,
    seed: int,
    concurrency: int,
    retries: int,
    on_result: Callable[[RolloutResult], None],
) -> list[RolloutResult]:
    """Run ``tasks x samples`` rollouts (resuming ``path``); results in job order."""
    run_config = RunConfig(
        samples=samples, concurrency=concurrency, retries=retries, seed=seed, progress=False
    )
    jobs = plan_jobs(environment, tasks, run_config)
    execute = in_process(environment, engine, tokenizer, sampling=sampling, limits=limits)
    with CountingStore(path, on_result) as store:
        asyncio.run(run_jobs(jobs, execute, store, run_config))
    by_key = {(r.task_id, r.sample): r for r in read_results(path)}
    return [by_key[(job.task_id, job.sample)] for job in jobs]
