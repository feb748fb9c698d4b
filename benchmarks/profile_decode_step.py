"""Where one decode step of the embedded engine spends its time, at batch 1 and 16 (SmolLM2-135M, fp32).

Drives the engine's own prefill and decode methods in this thread (no event loop), so the profile holds
only model and scheduler work: B prompts of ~400 ids are prefilled, a few warm-up steps run, then
``--steps`` steps are timed and profiled with torch.profiler; printed per batch size: milliseconds a
step, the top operators by self CPU time, and the share of the step outside any operator (Python,
transformers' mask building, our bookkeeping).

    python benchmarks/profile_decode_step.py [--batches 1 16] [--steps 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.engines.embedded.scheduler import _Request
from agentboost.errors import EngineError

WARMUP_STEPS = 3


def requests(batch: int, length: int, loop: asyncio.AbstractEventLoop) -> list[_Request]:
    made = []
    for row in range(batch):
        ids = [(1000 + 37 * row + 11 * i) % 48000 + 100 for i in range(length)]
        sampling = SamplingParams(temperature=1.0, seed=row)
        generator = torch.Generator().manual_seed(row)
        made.append(_Request(ids, sampling, loop, loop.create_future(), generator, max_new_tokens=1_000_000))
    return made


def profile_batch(engine: LocalEngine, batch: int, length: int, steps: int) -> None:
    loop = asyncio.new_event_loop()
    with torch.inference_mode():
        engine._prefill(requests(batch, length, loop))
        for _ in range(WARMUP_STEPS):
            engine._decode_step()
        started = time.perf_counter()
        for _ in range(steps):
            engine._decode_step()
        wall = (time.perf_counter() - started) / steps
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(steps):
                engine._decode_step()
    events = profiler.key_averages()
    # self times of leaf operators (aten::*) add up to the time spent inside kernels
    kernels = ("aten::", "mkl::", "mkldnn::", "agentboost::")
    operator_us = sum(e.self_cpu_time_total for e in events if e.key.startswith(kernels)) / steps
    print(f"\n== batch {batch}, prompt {length} ids, cache ~{length + WARMUP_STEPS + steps} positions")
    print(
        f"{wall * 1e3:.1f} ms a step unprofiled ({batch / wall:.1f} tok/s); inside operators: "
        f"{operator_us / 1e3:.1f} ms a step ({operator_us / 1e6 / wall:.0%} of the unprofiled step)"
    )
    print(events.table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=40))
    engine._fail_all(EngineError("the profile is done"))  # empties the batch
    loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt", type=int, default=400)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f}, torch {torch.__version__}, {args.threads} threads")
    engine = LocalEngine.from_pretrained(args.model, prefix_cache_bytes=0)
    for batch in args.batches:
        profile_batch(engine, batch, args.prompt, args.steps)


if __name__ == "__main__":
    main()
