"""Rollouts on the current weights: the step's groups and the held-out evaluations, through the runner."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentboost.agent.limits import RolloutLimits, resolve_limits
from agentboost.engines.base import SamplingParams
from agentboost.envs.base import Environment, RolloutResult
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
    """What the trainer and ``agentboost sft`` log about a set of rollouts (unscored rewards count as 0).

    ``reward_mean``, ``reward_std`` (sample std), ``failed``, ``generated_tokens_mean`` and
    ``tool_use_rate``: the share of rollouts with at least one tool call.
    """
    count = max(1, len(results))
    rewards = [r.reward if r.reward is not None else 0.0 for r in results]
    mean = sum(rewards) / count
    variance = sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1) if len(rewards) > 1 else 0.0
    return {
        "reward_mean": mean,
        "reward_std": math.sqrt(variance),
        "failed": float(sum(r.failed for r in results)),
        "generated_tokens_mean": sum(r.trajectory.generated_tokens for r in results) / count,
        "tool_use_rate": sum(1 for r in results if r.trajectory.metrics.get("tool_calls")) / count,
    }


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
