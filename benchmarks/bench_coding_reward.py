"""Hidden-test grading throughput on HumanEval's canonical solutions: every assertion of ``check()`` in
its own sandbox run (``per_case``) vs the whole ``check()`` in one run (``one_run``, the default), and
the cost of grading every hidden test (the default since issue 23) vs the old cap of the 15 longest
(``per_case_cap15``: each problem's assertions cut to its 15 longest, as ``max_hidden_tests=15`` cut
stdin/stdout tests before).

Each mode grades all 164 problems (1,181 assertions in ``per_case``, 1,158 with the cap) on a warm pool
of one worker per CPU, with the coding environment's grading code. Rounds alternate between modes so
that load from other processes hits all alike; the median round is printed.

    python benchmarks/bench_coding_reward.py [--rounds 3] [--pool-size N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time

from agentboost.envs.coding import grading
from agentboost.envs.coding.data import humaneval_rows, humaneval_task
from agentboost.sandbox import SandboxLimits, SandboxPool

LIMITS = SandboxLimits(timeout_s=10, memory_mb=1024)


def capped(task, cap: int = 15):
    """The task with its assertions as separate hidden tests, only the ``cap`` longest kept."""
    cases = grading.split_check(str(task.hidden_tests[0]["test"]))
    keep = sorted(sorted(range(len(cases)), key=lambda i: (-len(cases[i]), i))[:cap])
    return dataclasses.replace(task, hidden_tests=[{"test": cases[i]} for i in keep])


async def grade_all(pool: SandboxPool, tasks, mode: str) -> tuple[int, int, int]:
    if mode == "per_case_cap15":
        tasks, mode = [capped(task) for task in tasks], "per_case"
    grades = await asyncio.gather(
        *(
            grading.run_hidden_tests(
                pool, task, task.metadata["canonical_solution"], LIMITS, humaneval_mode=mode
            )
            for task in tasks
        )
    )
    return sum(g.all_passed for g in grades), sum(g.total for g in grades), len(grades)


async def main(rounds: int, pool_size: int) -> None:
    tasks = [humaneval_task(row) for row in humaneval_rows()]
    results: dict[str, list[tuple[float, int, int]]] = {"one_run": [], "per_case": [], "per_case_cap15": []}
    async with SandboxPool(size=pool_size, limits=LIMITS) as pool:
        await grade_all(pool, tasks[:8], "one_run")  # warm-up
        for _ in range(rounds):
            for mode in results:
                started = time.perf_counter()
                passed, runs, problems = await grade_all(pool, tasks, mode)
                results[mode].append((time.perf_counter() - started, passed, runs))
                assert passed == problems, f"{mode}: only {passed} of {problems} canonical solutions passed"
    print(
        f"HumanEval canonical solutions, {len(tasks)} problems, pool of {pool_size} workers, {rounds} rounds"
    )
    print("| mode | sandbox runs | wall s (median) | problems/s | runs/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for mode, rows in results.items():
        wall = statistics.median(row[0] for row in rows)
        runs = rows[0][2]
        print(f"| {mode} | {runs} | {wall:.2f} | {len(tasks) / wall:.1f} | {runs / wall:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pool-size", type=int, default=os.cpu_count() or 2)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.rounds, arguments.pool_size))
