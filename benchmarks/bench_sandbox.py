"""Executions per second of a trivial program: the warm sandbox pool (every limit and namespace on) vs a
bare ``subprocess.run([sys.executable, "-c", code])`` with no protection at all.

Both are measured one job at a time and with as many jobs in flight as there are CPUs (threads for the
bare runs, one pool worker per CPU). Rounds alternate between the two so that load from other processes
on a shared machine hits both alike; the median round is printed. Wall-clock rates depend on that load;
CPU time per run (this process, the workers and every job process, worker start-up included) does not.
Also printed: graded HumanEval runs per second (check() in its own checker process, calling the program
over a socket), as many in flight as there are CPUs.

    python benchmarks/bench_sandbox.py [--jobs 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from agentboost.sandbox import SandboxPool, run_humaneval_test, run_python

CODE = "print(1)"


def cpu_seconds() -> float:
    """CPU time of this process and of its waited-for children (with, in turn, their children)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bare(jobs: int, in_flight: int) -> tuple[float, float]:
    def one(_: int) -> bytes:
        return subprocess.run([sys.executable, "-c", CODE], capture_output=True, check=True).stdout

    cpu, started = cpu_seconds(), time.perf_counter()
    with ThreadPoolExecutor(in_flight) as executor:
        assert all(out == b"1\n" for out in executor.map(one, range(jobs)))
    return jobs / (time.perf_counter() - started), (cpu_seconds() - cpu) / jobs


async def pooled(jobs: int, in_flight: int) -> tuple[float, float]:
    cpu = cpu_seconds()
    async with SandboxPool(size=in_flight) as pool:  # closed before the CPU count: workers are reaped
        await asyncio.gather(*(pool.run_python(CODE) for _ in range(in_flight)))  # warm-up
        started = time.perf_counter()
        if in_flight == 1:
            results = [await pool.run_python(CODE) for _ in range(jobs)]
        else:
            results = await asyncio.gather(*(pool.run_python(CODE) for _ in range(jobs)))
        elapsed = time.perf_counter() - started
    assert all(result.ok and result.stdout == "1\n" for result in results), results[0]
    return jobs / elapsed, (cpu_seconds() - cpu) / jobs


PROMPT = 'def add(x: int, y: int) -> int:\n    """Add two numbers."""\n'
TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(20, 22) == 42\n"


async def graded(jobs: int, in_flight: int) -> float:
    async with SandboxPool(size=in_flight) as pool:
        program = PROMPT + "    return x + y\n"
        await run_humaneval_test(program, TEST, "add", pool=pool)  # warm-up
        started = time.perf_counter()
        reports = await asyncio.gather(
            *(run_humaneval_test(program, TEST, "add", pool=pool) for _ in range(jobs))
        )
        elapsed = time.perf_counter() - started
    assert all(report.all_passed for report in reports), reports[0].summary()
    return jobs / elapsed


async def one_off(jobs: int) -> float:
    started = time.perf_counter()
    for _ in range(jobs):
        assert (await run_python(CODE)).stdout == "1\n"
    return jobs / (time.perf_counter() - started)


async def main(jobs: int, rounds: int) -> None:
    workers = os.cpu_count() or 2
    async with SandboxPool(size=1) as probe:
        print(f"protections on this machine:\n{probe.capabilities.summary()}\n")
    measured: dict[str, list[tuple[float, float]]] = {"bare1": [], "pool1": [], "bareN": [], "poolN": []}
    oneoff, checked = [], []
    for _ in range(rounds):
        measured["bare1"].append(bare(jobs, 1))
        measured["pool1"].append(await pooled(jobs, 1))
        measured["bareN"].append(bare(jobs, workers))
        measured["poolN"].append(await pooled(jobs, workers))
        oneoff.append(await one_off(max(10, jobs // 10)))
        checked.append(await graded(max(10, jobs // 2), workers))
    rate = {name: statistics.median(r for r, _ in values) for name, values in measured.items()}
    cpu_ms = {name: 1000 * statistics.median(c for _, c in values) for name, values in measured.items()}
    print(f"{jobs} runs of {CODE!r} per measurement, median of {rounds} rounds, {workers} CPUs")
    for in_flight, bare_key, pool_key in ((1, "bare1", "pool1"), (workers, "bareN", "poolN")):
        print(
            f"  {in_flight} in flight: bare subprocess.run {rate[bare_key]:6.1f}/s"
            f" ({cpu_ms[bare_key]:5.1f} ms CPU/run)"
            f"   sandbox pool {rate[pool_key]:6.1f}/s ({cpu_ms[pool_key]:5.1f} ms CPU/run)"
            f"   ratio {rate[pool_key] / rate[bare_key]:.1f}x"
        )
    print(f"  one-off sandbox run_python (a worker started per run): {statistics.median(oneoff):.1f}/s")
    print(
        f"  graded HumanEval runs, {workers} in flight (checker process): {statistics.median(checked):.1f}/s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.jobs, arguments.rounds))
