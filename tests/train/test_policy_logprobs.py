"""The trainer's logprobs are taken a chunk of positions at a time: same values, same gradients."""

from __future__ import annotations

import torch
from conftest import tiny_qwen3

from agentboost.train import policy
from agentboost.train.batching import Sample, collate


def batch(lengths: list[int]):
    """A padded micro-batch of random ids, the last two thirds of each row generated (seed 0)."""
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
        # float32 sums taken in another order: the error scales with the gradient (the embedding's reach
        # 7.8, where 7.8e-5 apart was seen on an AMD EPYC), so the bound is relative to the largest entry
        scale = float(theirs.abs().max())
        assert float((mine - theirs).abs().max()) <= 3e-5 * max(scale, 1.0)
    with torch.no_grad():  # no graph: the same values without checkpointing
        assert torch.equal(policy.PolicyModel(model).logprobs(micro, 0.7)[0], ours.detach())


def test_the_per_parameter_adamw_steps_exactly_as_the_multi_tensor_default():
    from agentboost.train.config import OptimizerConfig

    config = OptimizerConfig(lr=1e-3, weight_decay=0.01)
    models = [tiny_qwen3(seed=4), tiny_qwen3(seed=4)]
    ours = policy.make_optimizer(models[0].parameters(), config)
    default = torch.optim.AdamW(
        models[1].parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=True
    )
    assert ours.defaults["foreach"] is False
    micro = batch([30, 22])
    for _ in range(3):
        for model, optimizer in zip(models, (ours, default), strict=True):
            optimizer.zero_grad(set_to_none=True)
            logprobs, _ = policy.PolicyModel(model).logprobs(micro, 1.0)
            (-(logprobs * micro.loss_mask).sum()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    pairs = list(zip(models[0].parameters(), models[1].parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in pairs)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(models[0].parameters(), tiny_qwen3(seed=4).parameters(), strict=True)
    )
