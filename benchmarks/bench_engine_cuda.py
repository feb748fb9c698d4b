"""The embedded engine on a CUDA GPU: exactness, per-request seeds and speed, no weights needed.

The model is SmolLM2-135M's shape (Llama, hidden 576, 30 layers, 9 query and 3 key-value heads, MLP
1536, vocabulary 49,152, tied embeddings) with random weights, so the script runs where no model can
be fetched; speed depends on the shape, not on the values. For each dtype (fp32, bf16):

1. **exactness**: 16 concurrent random ~400-id prompts, 128 new tokens each at temperature 1; every
   stored logprob against a teacher-forced pass of the same model over prompt + generated ids
   (``log_softmax(logits / T)``, one forward per row);
2. **seeds**: one seeded request alone, then the same request among 15 others: the same ids?
3. **speed**: the 16-prompt workload and one stream (tokens/s, medians of ``--repeats``), and
   transformers' ``model.generate`` on the same 16 prompts (sampling, no logprobs) beside it.

    python benchmarks/bench_engine_cuda.py [--repeats 3] [--dtypes fp32 bf16]

On a CPU-only machine it says so and exits 2. The CPU paths (packed linears, native attention, the
direct forward) do not apply on CUDA: the engine runs transformers' forward on its own KV buffers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from exactness_support import teacher_forced_logprobs

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine

PROMPT, NEW, ROWS = 400, 128, 16
DEVICE = "cuda"


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def smollm2_shaped(dtype: torch.dtype, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    # the random init's logits are nearly flat; scale the embeddings so the distributions have a shape
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
    return model.to(device=DEVICE, dtype=dtype).eval()


def prompts(count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(100, 49000, (PROMPT + i,), generator=generator).tolist() for i in range(count)]


async def batch(engine, rows, sampling_of, new=None):
    return await asyncio.gather(
        *(engine.generate(ids, sampling_of(i), max_new_tokens=new or NEW) for i, ids in enumerate(rows))
    )


def teacher_forced_gap(model, rows, generations, temperature: float) -> float:
    """The largest |stored - teacher-forced| logprob over every generated id of every row."""
    worst = 0.0
    for ids, generation in zip(rows, generations, strict=True):
        forced = teacher_forced_logprobs(model, ids + generation.token_ids, temperature)[len(ids) - 1 :]
        stored = torch.tensor(generation.logprobs, device=forced.device)
        worst = max(worst, (forced - stored).abs().max().item())
    return worst


def timed(function) -> float:
    synchronize()
    start = time.perf_counter()
    function()
    synchronize()
    return time.perf_counter() - start


def check(dtype_name: str, repeats: int) -> None:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    model = smollm2_shaped(dtype)
    engine = LocalEngine(model, name=f"smollm2-shaped-{dtype_name}")
    sampled = SamplingParams(temperature=1.0)
    rows = prompts(ROWS, seed=1)
    try:
        asyncio.run(batch(engine, rows[:2], lambda i: sampled, new=8))  # warm-up
        # 1. exactness
        generations = asyncio.run(batch(engine, rows, lambda i: sampled))
        gap = teacher_forced_gap(model, rows, generations, 1.0)
        lengths = sorted({len(g.token_ids) for g in generations})
        print(
            f"[{dtype_name}] exactness: 16 x {NEW} sampled ids, stored vs teacher-forced logprob "
            f"max |diff| {gap:.2e}"
        )
        print(
            f"[{dtype_name}]   generation lengths {lengths}; direct forward: {engine.direct_forward_reason}"
        )
        # 2. seeds
        seeded = SamplingParams(temperature=1.0, seed=1234)
        alone = asyncio.run(engine.generate(rows[0], seeded, max_new_tokens=64))
        among = asyncio.run(batch(engine, rows, lambda i: seeded if i == 0 else sampled, new=64))[0]
        same = alone.token_ids == among.token_ids
        first = next(
            (i for i, (a, b) in enumerate(zip(alone.token_ids, among.token_ids, strict=False)) if a != b),
            None,
        )
        lp = max(abs(a - b) for a, b in zip(alone.logprobs, among.logprobs, strict=False))
        print(
            f"[{dtype_name}] seeds: one request alone vs among 15 others: same ids {same}"
            + ("" if same else f" (first difference at id {first})")
            + f", logprob max |diff| over the shared ids {lp:.2e}"
        )

        # 3. speed
        def run16():
            asyncio.run(batch(engine, rows, lambda i: sampled))

        def run1():
            asyncio.run(engine.generate(rows[0], sampled, max_new_tokens=NEW))

        padded = torch.full((ROWS, PROMPT + ROWS - 1), 0, dtype=torch.long, device=DEVICE)
        mask = torch.zeros_like(padded)
        for i, ids in enumerate(rows):  # left padding, as generate wants for a batch
            padded[i, -len(ids) :] = torch.tensor(ids, device=DEVICE)
            mask[i, -len(ids) :] = 1

        def generate16():
            model.generate(
                input_ids=padded, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0,
            )  # fmt: skip

        generate16()  # warm-up
        b16 = [ROWS * NEW / timed(run16) for _ in range(repeats)]
        one = [NEW / timed(run1) for _ in range(repeats)]
        gen = [ROWS * NEW / timed(generate16) for _ in range(repeats)]
        print(
            f"[{dtype_name}] speed (tok/s, median of {repeats}): 16 prompts {statistics.median(b16):.0f} "
            f"(runs {', '.join(f'{x:.0f}' for x in b16)}); one stream {statistics.median(one):.1f}; "
            f"model.generate 16 prompts {statistics.median(gen):.0f} -> engine / generate "
            f"{statistics.median(b16) / statistics.median(gen):.2f}"
        )
        if DEVICE == "cuda":
            print(
                f"[{dtype_name}] memory: peak allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
            )
    finally:
        engine.close()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--device", default="cuda", help="cpu checks the script itself (slowly)")
    parser.add_argument(
        "--small", action="store_true", help="40-id prompts, 8 new tokens: the script end to end"
    )
    args = parser.parse_args()
    global DEVICE, PROMPT, NEW
    DEVICE = args.device
    if args.small:
        PROMPT, NEW = 40, 8
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here; this benchmark needs one", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}")
    import transformers

    print(
        f"transformers {transformers.__version__}; "
        f"TF32 matmuls allowed: {torch.backends.cuda.matmul.allow_tf32}"
    )
    for dtype_name in args.dtypes:
        check(dtype_name, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
