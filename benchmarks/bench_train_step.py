"""Time of one trainer update vs a bare forward + backward of the same model on the same tokens.

The trainer's update (``Trainer.update``: batching, logprobs of generated tokens, entropy, clipped
loss, metrics, gradient clipping, AdamW) runs on synthetic rollouts shaped like the arithmetic
demonstration: every sequence is a shared-length prompt plus a generated reply of random length.
The baseline runs the model's own forward (full logits), a cross-entropy on the same generated
tokens, and backward, on the same padded micro-batches. An AdamW step alone is timed too, since
the update includes one and the bare baseline does not. Also printed: the fraction of padding with
bucketing against one batch padded to the longest sequence.

    python benchmarks/bench_train_step.py [--model smollm2-135m-instruct] [--sequences 16]
    python benchmarks/bench_train_step.py --compute-dtype bfloat16   # float32 weights, bfloat16 autocast
    python benchmarks/bench_train_step.py --compute-dtype float32 bfloat16   # both, side by side

``--compute-dtype`` sets ``model.compute_dtype`` (docs/training.md, "Precision"); the bare baseline runs
under the same autocast, so the two lines compare like with like. Given several, each is measured in
turn in one process (the same synthetic rollouts) and a table puts them side by side.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch

from agentboost.envs.base import RolloutResult
from agentboost.tokens.trajectory import Segment, TerminationReason, Trajectory
from agentboost.train.batching import collate, micro_batches
from agentboost.train.config import config_from_dict
from agentboost.train.trainer import Trainer


def synthetic_results(args: argparse.Namespace, vocab: int) -> list[RolloutResult]:
    rng = random.Random(0)
    results = []
    for index in range(args.sequences):
        task = index // args.group_size
        reply = rng.randint(args.min_reply, args.max_reply)
        ids = [rng.randrange(vocab) for _ in range(args.prompt + reply)]
        mask = [0] * args.prompt + [1] * reply
        trajectory = Trajectory(
            task_id=f"task-{task}",
            messages=[],
            token_ids=ids,
            loss_mask=mask,
            logprobs=[-rng.random() * 3 if m else None for m in mask],
            segments=[Segment("prompt", 0, args.prompt, 0), Segment("assistant", args.prompt, len(ids), 0)],
            termination=TerminationReason.COMPLETED,
        )
        results.append(RolloutResult(f"task-{task}", index % args.group_size, trajectory, float(index % 2)))
    return results


def timed(function, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument(
        "--prompt", type=int, default=387, help="prompt tokens (the arithmetic prompt is 387)"
    )
    parser.add_argument("--min-reply", type=int, default=8)
    parser.add_argument("--max-reply", type=int, default=48)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--compute-dtype", nargs="+", choices=["auto", "float32", "bfloat16"], default=["auto"]
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    figures = {compute: measure(args, compute) for compute in args.compute_dtype}
    if len(figures) > 1:
        names = list(figures)
        print("\n| median s | " + " | ".join(str(figures[n]["precision"]) for n in names) + " |")
        print("| --- |" + " ---: |" * len(names))
        for key in ("bare forward+backward", "trainer update", "one AdamW step"):
            print(f"| {key} | " + " | ".join(f"{figures[n][key]:.2f}" for n in names) + " |")


def measure(args: argparse.Namespace, compute_dtype: str) -> dict[str, float | str]:
    """One compute dtype's medians of ``args.repeats``, printed as they come and returned."""
    with tempfile.TemporaryDirectory() as scratch:
        config = config_from_dict(
            {
                "model": {"name_or_path": args.model, "compute_dtype": compute_dtype},
                "environment": {"train_tasks": 64},
                "optimizer": {"lr": 1e-6, "micro_batch_tokens": args.micro_batch_tokens},
                "output_dir": scratch,
                "logging": {"progress": False},
            }
        )
        trainer = Trainer(config)
        model = trainer.model
        vocab = model.get_output_embeddings().weight.shape[0]
        results = synthetic_results(args, vocab)
        samples, _ = trainer.make_samples(results)
        batches = micro_batches(samples, max_tokens=args.micro_batch_tokens, pad_id=trainer.pad_id)
        real = sum(b.real_tokens for b in batches)
        padded = sum(b.padded_tokens for b in batches)
        one_batch = collate(samples, pad_id=trainer.pad_id)

        def bare() -> None:
            model.train()
            model.zero_grad(set_to_none=True)
            for batch in batches:
                with trainer.precision.autocast():
                    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                loss = torch.nn.functional.cross_entropy(
                    logits[batch.loss_mask].float(), batch.target_ids[batch.loss_mask]
                )
                loss.backward()
            model.zero_grad(set_to_none=True)

        def update() -> None:
            trainer.update(samples, step=0)

        def adamw_step() -> None:
            for parameter in trainer.parameters:
                parameter.grad = torch.zeros_like(parameter)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)

        bare()  # warm-up: allocator, kernels
        update()
        bare_times = timed(bare, args.repeats)
        update_times = timed(update, args.repeats)
        adam_times = timed(adamw_step, args.repeats)
        trainer.engine.close()

    bare_s, update_s, adam_s = (statistics.median(t) for t in (bare_times, update_times, adam_times))
    print(
        f"model {args.model} | {len(samples)} sequences, {real} tokens "
        f"({sum(s.loss_tokens for s in samples)} generated) in {len(batches)} micro-batches | "
        f"{torch.get_num_threads()} threads | {trainer.precision.describe()}"
    )
    print(f"bare forward+backward       {bare_s:8.2f} s  (median of {args.repeats})")
    print(f"trainer update              {update_s:8.2f} s  ({(update_s / bare_s - 1) * 100:+.1f}% vs bare)")
    print(f"  of which one AdamW step   {adam_s:8.2f} s")
    without_adam = update_s - adam_s
    print(f"  update without AdamW      {without_adam:8.2f} s  ({(without_adam / bare_s - 1) * 100:+.1f}%)")
    print(
        f"padding: {1 - real / padded:.1%} with bucketing (budget {args.micro_batch_tokens} tokens), "
        f"{1 - one_batch.real_tokens / one_batch.padded_tokens:.1%} as one batch padded to the longest"
    )
    return {
        "precision": trainer.precision.describe(),
        "bare forward+backward": bare_s,
        "trainer update": update_s,
        "one AdamW step": adam_s,
    }


if __name__ == "__main__":
    main()
