"""The embedded engine under bfloat16 autocast over float32 weights (what a GPU run uses), on CPU."""

from __future__ import annotations

import asyncio

import torch
from conftest import tiny_qwen3

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.models.precision import Precision
from agentboost.train.batching import Sample, collate
from agentboost.train.policy import PolicyModel

BFLOAT16_COMPUTE = Precision(weights=torch.float32, compute=torch.bfloat16, device_type="cpu")


def trainer_logprobs(model, precision, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """The trainer's pass (PolicyModel) over prompt + generated: the generated ids' logprobs. [n]."""
    ids = torch.tensor(prompt + generated)
    mask = torch.zeros(len(ids) - 1, dtype=torch.bool)
    mask[len(prompt) - 1 :] = True
    batch = collate([Sample(0, 0, 0.0, 0.0, ids[:-1], ids[1:], mask, torch.zeros(len(ids) - 1))])
    with torch.no_grad():
        logprobs, _ = PolicyModel(model, precision).logprobs(batch, 1.0)
    return logprobs[0, len(prompt) - 1 :]


def test_the_engine_samples_with_the_trainers_numerics_and_sees_every_weight_update():
    model = tiny_qwen3(seed=5)
    engine = LocalEngine(model, precision=BFLOAT16_COMPUTE, max_batch_size=4)
    prompt = list(range(100, 140))
    sampling = SamplingParams(temperature=1.0, seed=3)
    try:
        assert engine.direct_forward_reason.startswith("float32 only")

        def generate():
            return asyncio.run(engine.generate(prompt, sampling, max_new_tokens=12))

        first = generate()
        stored = torch.tensor(first.logprobs)
        ours = trainer_logprobs(model, BFLOAT16_COMPUTE, prompt, first.token_ids)
        exact = trainer_logprobs(model, None, prompt, first.token_ids)  # float32 through and through
        gap = (ours - stored).abs().max()
        assert gap < 0.05, gap  # bfloat16 both sides, different kernels: close, not equal
        assert (exact - stored).abs().max() > 1e-5  # the engine did compute in bfloat16

        with torch.no_grad():  # an optimizer step, as the trainer makes between collections
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        second = generate()
        moved = trainer_logprobs(model, BFLOAT16_COMPUTE, prompt, second.token_ids)
        # the engine's casts of the weights never outlive a forward pass: it serves the new weights
        assert (moved - torch.tensor(second.logprobs)).abs().max() < 0.05
        stale = trainer_logprobs(model, BFLOAT16_COMPUTE, prompt, first.token_ids)
        assert (stale - stored).abs().max() > 0.1  # the update did change these logprobs
    finally:
        engine.close()
