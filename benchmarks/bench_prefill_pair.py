"""Prefill only, alternating engines: a 947-token prompt whose first 916 ids are cached, against no cache.

python benchmarks/bench_prefill_pair.py
"""

from __future__ import annotations

import asyncio
import os
import time

import torch
from transformers import AutoModelForCausalLM

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.models.weights import resolve_model


def main() -> None:
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m-instruct"), dtype=torch.float32)
    prompt = [(i * 7919) % 40000 + 100 for i in range(947)]
    one = SamplingParams(temperature=0)
    cached, plain = LocalEngine(model.eval()), LocalEngine(model, prefix_cache_bytes=0)
    asyncio.run(cached.generate(prompt[:916], one, max_new_tokens=1))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for label, prompts in (
        ("same prompt", [prompt] * 3),
        ("916 cached + 31 new", [prompt[:916] + [500 + 31 * r + i for i in range(31)] for r in range(3)]),
    ):
        for ids in prompts:
            for name, engine in (("cache", cached), ("no cache", plain)):
                started = time.perf_counter()
                generation = asyncio.run(engine.generate(ids, one, max_new_tokens=1))
                print(
                    f"{label:>20} {name:>8}: {time.perf_counter() - started:5.2f} s, "
                    f"prefilled {generation.metrics['prompt_computed_tokens']:.0f}",
                    flush=True,
                )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
