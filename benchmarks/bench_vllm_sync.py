"""Weight sync to a real vLLM server per optimizer step: full fine-tuning vs LoRA (merged), SmolLM2 fp32.

Starts one vLLM server with ``--weight-sync`` (``agentboost serve-vllm``'s settings), then alternates
full and LoRA pushes (``WeightSync.push``: write ``model.safetensors``, pause, reload (vLLM's
reload_weights and the tied-head refresh of agentboost's worker extension), reset the
prefix cache, resume) so that load from other processes hits both alike, and prints the median
seconds of each part. After each push one greedy request checks that the server still answers.

    python benchmarks/bench_vllm_sync.py --python /path/to/vllm-venv/bin/python [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import tempfile
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from agentboost.engines.base import SamplingParams
from agentboost.engines.remote.vllm import VLLMEngine
from agentboost.engines.remote.weight_sync import WeightSync
from agentboost.engines.servers.vllm_server import VLLMServer, VLLMServerConfig
from agentboost.models.weights import pull_default_model


async def answer(url: str) -> int:
    engine = VLLMEngine(url)
    try:
        generation = await engine.generate(
            [1, 504, 3260, 314], SamplingParams(temperature=0), max_new_tokens=4
        )
        return len(generation.token_ids)
    finally:
        await engine.aclose()


def main(python: str | None, rounds: int) -> None:
    path = str(pull_default_model(quiet=True))
    full = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    lora = get_peft_model(
        copy.deepcopy(full),
        LoraConfig(
            r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0
        ),
    )
    config = VLLMServerConfig(model=path, python=python, weight_sync=True, ready_timeout_s=900)
    timings: dict[str, list[tuple[float, float]]] = {"full": [], "lora": []}
    with VLLMServer(config) as server, tempfile.TemporaryDirectory() as scratch:
        sync = WeightSync(server.url, scratch)
        asyncio.run(answer(server.url))  # warm
        for _ in range(rounds):
            for kind, model in (("full", full), ("lora", lora)):
                clock = time.perf_counter()
                sync.push(model)
                total = time.perf_counter() - clock
                assert asyncio.run(answer(server.url)) == 4
                timings[kind].append((sync.last["write_s"], sync.last["reload_s"]))
                print(f"{kind}: total {total:.3f} s", flush=True)
    for kind, rows in timings.items():
        write = statistics.median(w for w, _ in rows)
        reload = statistics.median(r for _, r in rows)
        print(
            f"{kind:4s}  write (state dict + safetensors) {write:.3f} s   reload (pause, reload_weights, "
            f"reset prefix cache, resume) {reload:.3f} s   total {write + reload:.3f} s   "
            f"(median of {len(rows)})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=None, help="Python with vLLM (default: $AGENTBOOST_VLLM_PYTHON)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    main(args.python, args.rounds)
