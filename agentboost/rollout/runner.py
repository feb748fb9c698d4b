"""Run ``tasks x samples`` rollouts with bounded concurrency, live progress and resumable results.

The runner owns what is the same however rollouts execute: which (task, sample) pairs are left, the
retry policy, the results file and the progress bar. Execution is pluggable: in this process
(:func:`in_process`) or in long-lived executors, an :class:`ExecutorPool`: worker processes
(:class:`~agentboost.rollout.workers.WorkerPool`) or Ray actors
(:class:`~agentboost.rollout.ray_pool.RayPool`).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
import zlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from agentboost.agent.limits import RolloutLimits
from agentboost.agent.live import LiveCounts, counting
from agentboost.engines.base import Engine, SamplingParams
from agentboost.envs.base import Environment, RolloutResult
from agentboost.envs.task import Task
from agentboost.errors import AgentBoostError, ConfigError, WorkerCrashed
from agentboost.rollout.results import Plan, ResultStore
from agentboost.tokens.tokenizer import Tokenizer
from agentboost.tokens.trajectory import TerminationReason, Trajectory


@dataclass(frozen=True)
class Job:
    """One rollout to run: a task (as the environment's plain dict), which sample, and its seed."""

    task_id: str
    task: dict[str, Any]
    sample: int
    seed: int


Execute = Callable[[Job], Awaitable[RolloutResult]]


_Pool = TypeVar("_Pool", bound="ExecutorPool")


class ExecutorPool(ABC):
    """Executors with a life of their own (worker processes, Ray actors): ``async with`` starts them,
    closing whatever did start when the start fails part-way, and closes them on the way out;
    :meth:`execute` is the runner's execution function."""

    @abstractmethod
    async def start(self) -> None:
        """Start the executors; return once they can run rollouts."""

    @abstractmethod
    async def close(self) -> None:
        """Stop every executor; safe after a failed or partial start."""

    @abstractmethod
    async def execute(self, job: Job) -> RolloutResult:
        """Run one rollout on an executor."""

    async def __aenter__(self: _Pool) -> _Pool:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


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
    stall_notice_s: float | None = 60.0
    """Say what the run waits for when no turn and no rollout finished for this long (None: never)."""

    def __post_init__(self) -> None:
        for name in ("samples", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigError(f"retries must be an integer >= 0 (0: no retries), got {self.retries!r}")
        if not self.retry_backoff_s >= 0:
            raise ConfigError(f"retry_backoff_s must be >= 0, got {self.retry_backoff_s!r}")
        if self.stall_notice_s is not None and not self.stall_notice_s > 0:
            raise ConfigError(f"stall_notice_s must be > 0 (or None), got {self.stall_notice_s!r}")


@dataclass
class RunSummary:
    total: int
    skipped: int
    """Already in the results file when the run started (resumed)."""
    completed: int = 0
    failed: int = 0
    scored: int = 0
    """Rollouts of this run with a reward."""
    reward_sum: float = 0.0
    terminations: Counter[str] = field(default_factory=Counter)
    generated_tokens: int = 0
    retried: int = 0
    elapsed_s: float = 0.0
    first_failure: str | None = None
    """Why the first failed rollout of this run failed (task, sample, termination and its detail)."""
    engine_never_answered: int = 0
    """Rollouts of this run that ran out of time before the engine answered once (see :func:`stalled`)."""
    environment: str | None = None
    """The environment's name, for :meth:`line` (set by :func:`~agentboost.rollout.run.run_rollouts`)."""
    out: str | None = None
    """The results file, for :meth:`line`."""

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.scored if self.scored else None

    def line(self) -> str:
        mean = "n/a" if self.mean_reward is None else f"{self.mean_reward:.3f}"
        endings = (
            ", ".join(f"{reason} {count}" for reason, count in self.terminations.most_common()) or "none"
        )
        rate = self.generated_tokens / self.elapsed_s if self.elapsed_s else 0.0
        line = (
            f"{self.completed} rollouts ({self.skipped} already done, {self.failed} failed, "
            f"{self.retried} retried): "
            f"mean reward {mean} | {endings} | {self.generated_tokens} tokens in {self.elapsed_s:.1f} s "
            f"({rate:.1f} tok/s)"
        )
        if self.environment:
            line = f"{self.environment}: {line}"
        if self.out:
            line = f"{line} -> {self.out}"
        if self.hint:
            line += f"\n{self.hint}"
        return line

    @property
    def hint(self) -> str | None:
        """The cause and the fix when rollouts ran out of time before the engine answered once."""
        if not self.engine_never_answered:
            return None
        return (
            f"{self.engine_never_answered} of {self.completed} rollouts ran out of time before the "
            "engine answered once: the machine or the engine is overloaded, or the timeout is too "
            "short for it; raise --timeout or lower --concurrency (they say nothing about the model)"
        )


def job_seed(base: int, task_id: str, sample: int) -> int:
    return zlib.crc32(f"{base}:{task_id}:{sample}".encode()) & 0x7FFFFFFF


class RunTasks(Iterable[Task]):
    """A run's tasks as its environment makes them: checked as they are made (agentboost Tasks, unique
    ids), never all held at once, so memory does not grow with ``-n``.

    ``make()`` calls the environment's ``tasks()``. What it returns is iterated again for each pass
    when it can be (a list, :class:`~agentboost.envs.task.GeneratedTasks`); a generator is asked for
    again (an environment's tasks are the same for the same arguments: resuming relies on it).
    A run takes at most ``limit`` tasks (``-n``) however many the environment makes. ``count`` is
    the number of tasks when the environment's answer has a length, else None.
    """

    def __init__(
        self, environment: Environment, make: Callable[[], Iterable[Task]], *, limit: int | None = None
    ) -> None:
        self.environment = environment
        self._make = make
        self._limit = limit
        self._kept: Iterable[Task] | None = self._call(make)
        self.count: int | None = None
        if isinstance(self._kept, Sized):
            self.count = len(self._kept) if limit is None else min(limit, len(self._kept))

    def _call(self, make: Callable[[], Iterable[Task]]) -> Iterable[Task]:
        try:
            tasks = make()
        except AgentBoostError:
            raise
        except Exception as error:
            raise self._raised(error) from error
        if not isinstance(tasks, Iterable) or isinstance(tasks, str | bytes | Mapping):
            raise ConfigError(
                f"{type(self.environment).__name__}.tasks() must return Task objects (a list or a "
                f"generator), got {type(tasks).__name__}"
            )
        return tasks

    def _raised(self, error: Exception) -> ConfigError:
        name = type(self.environment).__name__
        return ConfigError(f"{name}.tasks() raised {type(error).__name__}: {error}")

    def _source(self) -> Iterator[Task]:
        """A fresh pass over the environment's tasks, unchecked."""
        kept = self._kept
        if kept is not None and iter(kept) is kept:  # a generator: good for one pass only
            self._kept = None
            return kept
        return iter(kept if kept is not None else self._call(self._make))

    def __iter__(self) -> Iterator[Task]:
        return self._checked(repeats=True)

    def _checked(self, *, repeats: bool) -> Iterator[Task]:
        """A pass over the tasks, each checked to be a Task, and (``repeats``) of an id not seen before."""
        source = self._source()
        seen = SeenIds() if repeats else None
        for index in itertools.count() if self._limit is None else range(self._limit):
            try:
                task = next(source)
            except StopIteration:
                return
            except AgentBoostError:
                raise
            except Exception as error:
                raise self._raised(error) from error
            if not isinstance(task, Task):
                raise ConfigError(
                    f"{type(self.environment).__name__}.tasks() must return agentboost Task objects, "
                    f"got {type(task).__name__}"
                )
            if seen is not None:
                if seen.maybe(task.id) and self._among_first(task.id, index):
                    raise ConfigError(
                        f"two tasks share the id {task.id!r}; task ids must be unique to resume"
                    )
                seen.add(task.id)
            yield task

    def _among_first(self, task_id: str, count: int) -> bool:
        """Whether one of the first ``count`` tasks has id ``task_id`` (a fresh pass: exact)."""
        return any(task.id == task_id for task in itertools.islice(self._source(), count))

    def plan(self, samples: int) -> Plan:
        """The run's pairs; each check is a pass over the tasks (the run's own pass checks for repeats)."""
        return Plan(lambda: (task.id for task in self._checked(repeats=False)), samples, count=self.count)


class SeenIds:
    """Which task ids a pass has seen, in a fixed 16 MiB: a Bloom filter (never a false "no"; a "maybe"
    is confirmed exactly by the caller, about once in 10^8 ids when it is false), so checking a
    million ids for repeats costs no more memory than checking ten."""

    BITS = 1 << 27
    HASHES = 6

    def __init__(self) -> None:
        self._bits: bytearray | None = None

    def maybe(self, task_id: str) -> bool:
        bits = self._bits
        if bits is None:
            return False
        return all(bits[position >> 3] & (1 << (position & 7)) for position in self._positions(task_id))

    def add(self, task_id: str) -> None:
        if self._bits is None:
            self._bits = bytearray(self.BITS >> 3)
        bits = self._bits
        for position in self._positions(task_id):
            bits[position >> 3] |= 1 << (position & 7)

    def _positions(self, task_id: str) -> Iterator[int]:
        """The filter's bits for ``task_id`` (double hashing of one salted-per-process hash, which is
        all one pass needs)."""
        value = hash(task_id)
        first, second = value & 0xFFFFFFFF, ((value >> 32) & 0xFFFFFFFF) | 1
        for number in range(self.HASHES):
            yield (first + number * second) & (self.BITS - 1)


def plan_keys(environment: Environment, tasks: Iterable[Task], config: RunConfig) -> Plan:
    """The (task_id, sample) pairs of a run, its task ids held; raises ConfigError for a non-Task or
    two tasks with one id. (A run of any size uses :meth:`RunTasks.plan`, which holds none.)"""
    tasks = tasks if isinstance(tasks, Collection) else list(tasks)
    return Plan([task.id for task in RunTasks(environment, lambda: tasks)], config.samples)


def iter_jobs(environment: Environment, tasks: Iterable[Task], config: RunConfig) -> Iterator[Job]:
    """Every (task, sample) pair, tasks in order, samples of a task together, made as they are needed."""
    for task in tasks:
        task_id = task.id
        payload = task.to_dict()
        for sample in range(config.samples):
            yield Job(task_id, payload, sample, job_seed(config.seed, task_id, sample))


def plan_jobs(environment: Environment, tasks: Iterable[Task], config: RunConfig) -> list[Job]:
    """:func:`iter_jobs` as a list, after checking the tasks (agentboost Tasks with unique ids)."""
    tasks = tasks if isinstance(tasks, Collection) else list(tasks)
    return list(iter_jobs(environment, RunTasks(environment, lambda: tasks), config))


def in_process(
    environment: Environment,
    engine: Engine,
    tokenizer: Tokenizer,
    *,
    sampling: SamplingParams | None = None,
    limits: RolloutLimits | None = None,
    template: str | None = None,
) -> Execute:
    """Run each job as a coroutine in this process's event loop."""
    base = sampling if sampling is not None else SamplingParams()
    outage = getattr(engine, "outage", None)  # remote engines: every server down past the budget

    async def execute(job: Job) -> RolloutResult:
        task = Task.from_dict(job.task)
        result = await environment.run_episode(
            task,
            engine,
            tokenizer,
            sampling=replace(base, seed=job.seed),
            limits=limits,
            template=template,
            sample=job.sample,
        )
        if outage is not None and result.termination is TerminationReason.ENGINE_ERROR:
            down = outage()
            if down is not None:  # the run stops here; this rollout is not recorded, a resume runs it
                raise down
        return result

    return execute


def crashed_result(job: Job, detail: str) -> RolloutResult:
    """What is recorded for a rollout whose worker died on every attempt."""
    trajectory = Trajectory.empty(job.task_id, TerminationReason.WORKER_CRASHED, detail)
    return RolloutResult(
        job.task_id, job.sample, trajectory, None, reward_error="no reward: the worker crashed"
    )


def stalled(result: RolloutResult) -> bool:
    """The rollout ran out of time before the engine answered once: the machine, not the model
    (termination ``engine_timeout``, an infrastructure failure)."""
    return result.termination is TerminationReason.ENGINE_TIMEOUT


def waiting_for(in_flight: int, live: LiveCounts) -> str:
    """What a quiet run waits for, in a sentence: the engine, or tools and the environment."""
    generating = min(live.generating, in_flight)
    if generating == 0 and live.turns == 0:  # no turn reported: worker processes, or not started yet
        return f"{in_flight} rollouts in flight, waiting for their first turn (or for worker processes)"
    parts = [f"{in_flight} rollouts in flight: {generating} waiting for the engine to answer"]
    if in_flight - generating:
        parts.append(f"{in_flight - generating} in tools or the environment (a simulated user included)")
    text = ", ".join(parts)
    if live.turns == 0:
        text += "; the engine has not answered once yet (still loading, or overloaded: lower --concurrency)"
    else:
        text += f"; {live.turns} turns and {live.tokens} tokens so far"
    return text


def failure_cause(result: RolloutResult) -> str:
    """One line saying which rollout failed and why."""
    trajectory = result.trajectory
    if trajectory.termination.failed:
        why = f"{trajectory.termination.value}: {trajectory.termination_detail or 'no detail'}"
    else:
        why = f"reward failed: {result.reward_error}"
    return f"task {result.task_id!r} sample {result.sample}: {why}"


async def run_jobs(
    jobs: Iterable[Job],
    execute: Execute,
    store: ResultStore,
    config: RunConfig,
    *,
    total: int | None = None,
    on_result: Callable[[RolloutResult], None] | None = None,
) -> RunSummary:
    """Run the jobs not yet in ``store``; write each result as soon as it is final (then ``on_result``
    hears it, e.g. to move a progress bar).

    ``jobs`` may be a lazy iterator: at most ``config.concurrency`` jobs are held at once, and no
    task is created per job up front. ``total`` (the number of jobs, for the progress bar) is taken
    from ``len(jobs)`` when not given. Results are written on the store's writer thread.
    """
    if total is None:
        total = len(jobs) if isinstance(jobs, Sequence) else 0
    summary = RunSummary(total=total, skipped=0)
    started = time.perf_counter()
    bar = None
    if config.progress:
        from tqdm import tqdm

        bar = tqdm(total=total or None, unit="rollout", file=sys.stderr, dynamic_ncols=True)
    source = iter(jobs)
    live = LiveCounts()
    in_flight = 0
    last_shown = 0.0
    started_at = time.monotonic()
    last_done = started_at  # when a rollout last finished (the stall notice's clock)

    def show(*, refresh: bool) -> None:
        """The bar's postfix: turns and tokens of every rollout so far (in flight included)."""
        nonlocal last_shown
        if bar is None:
            return
        last_shown = time.perf_counter()
        elapsed = last_shown - started
        mean = summary.mean_reward
        tokens = max(live.tokens, summary.generated_tokens)  # live counts only in-process rollouts
        fields: dict[str, Any] = {"turns": live.turns} if live.turns else {}
        fields.update(
            tokens=tokens,
            failed=summary.failed,
            reward="n/a" if mean is None else f"{mean:.3f}",
            tok_s=f"{tokens / elapsed:.1f}" if elapsed else "0",
        )
        bar.set_postfix(fields, refresh=refresh)

    def on_turn() -> None:
        if time.perf_counter() - last_shown >= 0.5:  # at most two redraws a second
            show(refresh=True)

    live.on_turn = on_turn

    async def attempt(job: Job) -> RolloutResult:
        delay = config.retry_backoff_s
        number = 0
        while True:
            number += 1
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

    async def record(result: RolloutResult) -> None:
        nonlocal last_done
        writer = getattr(store, "awrite", None)
        if writer is not None:
            await writer(result)
        else:
            store.write(result)
        if on_result is not None:
            on_result(result)
        summary.completed += 1
        last_done = time.monotonic()
        summary.terminations[result.termination.value] += 1
        summary.generated_tokens += result.trajectory.generated_tokens
        if result.failed:
            summary.failed += 1
            if summary.first_failure is None:
                summary.first_failure = failure_cause(result)
        if result.reward is not None:
            summary.scored += 1
            summary.reward_sum += result.reward
        if stalled(result):
            summary.engine_never_answered += 1
        if bar is not None:
            show(refresh=False)
            bar.update(1)

    async def lane() -> None:
        """One of ``concurrency`` lanes: take the next job not yet done, run it, write it, repeat."""
        nonlocal in_flight
        for job in source:  # one shared iterator: each job is taken by exactly one lane
            if (job.task_id, job.sample) in store.done:
                summary.skipped += 1
                if bar is not None:
                    bar.update(1)
                continue
            in_flight += 1
            try:
                result = await attempt(job)
            finally:
                in_flight -= 1
            await record(result)

    async def tick() -> None:
        """Each second: show turns that came back since the bar was drawn, and whenever no turn and no
        rollout finished for ``config.stall_notice_s``, say what the run waits for."""
        quiet_s = config.stall_notice_s
        said = started_at
        shown_turns = 0
        while True:
            await asyncio.sleep(1.0 if quiet_s is None else min(1.0, quiet_s / 4))
            if live.turns != shown_turns:
                shown_turns = live.turns
                show(refresh=True)
            now = time.monotonic()
            if quiet_s is None or not in_flight or now - max(live.last_turn_at, last_done, said) < quiet_s:
                continue
            said = now
            quiet = now - max(live.last_turn_at, last_done)
            notice = f"agentboost: nothing finished in the last {quiet:.0f} s; {waiting_for(in_flight, live)}"
            if bar is not None:
                bar.write(notice, file=sys.stderr)
            else:
                print(notice, file=sys.stderr, flush=True)

    with counting(live):  # the lanes' tasks copy this context: their turns report to ``live``
        lanes = [
            asyncio.ensure_future(lane()) for _ in range(min(config.concurrency, total or config.concurrency))
        ]
    ticker = asyncio.ensure_future(tick()) if bar is not None or config.stall_notice_s else None
    try:
        done, _ = await asyncio.wait(lanes, return_when=asyncio.FIRST_EXCEPTION)
        for finished in done:
            finished.result()  # the first error (e.g. the disk is full) ends the run
    finally:
        if ticker is not None:
            ticker.cancel()
        for task in lanes:
            task.cancel()
        await asyncio.gather(*lanes, *([ticker] if ticker else []), return_exceptions=True)
        summary.elapsed_s = time.perf_counter() - started
        if bar is not None:
            bar.close()
    if not total:
        summary.total = summary.skipped + summary.completed
    return summary
