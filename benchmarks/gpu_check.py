"""The math demonstration on one CUDA GPU, in the default precision and in float32: does it learn there?

Offline, from a clone with the package installed (``pip install -e '.[dev]'``) and the default model
pulled (``agentboost pull``), in about 6 minutes on one H100-class GPU by design (small evaluations,
shortened stages). For each precision (``auto``: float32 master weights with bfloat16 autocast compute
on CUDA; ``float32``: float32 through and through):

1. the demonstration's stages (examples/math: ``prepare_data.py``, ``sft.yaml``, ``train.yaml``),
   shortened: SFT warm-up, then GRPO from its final model, held-out reward before and after each;
2. exactness: sampled rollouts (temperature 1) of the final model from the embedded engine in that
   precision, their stored logprobs against a teacher-forced float32 pass (``tests/exactness_support``)
   and against the trainer's own pass in that precision (the gap ``algorithm.off_policy`` corrects);
3. speed: the engine against transformers' ``generate`` at batch 1 and 16 (tokens/s);
4. on CUDA, the engine with its decode steps captured as CUDA graphs (``cuda_graphs=True``, off by
   default and unverified until this runs): the same seeded rollouts as the eager engine (the share
   with the same ids, the largest logprob difference) and its tokens/s at batch 1 and 16.

It prints one table: held-out before / after SFT / after GRPO, SFT loss, the GRPO steps'
``mismatch/*``, the sampled-vs-teacher-forced gaps, tok/s, the median GRPO step time and peak GPU memory.

    python benchmarks/gpu_check.py                      # both precisions, about 6 minutes on one GPU
    python benchmarks/gpu_check.py --precisions auto    # one of them
    python benchmarks/gpu_check.py --device cpu --tiny --precisions bfloat16 float32
                                                        # the script's own smoke test on a CPU (~5 min
                                                        # on 2 busy cores), bfloat16 autocast included

Without a CUDA GPU (and without ``--device cpu``) it says so and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "math"
sys.path[:0] = [str(ROOT / "tests")]

PRECISIONS = {
    "auto": {},
    "float32": {"model.dtype": "float32", "model.compute_dtype": "float32"},
    "bfloat16": {"model.compute_dtype": "bfloat16"},  # auto's pick on a GPU, asked for anywhere (a CPU smoke)
}


@dataclass
class Row:
    """One precision's figures."""

    precision: str
    picked: str = ""
    held_out: list[float] = field(default_factory=list)  # before SFT, after SFT, after GRPO
    sft_loss: list[float] = field(default_factory=list)
    mismatch_mean: float = float("nan")
    mismatch_max: float = float("nan")
    forced_fp32: tuple[float, float] = (float("nan"), float("nan"))  # mean, max |stored - forced|
    forced_own: tuple[float, float] = (float("nan"), float("nan"))
    tok_s: dict[str, float] = field(default_factory=dict)
    graphs_same_ids: float = float("nan")  # share of rollouts the graphed engine sampled id for id
    graphs_logprob_max: float = float("nan")  # largest |graphed - eager| logprob over their common ids
    step_s: float = float("nan")
    peak_gib: float = float("nan")
    seconds: float = 0.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu with --tiny")
    parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=["auto", "float32"])
    parser.add_argument("--tiny", action="store_true", help="a tiny random model and minimal stages (smoke)")
    parser.add_argument("--eval-tasks", type=int, default=32, help="held-out problems per evaluation")
    parser.add_argument("--sft-steps", type=int, default=3)
    parser.add_argument("--grpo-steps", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=16, help="sampled rollouts checked for exactness")
    parser.add_argument("--new-tokens", type=int, default=64, help="new tokens per timed generation")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs in this directory")
    args = parser.parse_args(argv)
    if args.tiny:
        args.eval_tasks, args.sft_steps, args.grpo_steps = 2, 1, 1
        args.rollouts, args.new_tokens = 2, 4
    return args


def check_device(args: argparse.Namespace) -> str | None:
    """Why this machine cannot run the check as asked (None when it can)."""
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return "no CUDA GPU here: this check needs one (or --device cpu --tiny for the script's smoke test)"
    if args.device == "cpu" and not args.tiny:
        return "--device cpu runs only with --tiny (the real stages take an hour on a CPU)"
    return None


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def model_for(args: argparse.Namespace, scratch: Path) -> str:
    """The default SmolLM2 (pulled, offline afterwards), or a tiny random Qwen3 with --tiny."""
    if not args.tiny:
        from agentboost.models.weights import pull_default_model

        return str(pull_default_model(quiet=True))
    from conftest import tiny_qwen3

    from agentboost.models.tokenizers import load_qwen3_tokenizer

    directory = scratch / "tiny"
    if not directory.exists():
        tiny_qwen3(hidden=32).save_pretrained(directory)
        load_qwen3_tokenizer().save_pretrained(directory)
    return str(directory)


def stages(args: argparse.Namespace, row: Row, model: str, data: Path, out: Path) -> Path:
    """SFT then GRPO with the example's configs, shortened; fills the row; returns the final model."""
    from agentboost.train.config import load_config
    from agentboost.train.logging import read_metrics
    from agentboost.train.sft import SFTTrainer, load_sft_config
    from agentboost.train.trainer import Trainer

    common = [f"model.device={args.device}", "threads=null", "logging.progress=false"]
    common += [f"{key}={value}" for key, value in PRECISIONS[row.precision].items()]
    sft_dir, grpo_dir = out / "sft", out / "grpo"
    sft = load_sft_config(
        EXAMPLE / "sft.yaml",
        [
            *common,
            f"model.name_or_path={model}",
            f"data.paths=[{data / 'demonstrations.jsonl'}]",
            f"steps={args.sft_steps}",
            f"eval.every={args.sft_steps}",
            f"eval.tasks={args.eval_tasks}",
            f"output_dir={sft_dir}",
            "checkpoint.resume=false",
            *(["batch_size=2", "model.gradient_checkpointing=false"] if args.tiny else []),
        ],
    )
    trainer = SFTTrainer(sft)
    row.picked = trainer.precision.describe()
    trainer.train()
    records = read_metrics(sft_dir / "metrics.jsonl")
    row.sft_loss = [r["sft/loss"] for r in records if r["kind"] == "train"]
    row.held_out = [r["eval/reward_mean"] for r in records if r["kind"] == "eval"]
    grpo = load_config(
        EXAMPLE / "train.yaml",
        [
            *common,
            f"model.name_or_path={sft_dir / 'final'}",
            f"steps={args.grpo_steps}",
            f"eval.every={args.grpo_steps}",
            f"eval.tasks={args.eval_tasks}",
            f"output_dir={grpo_dir}",
            "checkpoint.resume=false",
            "time_limit_minutes=null",
            *(["rollout.tasks_per_step=2", "rollout.group_size=2"] if args.tiny else []),
        ],
    )
    Trainer(grpo).train()
    records = read_metrics(grpo_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    row.held_out.append([r for r in records if r["kind"] == "eval"][-1]["eval/reward_mean"])
    row.mismatch_mean = max(r["mismatch/logprob_abs_diff"] for r in train)
    row.mismatch_max = max(r["mismatch/logprob_abs_diff_max"] for r in train)
    row.step_s = statistics.median(r["time/step_s"] for r in train)
    return grpo_dir / "final"


def prompts_of(model_dir: Path, count: int) -> list[list[int]]:
    """Held-out math problems, rendered as the demonstration's rollouts start (system + user)."""
    from agentboost.envs.registry import make_environment
    from agentboost.models.tokenizers import load_tokenizer
    from agentboost.tokens.templates import template_for

    kwargs = json.loads((EXAMPLE / "train.sh").read_text().split("ENV_KWARGS='")[1].split("'")[0])
    environment = make_environment("math", kwargs)
    tokenizer = load_tokenizer(str(model_dir))
    template = template_for(tokenizer, environment.template)
    rows = []
    for task in environment.tasks(count, seed=0, split="test"):
        messages = [
            {"role": "system", "content": environment.system_prompt},
            {"role": "user", "content": task.prompt},
        ]
        rows.append(
            tokenizer.encode(
                template.render(messages, None, add_generation_prompt=True), add_special_tokens=False
            )
        )
    return rows


def exactness_and_speed(args: argparse.Namespace, row: Row, model_dir: Path) -> None:
    """Sampled rollouts vs teacher-forced passes, then the engine vs ``generate`` at batch 1 and 16."""
    from exactness_support import teacher_forced_logprobs
    from transformers import AutoModelForCausalLM

    from agentboost.engines.base import SamplingParams
    from agentboost.engines.embedded.engine import LocalEngine
    from agentboost.models import precision as precision_module
    from agentboost.train.batching import Sample, collate
    from agentboost.train.policy import PolicyModel

    settings = PRECISIONS[row.precision]
    precision = precision_module.resolve_precision(
        settings.get("model.dtype", "auto"), settings.get("model.compute_dtype", "auto"), args.device
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=precision.weights).to(args.device).eval()
    engine = LocalEngine(model, precision=precision, name="gpu-check")
    rows = prompts_of(model_dir, max(args.rollouts, 16))
    sampled = SamplingParams(temperature=1.0, seed=0)

    async def run(prompts, new):
        return await asyncio.gather(*(engine.generate(p, sampled, max_new_tokens=new) for p in prompts))

    try:
        generations = asyncio.run(run(rows[: args.rollouts], 48))
        fp32 = model if precision.exact else AutoModelForCausalLM.from_pretrained(model_dir).to(args.device)
        own = PolicyModel(model, precision)
        gaps_fp32, gaps_own = [], []
        for ids, generation in zip(rows, generations, strict=False):
            if not generation.token_ids:
                continue
            stored = torch.tensor(generation.logprobs, device=args.device)
            full = ids + generation.token_ids
            forced = teacher_forced_logprobs(fp32.eval(), full, 1.0)[len(ids) - 1 :]
            gaps_fp32.append((forced - stored).abs())
            tensor = torch.tensor(full)
            mask = torch.zeros(len(full) - 1, dtype=torch.bool)
            mask[len(ids) - 1 :] = True
            batch = collate(
                [Sample(0, 0, 0.0, 0.0, tensor[:-1], tensor[1:], mask, torch.zeros(len(full) - 1))]
            )
            with torch.no_grad():
                logprobs, _ = own.logprobs(batch.to(args.device), 1.0)
            gaps_own.append((logprobs[0, len(ids) - 1 :] - stored).abs())
        for name, gaps in (("forced_fp32", gaps_fp32), ("forced_own", gaps_own)):
            every = torch.cat(gaps)
            setattr(row, name, (float(every.mean()), float(every.max())))

        # speed: the same prompts, the same number of new tokens, sampling at temperature 1
        new = args.new_tokens
        for size in (1, 16):
            prompts = rows[:size]
            row.tok_s[f"engine b{size}"] = engine_tok_s(args, run, prompts, new)
            width = max(len(p) for p in prompts)
            ids = torch.zeros((size, width), dtype=torch.long, device=args.device)
            attention = torch.zeros_like(ids)
            for index, prompt in enumerate(prompts):  # left padding, as generate wants for a batch
                ids[index, width - len(prompt) :] = torch.tensor(prompt, device=args.device)
                attention[index, width - len(prompt) :] = 1
            options = dict(do_sample=True, temperature=1.0, top_k=0, max_new_tokens=new, min_new_tokens=new)
            with precision.autocast():
                model.generate(
                    input_ids=ids,
                    attention_mask=attention,
                    **{**options, "max_new_tokens": 4, "min_new_tokens": 4},
                )
                synchronize(args.device)
                started = time.perf_counter()
                model.generate(input_ids=ids, attention_mask=attention, pad_token_id=0, **options)
                synchronize(args.device)
            row.tok_s[f"generate b{size}"] = size * new / (time.perf_counter() - started)
    finally:
        engine.close()
    if args.device.startswith("cuda"):
        graphed_engine(args, row, model, precision, rows, generations)


def engine_tok_s(args: argparse.Namespace, run: Any, prompts: list[list[int]], new: int) -> float:
    """Tokens/s of ``run(prompts, new)`` (a warm-up of 4 tokens first)."""
    asyncio.run(run(prompts, 4))
    synchronize(args.device)
    started = time.perf_counter()
    done = asyncio.run(run(prompts, new))
    synchronize(args.device)
    return sum(len(g.token_ids) for g in done) / (time.perf_counter() - started)


def graphed_engine(
    args: argparse.Namespace, row: Row, model: Any, precision: Any, rows: list[list[int]], eager: list[Any]
) -> None:
    """The engine with CUDA-graphed decode steps: the eager engine's seeded rollouts again, and tok/s."""
    from agentboost.engines.base import SamplingParams
    from agentboost.engines.embedded.engine import LocalEngine

    engine = LocalEngine(model, precision=precision, name="gpu-check-graphs", cuda_graphs=True)
    sampled = SamplingParams(temperature=1.0, seed=0)

    async def run(prompts, new):
        return await asyncio.gather(*(engine.generate(p, sampled, max_new_tokens=new) for p in prompts))

    try:
        graphed = asyncio.run(run(rows[: args.rollouts], 48))
        same = worst = 0.0
        for plain, ours in zip(eager, graphed, strict=True):
            same += plain.token_ids == ours.token_ids
            common = 0
            while common < min(len(plain.token_ids), len(ours.token_ids)) and (
                plain.token_ids[common] == ours.token_ids[common]
            ):
                common += 1
            gaps = [abs(a - b) for a, b in zip(plain.logprobs[:common], ours.logprobs[:common], strict=True)]
            worst = max([worst, *gaps])
        row.graphs_same_ids, row.graphs_logprob_max = same / max(1, len(graphed)), worst
        for size in (1, 16):
            row.tok_s[f"engine+graphs b{size}"] = engine_tok_s(args, run, rows[:size], args.new_tokens)
    finally:
        engine.close()


def table(rows: list[Row]) -> str:
    def pair(values: tuple[float, float]) -> str:
        return f"{values[0]:.1e} / {values[1]:.1e}"

    lines = [
        "| | " + " | ".join(f"`{r.precision}`: {r.picked}" for r in rows) + " |",
        "| --- |" + " ---: |" * len(rows),
    ]
    figures = {
        "held-out: before SFT / after SFT / after GRPO": lambda r: " / ".join(f"{x:.3f}" for x in r.held_out),
        "SFT loss, first -> last step": lambda r: (
            f"{r.sft_loss[0]:.3f} -> {r.sft_loss[-1]:.3f}" if r.sft_loss else ""
        ),
        "GRPO `mismatch/logprob_abs_diff` / `_max` (worst step)": lambda r: pair(
            (r.mismatch_mean, r.mismatch_max)
        ),
        "sampled vs teacher-forced float32, mean / max": lambda r: pair(r.forced_fp32),
        "sampled vs the trainer's own pass, mean / max": lambda r: pair(r.forced_own),
        **{
            f"tok/s, {name}": (lambda r, name=name: f"{r.tok_s.get(name, float('nan')):.0f}")
            for name in (
                "engine b1",
                "engine+graphs b1",
                "generate b1",
                "engine b16",
                "engine+graphs b16",
                "generate b16",
            )
        },
        "CUDA graphs vs eager: same ids / max logprob gap": lambda r: (
            "n/a (CUDA only)"
            if r.graphs_same_ids != r.graphs_same_ids  # nan: not run
            else f"{r.graphs_same_ids:.0%} / {r.graphs_logprob_max:.1e}"
        ),
        "GRPO step, median s": lambda r: f"{r.step_s:.2f}",
        "peak GPU memory, GiB": lambda r: f"{r.peak_gib:.2f}",
        "wall time, s": lambda r: f"{r.seconds:.0f}",
    }
    for name, show in figures.items():
        lines.append(f"| {name} | " + " | ".join(show(r) for r in rows) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    refusal = check_device(args)
    if refusal:
        print(f"gpu_check: {refusal}", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    print(f"device: {device}, torch {torch.__version__}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        scratch = args.keep or Path(temporary)
        scratch.mkdir(parents=True, exist_ok=True)
        model = model_for(args, scratch)
        data = scratch / "data"
        prepare = [sys.executable, str(EXAMPLE / "prepare_data.py"), "--out", str(data)]
        subprocess.run([*prepare, *(["--demonstrations", "8"] if args.tiny else [])], cwd=ROOT, check=True)
        for name in args.precisions:
            row = Row(name)
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            final = stages(args, row, model, data, scratch / name)
            exactness_and_speed(args, row, final)
            row.seconds = time.perf_counter() - started
            if args.device.startswith("cuda"):
                row.peak_gib = torch.cuda.max_memory_allocated() / 2**30
                torch.cuda.empty_cache()
            rows.append(row)
            print(f"[{name}] done in {row.seconds:.0f} s", flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
