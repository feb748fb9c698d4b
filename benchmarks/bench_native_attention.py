"""PyTorch's attention against agentboost's C kernel on SmolLM2-135M's attention shapes, fp32.

    python benchmarks/bench_native_attention.py [--rows 16] [--cache 420] [--prompt 400] [--threads 2]

Decode: one step's attention over every layer's cache (30 layers, each its own buffer, so the cache
comes from memory as in the engine, not from a cache level), PyTorch's grouped call (what the engine
ran before) against the kernel, next to the time a plain ``sum`` takes to read the same keys and values
(the memory-bandwidth floor). Prefill: one layer's attention over a left-padded, causal batch of
prompts, transformers' ``sdpa`` against the kernel. Best of five rounds, alternating; the outputs are
compared too.
"""

from __future__ import annotations

import argparse
import os
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentboost.engines.embedded import native_attention

LAYERS, KV_HEADS, GROUPS, HEAD_DIM = 30, 3, 3, 64  # SmolLM2-135M


def best(function, repeats: int) -> float:
    function()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            function()
        times.append((time.perf_counter() - start) / repeats)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--cache", type=int, default=420, help="cached positions at the decode step")
    parser.add_argument("--prompt", type=int, default=400, help="prompt length of the prefill")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f}, torch {torch.__version__}, {args.threads} threads")
    print(f"kernel: {native_attention.status()}")
    if not native_attention.available():
        return
    generator = torch.Generator().manual_seed(0)
    rows, width, heads = args.rows, args.cache, KV_HEADS * GROUPS
    scale = HEAD_DIM**-0.5

    # decode: the engine's layout, a buffer [layers, 2, rows, kv_heads, capacity, head_dim] viewed per layer
    buffer = torch.randn(LAYERS, 2, rows, KV_HEADS, width + 64, HEAD_DIM, generator=generator)
    keys = [buffer[layer, 0, :, :, :width] for layer in range(LAYERS)]
    values = [buffer[layer, 1, :, :, :width] for layer in range(LAYERS)]
    query = torch.randn(rows, 1, heads, HEAD_DIM, generator=generator).transpose(1, 2)
    mask = torch.ones(rows, 1, 1, width, dtype=torch.bool)
    for row in range(rows):
        mask[row, ..., : 3 * row] = False  # left padding
    grouped = query.reshape(rows, KV_HEADS, GROUPS, HEAD_DIM)

    def pytorch_step():
        for key, value in zip(keys, values, strict=True):
            F.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scale)

    def kernel_step():
        for key, value in zip(keys, values, strict=True):
            native_attention.attend(query, key, value, mask, scale)

    def read_step():
        for key, value in zip(keys, values, strict=True):
            key.sum()
            value.sum()

    module = SimpleNamespace(num_key_value_groups=GROUPS, is_causal=True)
    with torch.inference_mode():
        theirs = sdpa_attention_forward(module, query, keys[0], values[0], mask, scaling=scale)[0]
        ours = native_attention.attend(query, keys[0], values[0], mask, scale)
        difference = (ours - theirs).abs().max().item()
        timings = {}
        for name, function in (("pytorch", pytorch_step), ("kernel", kernel_step), ("read", read_step)):
            timings[name] = best(function, 5)
        megabytes = 2 * LAYERS * rows * KV_HEADS * width * HEAD_DIM * 4 / 1e6
        print(
            f"\n== decode step: {rows} rows, {width} cached positions, {LAYERS} layers ({megabytes:.0f} MB)"
        )
        for name, label in (("pytorch", "PyTorch's attention"), ("kernel", "the kernel"), ("read", "a sum")):
            rate = megabytes / 1e3 / timings[name]
            print(f"{label:>22}: {timings[name] * 1e3:7.2f} ms a step ({rate:.1f} GB/s of keys and values)")
        speedup = timings["pytorch"] / timings["kernel"]
        print(f"kernel / PyTorch: {speedup:.2f}x faster; max |diff| {difference:.1e}")

        # prefill: one layer, left-padded causal prompts
        length = args.prompt
        query = torch.randn(rows, length, heads, HEAD_DIM, generator=generator).transpose(1, 2)
        projected = torch.randn(2, rows, length, KV_HEADS, HEAD_DIM, generator=generator).transpose(2, 3)
        key, value = projected[0], projected[1]
        padding = torch.ones(rows, length, dtype=torch.bool)
        for row in range(rows):
            padding[row, : 7 * row] = False
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        prefill_mask = (causal[None] & padding[:, None, :])[:, None]
        theirs = sdpa_attention_forward(module, query, key, value, prefill_mask, scaling=scale)[0]
        ours = native_attention.prefill(query, key, value, prefill_mask, scale)
        live = prefill_mask[:, 0].any(-1)
        difference = (ours - theirs)[live].abs().max().item()
        pytorch = best(
            lambda: sdpa_attention_forward(module, query, key, value, prefill_mask, scaling=scale), 2
        )
        kernel = best(lambda: native_attention.prefill(query, key, value, prefill_mask, scale), 2)
        print(f"\n== prefill: {rows} rows of up to {length} positions, one layer")
        print(
            f"   transformers' sdpa: {pytorch * 1e3:7.1f} ms a layer ({pytorch * LAYERS:.2f} s for {LAYERS})"
        )
        print(f"           the kernel: {kernel * 1e3:7.1f} ms a layer ({kernel * LAYERS:.2f} s for {LAYERS})")
        print(f"kernel / PyTorch: {pytorch / kernel:.2f}x faster; max |diff| {difference:.1e}")


if __name__ == "__main__":
    main()
