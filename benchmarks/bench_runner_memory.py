"""Peak memory of a huge run (`agentboost rollout -n 1000000 --samples 8`) for its first results.

What the CLI does, driven from Python with a zero-latency engine (agentboost's ScriptedEngine: every
turn answers at once) so the figure is the runner's own: build the tasks, plan the run, open the
results file, then run until ``--results`` rollouts are written. Prints the peak resident memory
(ru_maxrss) after each stage. Run it with another checkout first on PYTHONPATH to compare.

    python benchmarks/bench_runner_memory.py -n 1000000 --samples 8 --results 2000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import tempfile
import time
from pathlib import Path

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.models.tokenizers import load_qwen3_tokenizer
from agentboost.rollout.results import ResultStore
from agentboost.rollout.runner import RunConfig, in_process, iter_jobs, plan_keys, run_jobs


class Enough(Exception):
    """Raised after the requested number of results: ends the run like Ctrl-C would."""


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--results", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    tokenizer = load_qwen3_tokenizer()
    answer = [
        *tokenizer.encode("Answer: 7", add_special_tokens=False),
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    ]
    environment = ArithmeticEnvironment()
    config = RunConfig(samples=args.samples, concurrency=args.concurrency, progress=False)
    started = time.perf_counter()
    print(f"start: peak {peak_mb():.0f} MB")
    tasks = environment.tasks(args.n)
    print(f"{len(tasks)} tasks built: peak {peak_mb():.0f} MB ({time.perf_counter() - started:.1f} s)")
    plan = plan_keys(environment, tasks, config)
    print(f"plan of {len(plan)} rollouts: peak {peak_mb():.0f} MB ({time.perf_counter() - started:.1f} s)")
    engine = ScriptedEngine([answer], cycle=True)
    execute = in_process(environment, engine, tokenizer, template="qwen3")
    written = 0

    async def counted(job):
        nonlocal written
        if written >= args.results:
            raise Enough
        written += 1
        return await execute(job)

    with (
        tempfile.TemporaryDirectory() as directory,
        ResultStore(Path(directory) / "r.jsonl", fsync=False, plan=plan) as store,
        contextlib.suppress(Enough),
    ):
        asyncio.run(run_jobs(iter_jobs(environment, tasks, config), counted, store, config))
    print(f"{written} results written: peak {peak_mb():.0f} MB ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
