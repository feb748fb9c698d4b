"""The trainer's logprobs are taken a chunk of positions at a time: same values, same gradients."""

from __future__ import annotations

import torch
from conftest import tiny_qwen3

from agentboost.train import policy
from agentboost.train.batching import Sample, collate


def batch(lengths: list[int]):
    generator = torch.Generator().manual_seed(0)
    samples = []
    for index, length in enumerate(lengths):
        ids = torch.randint(0, 1000, (length,), generator=generator)
        mask = torch.zeros(length, dtype=torch.bool)
        mask[length // 3 :] = True
        samples.append(Sample(index, 0, 0.0, 1.0, ids[:-1], ids[1:], mask[1:], torch.zeros(length - 1)))
    return collate(samples)


def direct(model, micro, temperature):
    """The textbook computation: the whole [B, T, V] logits, log-softmax, gather."""
    logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits.float()
    scaled = torch.log_softmax(logits / temperature, dim=-1)
    picked = scaled.gather(-1, micro.target_ids.unsqueeze(-1)).squeeze(-1)
    probabilities = scaled.exp()
    entropy = -(probabilities * scaled).sum(-1)
    return picked * micro.loss_mask, entropy * micro.loss_mask


def test_chunked_logprobs_entropy_and_gradients_equal_the_direct_computation(monkeypatch):
    monkeypatch.setattr(policy, "LOGIT_CHUNK_ROWS", 7)  # 3 rows of 40: 80 positions, 12 chunks
    model = tiny_qwen3(seed=3).train()
    micro = batch([40, 33, 40])
    ours, entropy = policy.PolicyModel(model).logprobs(micro, 0.7, with_entropy=True)
    ours.sum().backward()
    ours_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    reference, reference_entropy = direct(model, micro, 0.7)
    reference.sum().backward()
    assert int(micro.loss_mask.sum()) > 7 * 10
    assert torch.allclose(ours, reference, atol=1e-5)
    assert torch.allclose(entropy, reference_entropy, atol=1e-4)
    for mine, theirs in zip(ours_grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # no graph: the same values without checkpointing
        assert torch.equal(policy.PolicyModel(model).logprobs(micro, 0.7)[0], ours.detach())
