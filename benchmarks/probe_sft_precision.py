"""The math demonstration's SFT stage in float32 and in bfloat16 compute: the loss, side by side.

The real SmolLM2-135M (``agentboost pull``), ``examples/math/sft.yaml`` with its data
(``python examples/math/prepare_data.py --out data/math``), no evaluation. First, forward only, the
loss of step 0's batch in three numerics: float32; bfloat16 autocast with the float32 output head (the
policy's); bfloat16 autocast with a bfloat16 head (what the policy avoids). Then, with ``--steps N``,
N SFT steps in float32 and in bfloat16 compute over float32 master weights, and the loss of each step.

    python benchmarks/probe_sft_precision.py                # forward only: about 2 min on 2 CPU cores
    python benchmarks/probe_sft_precision.py --steps 3      # several minutes a precision on 2 CPU cores
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from agentboost.models import precision
from agentboost.train import algorithms, policy
from agentboost.train.sft import SFTTrainer, load_sft_config


def bfloat16_head(self, hidden, targets, temperature, with_entropy):
    """PolicyModel._head with the output head inside the autocast: bfloat16 logits."""
    with self.precision.autocast():
        logits = self.head(hidden)
    return algorithms.token_logprobs(logits, targets, temperature), logits.new_zeros((0,))


def trainer(compute: str, args: argparse.Namespace) -> SFTTrainer:
    overrides = [f"model.compute_dtype={compute}", f"data.paths=[{args.data}]", "eval.every=0"]
    overrides += ["checkpoint.save_final_model=false", "checkpoint.resume=false", "logging.progress=false"]
    overrides += [f"output_dir={args.out}/{compute}", f"model.device={args.device}"]
    return SFTTrainer(load_sft_config("examples/math/sft.yaml", overrides))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="data/math/demonstrations.jsonl")
    parser.add_argument("--steps", type=int, default=0, help="SFT steps per precision (0: forward only)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="runs/probe-sft-precision")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    run = trainer("bfloat16", args)
    batch = run.batch_for_step(0)
    started = time.perf_counter()
    ours = run.loss_on(batch)
    original = policy.PolicyModel._head
    policy.PolicyModel._head = bfloat16_head
    try:
        rounded = run.loss_on(batch)
    finally:
        policy.PolicyModel._head = original
    run.policy.precision = precision.of_model(run.model)  # the same weights, float32 through and through
    exact = run.loss_on(batch)
    with torch.no_grad():
        logits = run.model(input_ids=torch.tensor([batch[0].token_ids], device=run.device)).logits
    tokens = sum(sum(example.loss_mask[1:]) for example in batch)
    print(
        f"step 0's batch: {len(batch)} examples, {tokens} assistant tokens; "
        f"largest |logit| {logits.abs().max():.1f}"
    )
    print(
        f"loss: float32 {exact:.4f} | bfloat16 autocast, float32 head {ours:.4f} | "
        f"bfloat16 autocast, bfloat16 head {rounded:.4f}  ({time.perf_counter() - started:.0f} s)"
    )
    run.close()
    for compute in ("float32", "bfloat16") if args.steps else ():
        run = trainer(compute, args)
        losses = []
        started = time.perf_counter()
        for step in range(args.steps):
            losses.append(run.train_step(step)["sft/loss"])
        run.close()
        print(
            f"{run.precision.describe()}: SFT loss by step {', '.join(f'{x:.4f}' for x in losses)} "
            f"({time.perf_counter() - started:.0f} s)"
        )


if __name__ == "__main__":
    main()
