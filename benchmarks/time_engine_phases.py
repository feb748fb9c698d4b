"""Where the embedded engine's time goes on the workloads of bench_engine_vs_vllm.py, phase by phase.

Runs a workload (``batch16``, ``stream``, ``multiturn``, ``prefill16``; each on a fresh engine,
``--repeats`` times) with the engine's own methods timed in place: prefills (``_prefill``), decode steps
(``_decode_step``, sampling included), sampling alone (``_sample``), the batch's re-buffering on joins
and departures (``_set_batch``), departures (``_retire``, prefix-cache insertions included) and
prefix-cache insertions (``_hold``). Prints calls and seconds for each next to the workload's wall
time. Phases nest (a decode step contains its sampling, a departure its insertions), so they do not add
up.

    python benchmarks/time_engine_phases.py batch16 multiturn [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import os
import time
from typing import Any

import torch
from bench_engine_vs_vllm import timed, workloads

from agentboost.engines.embedded.engine import LocalEngine
from agentboost.models.tokenizers import load_tokenizer

PHASES = ("_prefill", "_decode_step", "_sample", "_set_batch", "_retire", "_hold")


def instrument(totals: dict[str, list[float]]) -> None:
    for name in PHASES:
        original = getattr(LocalEngine, name)

        @functools.wraps(original)
        def wrapper(self: Any, *args: Any, _original: Any = original, _name: str = name, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return _original(self, *args, **kw)
            finally:
                totals[_name][0] += 1
                totals[_name][1] += time.perf_counter() - started

        setattr(LocalEngine, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", choices=["batch16", "stream", "multiturn", "prefill16"])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average before: {os.getloadavg()[0]:.2f}, torch {torch.__version__}, {args.threads} threads")
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    instrument(totals)
    runs = workloads(load_tokenizer(args.model))
    for name in args.workloads:
        for _ in range(args.repeats):
            engine = LocalEngine.from_pretrained(args.model)
            totals.clear()
            tokens, seconds = asyncio.run(timed(runs[name], engine, close=True))
            phases = ", ".join(f"{phase} {n:.0f} x = {spent:.2f} s" for phase, (n, spent) in totals.items())
            print(f"{name}: {tokens} tokens in {seconds:.2f} s; {phases}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
