"""The runner's own costs with rollouts that cost nothing: memory of a large plan, loop stalls on writes.

Each "rollout" returns a ready-made small result at once, so what is measured is the runner: how
much memory a plan of N (task, sample) pairs costs while it runs (jobs are made lazily, at most
``concurrency`` at a time), and how long the event loop stalls while results are written and
fsynced (on the store's writer thread, against the same writes made on the loop thread).

    python benchmarks/bench_runner_io.py [--tasks 20000] [--samples 10] [--writes 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import tracemalloc

from agentboost.envs.base import RolloutResult, Task
from agentboost.envs.registry import make_environment
from agentboost.rollout.results import ResultStore
from agentboost.rollout.runner import Job, RunConfig, iter_jobs, run_jobs
from agentboost.tokens.trajectory import TerminationReason, Trajectory


def instant_result(job: Job) -> RolloutResult:
    trajectory = Trajectory(
        task_id=job.task_id,
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "Answer: 7"}],
        token_ids=list(range(300)),
        loss_mask=[0] * 290 + [1] * 10,
        logprobs=[None] * 290 + [-0.5] * 10,
        segments=[],
        termination=TerminationReason.COMPLETED,
    )
    return RolloutResult(job.task_id, job.sample, trajectory, 1.0)


async def instant(job: Job) -> RolloutResult:
    return instant_result(job)


class OnTheLoop(ResultStore):
    """The same store, writing (and fsyncing) on the event loop's thread, as before."""

    async def awrite(self, result: RolloutResult) -> None:
        self.write(result)


async def worst_stall(work) -> tuple[float, object]:
    """Run ``work`` while a ticker measures the longest time the loop could not run it."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0)
            worst = max(worst, time.perf_counter() - before)

    tick = asyncio.create_task(ticker())
    try:
        outcome = await work
    finally:
        done = True
        await tick
    return worst, outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--writes", type=int, default=2000)
    args = parser.parse_args()
    environment = make_environment("arithmetic")
    tasks = [Task(f"t{i}", "q") for i in range(args.tasks)]
    config = RunConfig(samples=args.samples, concurrency=64, progress=False)
    with tempfile.TemporaryDirectory() as scratch:
        tracemalloc.start()
        with ResultStore(os.path.join(scratch, "plan.jsonl"), fsync=False) as store:
            started = time.perf_counter()
            summary = asyncio.run(
                run_jobs(
                    iter_jobs(environment, tasks, config),
                    instant,
                    store,
                    config,
                    total=args.tasks * args.samples,
                )
            )
            elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        pairs = summary.completed
        print(
            f"plan of {pairs} pairs: peak memory traced during the run (task list not counted) "
            f"{peak / 2**20:.1f} MiB ({peak / pairs:.0f} B per pair, done-set included); "
            f"{pairs / elapsed:.0f} results/s without fsync"
        )
        small = tasks[: max(1, args.writes // args.samples)]
        for label, store_class in (("writer thread", ResultStore), ("event loop (before)", OnTheLoop)):
            path = os.path.join(scratch, f"{store_class.__name__}.jsonl")
            with store_class(path, fsync=True) as store:
                started = time.perf_counter()
                stall, summary = asyncio.run(
                    worst_stall(run_jobs(iter_jobs(environment, small, config), instant, store, config))
                )
                elapsed = time.perf_counter() - started
            print(
                f"writes with fsync on the {label}: {summary.completed} results in {elapsed:.2f} s, "
                f"longest event-loop stall {stall * 1000:.1f} ms"
            )


if __name__ == "__main__":
    main()
