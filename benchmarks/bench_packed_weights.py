"""The embedded engine with and without packed weights, on bench_engine_vs_vllm.py's workloads.

    python benchmarks/bench_packed_weights.py [--only multiturn batch16] [--repeats 2]

Fresh engines, `packed_weights=True` and `False` alternating in one process, each after a short
warm-up and with a cold prefix cache; prints tokens per second, the decode steps that ran on packs,
medians and the ratio. SmolLM2-135M fp32 by default. Figures: docs/engines.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine_vs_vllm import batch, workloads

from agentboost.engines.embedded.engine import LocalEngine
from agentboost.models.tokenizers import load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    workload_names = ["batch16", "stream", "multiturn"]
    parser.add_argument("--only", nargs="+", choices=workload_names, default=["multiturn"])
    parser.add_argument("--small", action="store_true", help="tiny workloads: check the script end to end")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = workloads(load_tokenizer(args.model), args.small)
    print(f"load average before: {os.getloadavg()}", flush=True)
    rates: dict[tuple[str, bool], list[float]] = {}
    for name in args.only:
        for _ in range(args.repeats):
            for packed in (True, False):
                engine = LocalEngine.from_pretrained(args.model, packed_weights=packed)
                try:
                    asyncio.run(batch(engine, [list(range(1000, 1016))], 4))  # first-forward set-up
                    engine.prefix_cache.clear()
                    started = time.perf_counter()
                    tokens = asyncio.run(runs[name](engine))
                    rate = tokens / (time.perf_counter() - started)
                finally:
                    engine.close()
                rates.setdefault((name, packed), []).append(rate)
                side = "packed" if packed else "unpacked"
                print(
                    f"  {name} {side}: {rate:.1f} tok/s, {engine.packed_passes} forward passes on packs, "
                    f"{engine.steps} decode steps",
                    flush=True,
                )
    print(f"load average after: {os.getloadavg()}")
    print("\n| workload | packed tok/s | unpacked tok/s | packed / unpacked |\n| --- | ---: | ---: | ---: |")
    for name in args.only:
        packed, plain = statistics.median(rates[(name, True)]), statistics.median(rates[(name, False)])
        print(f"| {name} | {packed:.1f} | {plain:.1f} | {packed / plain:.2f} |")


if __name__ == "__main__":
    main()
