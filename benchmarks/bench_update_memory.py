"""Peak memory of one GRPO update shaped like the math demonstration's (SmolLM2-135M, fp32, CPU).

Builds the trainer from ``examples/math/train.yaml`` (with the untrained default model, so no warm-up
is needed) and runs one update on synthetic samples of the demonstration's shape: 380-420 tokens, a
274-token prompt and three generated runs of 48 tokens. Prints the peak resident set size during the
update (sampled every 20 ms), the RSS after it, and the process's high-water mark. Extra KEY=VALUE
arguments override the config, e.g. ``model.gradient_checkpointing=false optimizer.micro_batch_tokens=4096``.

    python benchmarks/bench_update_memory.py [--samples 11] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch

from agentboost.memory import resident_bytes
from agentboost.train.batching import Sample
from agentboost.train.config import load_config
from agentboost.train.trainer import Trainer

GIB = 2**30


def high_water_mark() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def samples(count: int) -> list[Sample]:
    generator = torch.Generator().manual_seed(0)
    made = []
    for index in range(count):
        length = 380 + index % 5 * 10
        ids = torch.randint(0, 49000, (length,), generator=generator)
        mask = torch.zeros(length, dtype=torch.bool)
        for start in (274, 274 + 48 + 20, 274 + 2 * 48 + 40):
            mask[start : min(length, start + 48)] = True
        logprobs = torch.where(mask, torch.full((length,), -2.0), torch.zeros(length))
        advantage = 1.0 if index % 2 else -1.0
        made.append(
            Sample(index, index // 6, float(index % 2), advantage, ids[:-1], ids[1:], mask[1:], logprobs[1:])
        )
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=11, help="11 fill one 4096-token micro-batch")
    parser.add_argument("--config", default="examples/math/train.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = ["model.name_or_path=smollm2-135m-instruct", "output_dir=/tmp/bench-update-memory"]
    trainer = Trainer(load_config(args.config, [*overrides, *args.overrides]))
    peak, running = [0], [True]

    def watch() -> None:
        while running[0]:
            peak[0] = max(peak[0], resident_bytes())
            time.sleep(0.02)

    print(f"load average {os.getloadavg()}; before the update: RSS {resident_bytes() / GIB:.2f} GiB")
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    trainer.update(samples(args.samples), 0)
    running[0] = False
    watcher.join()
    print(
        f"update: {time.perf_counter() - started:.1f} s, peak RSS {peak[0] / GIB:.2f} GiB, "
        f"after {resident_bytes() / GIB:.2f} GiB, VmHWM {high_water_mark() / GIB:.2f} GiB"
    )
    trainer.engine.close()


if __name__ == "__main__":
    main()
