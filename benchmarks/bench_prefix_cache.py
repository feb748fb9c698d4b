"""The embedded engine's prefix cache, measured side by side in one process on the real default model.

Three workloads, each run with the cache and without it (``prefix_cache_bytes=0``, same code otherwise),
alternating so a noisy machine hurts both alike; ratios are what to read:

1. **multi-turn**: one 10-turn tool-calling conversation at the engine level. The first prompt is the
   arithmetic environment's real first prompt (system prompt, tool schema, question); after every turn
   the generated ids and a scripted tool result are appended. Printed per turn: prompt tokens, tokens
   the model prefilled, engine seconds.
2. **grpo**: one collection step of ``examples/arithmetic/train.yaml``'s shape (4 tasks x 8 samples,
   temperature 1.0, max_turns 3, max_new_tokens 48, all 32 rollouts at once) through the real
   environment, agent and provider.
3. **throughput**: 16 different prompts, greedy, 32 new tokens each, no stop ids: our engine against
   ``model.generate`` on one left-padded batch of the same 16 prompts, same model object.

``--before`` adds the engine as it was before the prefix cache (``/work/main`` or any checkout's
``agentboost/engines/embedded/engine.py``), ``--transformers-cb`` adds transformers' own continuous batching
to the throughput figure (slow on CPU).

    python benchmarks/bench_prefix_cache.py [--model smollm2-135m-instruct] [--repeats 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

import torch

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import Generation, OneBackend, SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.models.tokenizers import load_tokenizer
from agentboost.models.weights import resolve_model


class Recording(OneBackend):
    """Wraps an engine and keeps every prompt it was asked to continue."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.prompts = engine, []

    @property
    def context_length(self) -> int | None:
        return self.engine.context_length

    async def generate(self, prompt_ids, sampling, *, max_new_tokens) -> Generation:
        self.prompts.append(list(prompt_ids))
        return await self.engine.generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)

    async def aclose(self) -> None:
        return None


def first_prompt(model: Any, tokenizer: Any) -> list[int]:
    """The arithmetic environment's real first prompt for one task (system, tools, question)."""
    environment = ArithmeticEnvironment()
    recorder = Recording(LocalEngine(model, prefix_cache_bytes=0))
    task = environment.tasks(1, seed=0)[0]
    limits = RolloutLimits(max_turns=1, max_new_tokens=1)
    asyncio.run(
        environment.run_episode(
            task, recorder, tokenizer, sampling=SamplingParams(temperature=0), limits=limits
        )
    )
    recorder.engine.close()
    return recorder.prompts[0]


def multi_turn(
    engine: LocalEngine, start: list[int], tokenizer: Any, turns: int, new_tokens: int, label: str
) -> list[dict[str, float]]:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampling = SamplingParams(temperature=0, stop_token_ids=(end,))

    async def main() -> list[dict[str, float]]:
        prompt, rows = list(start), []
        for turn in range(turns):
            started, cpu = time.perf_counter(), time.process_time()
            generation = await engine.generate(prompt, sampling, max_new_tokens=new_tokens)
            rows.append(
                {
                    "prompt": len(prompt),
                    "computed": generation.metrics["prompt_computed_tokens"],
                    "generated": len(generation.token_ids),
                    "seconds": time.perf_counter() - started,
                    "cpu": time.process_time() - cpu,
                }
            )
            print(f"  [{label}] turn {turn + 1}: {rows[-1]}", flush=True)
            ids = generation.token_ids if generation.finish_reason == "stop" else [*generation.token_ids, end]
            result = f'\n<|im_start|>user\n<tool_response>\n{{"result": {17 * turn + 5}}}\n</tool_response>'
            prompt = prompt + ids + tokenizer.encode(result, add_special_tokens=False)
            prompt += [end, *tokenizer.encode("\n<|im_start|>assistant\n", add_special_tokens=False)]
        return rows

    return asyncio.run(main())


def grpo_step(engine: Any, tokenizer: Any, step: int) -> tuple[float, int, int]:
    environment = ArithmeticEnvironment()
    tasks = environment.tasks(4, seed=100 + step)
    limits = RolloutLimits(max_turns=3, max_new_tokens=48)
    sampling = SamplingParams(temperature=1.0)

    async def main():
        return await asyncio.gather(
            *(
                environment.run_episode(
                    task,
                    engine,
                    tokenizer,
                    sampling=replace(sampling, seed=1000 * t + i),
                    limits=limits,
                    sample=i,
                )
                for t, task in enumerate(tasks)
                for i in range(8)
            )
        )

    started, cpu = time.perf_counter(), time.process_time()
    results = asyncio.run(main())
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    generated = sum(r.trajectory.generated_tokens for r in results)
    failed = sum(r.failed for r in results)
    print(
        f"  step {step}: {seconds:.1f} s wall, {cpu:.1f} s CPU, {generated} tokens, {failed} failed",
        flush=True,
    )
    return seconds, generated, failed


def engine_batch(engine: Any, prompts: list[list[int]], new_tokens: int) -> float:
    sampling = SamplingParams(temperature=0)

    async def main():
        return await asyncio.gather(
            *(engine.generate(p, sampling, max_new_tokens=new_tokens) for p in prompts)
        )

    started = time.perf_counter()
    outputs = asyncio.run(main())
    assert all(len(o.token_ids) == new_tokens for o in outputs)
    return time.perf_counter() - started


def hf_generate(model: Any, prompts: list[list[int]], new_tokens: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    assert out.shape[1] == width + new_tokens
    return time.perf_counter() - started


def transformers_cb(model: Any, prompts: list[list[int]], new_tokens: int) -> float:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1)
    started = time.perf_counter()
    out = model.generate_batch(
        prompts,
        generation_config=config,
        continuous_batching_config=ContinuousBatchingConfig(return_logprobs=True),
        progress_bar=False,
        warmup=False,
    )
    assert len(out) == len(prompts)
    seconds = time.perf_counter() - started
    if hasattr(model, "set_attn_implementation"):  # generate_batch switches the model to paged attention
        model.set_attn_implementation("sdpa")
    return seconds


def load_before(path: str) -> type:
    spec = importlib.util.spec_from_file_location("agentboost_engine_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module.LocalEngine


def runs_text(seconds: list[float]) -> str:
    return f"{statistics.median(seconds):.2f} s (runs {', '.join(f'{s:.2f}' for s in seconds)})"


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) {five:.1f} (5 min) on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--turn-tokens", type=int, default=32, help="most new tokens per turn (multi-turn)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=["multi-turn", "grpo", "throughput"], action="append")
    parser.add_argument(
        "--before", help="path to a local.py without the prefix cache, timed as a third column"
    )
    parser.add_argument(
        "--transformers-cb", action="store_true", help="also time transformers' generate_batch"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    path = resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(str(path))
    before = load_before(args.before) if args.before else None
    only = set(args.only or ["multi-turn", "grpo", "throughput"])
    print(f"model {args.model}, float32, {args.threads} threads, torch {torch.__version__}; {load_average()}")

    def engines() -> dict[str, Any]:
        made = {"cache": LocalEngine(model), "no cache": LocalEngine(model, prefix_cache_bytes=0)}
        if before is not None:
            made["before"] = before(model)
        return made

    if "multi-turn" in only:
        start = first_prompt(model, tokenizer)
        runs: dict[str, list[list[dict[str, float]]]] = {}
        for _ in range(args.repeats):
            for name, engine in engines().items():
                runs.setdefault(name, []).append(
                    multi_turn(engine, start, tokenizer, args.turns, args.turn_tokens, name)
                )
                engine.close()
        print(
            f"\n## multi-turn: {args.turns} turns, first prompt {len(start)} tokens, greedy, "
            f"<= {args.turn_tokens} new tokens per turn"
        )
        cached, plain = runs["cache"][0], runs["no cache"][0]
        print("turn  prompt  appended  prefilled(cache)  prefilled(no cache)  s(cache)  s(no cache)")
        for turn, (a, b) in enumerate(zip(cached, plain, strict=True)):
            appended = (
                a["prompt"] - (cached[turn - 1]["prompt"] + cached[turn - 1]["generated"])
                if turn
                else a["prompt"]
            )
            print(
                f"{turn + 1:>4}  {a['prompt']:>6}  {appended:>8}  {a['computed']:>16.0f}"
                f"  {b['computed']:>19.0f}  {a['seconds']:>8.2f}  {b['seconds']:>11.2f}"
            )
        totals = {name: [sum(r["seconds"] for r in run) for run in repeats] for name, repeats in runs.items()}
        cpu = {name: [sum(r["cpu"] for r in run) for run in repeats] for name, repeats in runs.items()}
        prefilled = {name: sum(r["computed"] for r in repeats[0]) for name, repeats in runs.items()}
        for name, seconds in totals.items():
            print(f"{name:>9}: engine time {runs_text(seconds)}, prefilled {prefilled[name]:.0f} tokens")
        print(
            "speed-up with the cache: "
            f"{statistics.median(totals['no cache']) / statistics.median(totals['cache']):.2f}x wall, "
            f"{statistics.median(cpu['no cache']) / statistics.median(cpu['cache']):.2f}x CPU; "
            f"prefill tokens {prefilled['no cache'] / prefilled['cache']:.1f}x fewer"
        )

    if "grpo" in only:
        rows: dict[str, list[tuple[float, int, int]]] = {}
        for step in range(args.repeats):
            for name, engine in engines().items():
                rows.setdefault(name, []).append(grpo_step(engine, tokenizer, step))
                if name == "cache":
                    stats = engine.prefix_cache_stats()
                engine.close()
        print(
            "\n## GRPO collection step: arithmetic, 4 tasks x 8 samples, temperature 1.0, max_turns 3, "
            "48 new tokens"
        )
        for name, measured in rows.items():
            seconds = [m[0] for m in measured]
            print(
                f"{name:>9}: {runs_text(seconds)} per step, generated {sum(m[1] for m in measured)} tokens, "
                f"failed rollouts {sum(m[2] for m in measured)}"
            )
        print(
            f"cache (last step): hit rate {stats.hit_rate:.2f}, prompt tokens {stats.prompt_tokens}, "
            f"prefilled {stats.computed_tokens}, held {stats.tokens} tokens / {stats.bytes / 2**20:.1f} MiB"
        )
        ratio = statistics.median([m[0] for m in rows["no cache"]]) / statistics.median(
            [m[0] for m in rows["cache"]]
        )
        print(f"speed-up with the cache: {ratio:.2f}x")

    if "throughput" in only:
        environment = ArithmeticEnvironment()
        questions = [task.prompt for task in environment.tasks(16, seed=7)]
        prompts = [
            tokenizer.apply_chat_template(
                [
                    {"role": "system", "content": "You are a careful assistant."},
                    {"role": "user", "content": q},
                ],
                add_generation_prompt=True,
                tokenize=True,
            )
            for q in questions
        ]
        prompts = [
            list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts
        ]
        new_tokens = 32
        times: dict[str, list[float]] = {}
        hf_generate(model, prompts, 2)  # warm-up
        for _ in range(args.repeats):
            times.setdefault("transformers generate", []).append(hf_generate(model, prompts, new_tokens))
            for name, engine in engines().items():
                times.setdefault(f"engine ({name})", []).append(engine_batch(engine, prompts, new_tokens))
                engine.close()
        for _ in range(args.repeats if args.transformers_cb else 0):  # last: it re-wires the attention
            times.setdefault("transformers generate_batch (CB)", []).append(
                transformers_cb(model, prompts, new_tokens)
            )
        lengths = sorted(len(p) for p in prompts)
        print(
            f"\n## throughput: batch 16, prompts {lengths[0]}-{lengths[-1]} tokens, {new_tokens} new tokens, "
            "greedy"
        )
        reference = statistics.median(times["transformers generate"])
        for name, seconds in times.items():
            median = statistics.median(seconds)
            print(
                f"{name:>34}: {16 * new_tokens / median:6.1f} tokens/s ({median:.2f} s; runs "
                f"{', '.join(f'{s:.2f}' for s in seconds)}), {reference / median:.2f}x transformers generate"
            )
    print(f"\nafter: {load_average()}")


if __name__ == "__main__":
    main()
