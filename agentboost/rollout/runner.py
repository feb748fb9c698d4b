"""Run ``tasks x samples`` rollouts with bounded concurrency, live progress and resumable results.

The runner owns what is the same however rollouts execute: which (task, sample) pairs are left, the
retry policy, the results file and the progress bar. Execution is pluggable: in this process
(:func:`in_process`) or in long-lived worker processes (:class:`~agentboost.rollout.workers.WorkerPool`).
"""

from __future__ import annotations

import asyncio
import sys
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import Engine, SamplingParams
from agentboost.envs.base import Environment, RolloutResult
from agentboost.envs.task import Task
from agentboost.errors import ConfigError
from agentboost.rollout.results import ResultStore
from agentboost.tokens.trajectory import TerminationReason, Trajectory


@dataclass(frozen=True)
class Job:
    """One rollout to run: a task (as the environment's plain dict), which sample, and its seed."""

    task_id: str
    task: dict[str, Any]
    sample: int
    seed: int


Execute = Callable[[Job], Awaitable[RolloutResult]]


class WorkerCrashed(Exception):
    """The process running a rollout died; the rollout may be retried."""


@dataclass
class RunConfig:
    samples: int = 1
    """Rollouts per task (a GRPO group size, or pass@k)."""
    concurrency: int = 64
    """Rollouts in flight at once."""
    retries: int = 2
    """Extra attempts for a rollout that ended with ``engine_error`` or whose worker crashed."""
    retry_backoff_s: float = 1.0
    """Wait before the first retry; doubles each time."""
    seed: int = 0
    """Base of the per-(task, sample) sampling seeds, so a resumed run samples what a fresh one would."""
    progress: bool = True


@dataclass
class RunSummary:
    total: int
    skipped: int
    """Already in the results file when the run started (resumed)."""
    completed: int = 0
    failed: int = 0
    rewards: list[float] = field(default_factory=list)
    terminations: Counter[str] = field(default_factory=Counter)
    generated_tokens: int = 0
    retried: int = 0
    elapsed_s: float = 0.0

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def line(self) -> str:
        mean = "n/a" if self.mean_reward is None else f"{self.mean_reward:.3f}"
        endings = (
            ", ".join(f"{reason} {count}" for reason, count in self.terminations.most_common()) or "none"
        )
        rate = self.generated_tokens / self.elapsed_s if self.elapsed_s else 0.0
        return (
            f"{self.completed} rollouts ({self.skipped} already done, {self.failed} failed, "
            f"{self.retried} retried): "
            f"mean reward {mean} | {endings} | {self.generated_tokens} tokens in {self.elapsed_s:.1f} s "
            f"({rate:.1f} tok/s)"
        )


def job_seed(base: int, task_id: str, sample: int) -> int:
    return zlib.crc32(f"{base}:{task_id}:{sample}".encode()) & 0x7FFFFFFF


def plan_jobs(environment: Environment, tasks: Sequence[Task], config: RunConfig) -> list[Job]:
    """Every (task, sample) pair, tasks in order, samples of a task together."""
    jobs = []
    seen: set[str] = set()
    for task in tasks:
        if not isinstance(task, Task):
            raise ConfigError(
                f"{type(environment).__name__}.tasks() must return agentboost Task objects, "
                f"got {type(task).__name__}"
            )
        task_id = task.id
        if task_id in seen:
            raise ConfigError(f"two tasks share the id {task_id!r}; task ids must be unique to resume")
        seen.add(task_id)
        payload = task.to_dict()
        for sample in range(config.samples):
            jobs.append(Job(task_id, payload, sample, job_seed(config.seed, task_id, sample)))
    return jobs


def in_process(
    environment: Environment,
    engine: Engine,
    tokenizer: Any,
    *,
    sampling: SamplingParams | None = None,
    limits: RolloutLimits | None = None,
) -> Execute:
    """Run each job as a coroutine in this process's event loop."""
    base = sampling or SamplingParams()

    async def execute(job: Job) -> RolloutResult:
        task = Task.from_dict(job.task)
        return await environment.rollout(
            task, engine, tokenizer, sampling=replace(base, seed=job.seed), limits=limits, sample=job.sample
        )

    return execute


def crashed_result(job: Job, detail: str) -> RolloutResult:
    """What is recorded for a rollout whose worker died on every attempt."""
    trajectory = Trajectory(
        task_id=job.task_id,
        messages=[],
        token_ids=[],
        loss_mask=[],
        logprobs=[],
        segments=[],
        termination=TerminationReason.WORKER_CRASHED,
        termination_detail=detail,
    )
    return RolloutResult(
        job.task_id, job.sample, trajectory, None, reward_error="no reward: the worker crashed"
    )


async def run_jobs(
    jobs: Sequence[Job], execute: Execute, store: ResultStore, config: RunConfig
) -> RunSummary:
    """Run the jobs not yet in ``store``; write each result as soon as it is final."""
    pending = [job for job in jobs if (job.task_id, job.sample) not in store.done]
    summary = RunSummary(total=len(jobs), skipped=len(jobs) - len(pending))
    started = time.perf_counter()
    semaphore = asyncio.Semaphore(config.concurrency)
    bar = None
    if config.progress:
        from tqdm import tqdm

        bar = tqdm(
            total=len(jobs), initial=summary.skipped, unit="rollout", file=sys.stderr, dynamic_ncols=True
        )

    async def attempt(job: Job) -> RolloutResult:
        delay = config.retry_backoff_s
        for number in range(1, config.retries + 2):
            try:
                result = await execute(job)
            except WorkerCrashed as crash:
                result = crashed_result(job, str(crash))
            result.attempts = number
            if not result.termination.retryable or number > config.retries:
                return result
            summary.retried += 1
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def one(job: Job) -> None:
        async with semaphore:
            result = await attempt(job)
        store.write(result)
        summary.completed += 1
        summary.terminations[result.termination.value] += 1
        summary.generated_tokens += result.trajectory.generated_tokens
        if result.failed:
            summary.failed += 1
        if result.reward is not None:
            summary.rewards.append(result.reward)
        if bar is not None:
            elapsed = time.perf_counter() - started
            mean = summary.mean_reward
            bar.set_postfix(
                failed=summary.failed,
                reward="n/a" if mean is None else f"{mean:.3f}",
                tok_s=f"{summary.generated_tokens / elapsed:.1f}" if elapsed else "0",
                refresh=False,
            )
            bar.update(1)

    try:
        await asyncio.gather(*(one(job) for job in pending))
    finally:
        summary.elapsed_s = time.perf_counter() - started
        if bar is not None:
            bar.close()
    return summary
