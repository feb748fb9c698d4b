"""Gradients and optimizer state in one buffer each: the same numbers as the usual path, bit for bit."""

from __future__ import annotations

import io

import torch
from conftest import tiny_qwen3
from test_policy_logprobs import batch

from agentboost.train import policy
from agentboost.train.buffers import FlatGradients, compact_optimizer_state
from agentboost.train.config import OptimizerConfig


def micro_batches() -> list:
    return [batch([30, 22]), batch([17, 25, 12])]


def backward(model, micro) -> None:
    logprobs, _ = policy.PolicyModel(model).logprobs(micro, 1.0)
    (-(logprobs * micro.loss_mask).sum()).backward()


def storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def test_flat_gradients_accumulate_the_usual_gradients_in_one_buffer():
    usual, flat = tiny_qwen3(seed=5), tiny_qwen3(seed=5)
    unused = torch.nn.Parameter(torch.ones(3))  # a parameter no backward reaches: its grad stays None
    flat.register_parameter("unused", unused)
    gradients = FlatGradients(flat.parameters())
    gradients.allocate()
    assert len(storages(p.grad for p in flat.parameters())) == 1
    for micro in micro_batches():  # two micro-batches: the second accumulates
        backward(usual, micro)
        backward(flat, micro)
    gradients.drop_untouched()
    assert unused.grad is None
    # autograd accumulated into the views in place: still one buffer
    assert len(storages(p.grad for p in flat.parameters() if p.grad is not None)) == 1
    flat_parameters = dict(flat.named_parameters())
    for name, parameter in usual.named_parameters():
        assert torch.equal(parameter.grad, flat_parameters[name].grad), name
    buffer_ptr = next(iter(storages([flat.model.embed_tokens.weight.grad])))
    gradients.zero()  # the next optimizer step starts from zeros, in the same buffer
    assert all(float(p.grad.abs().sum()) == 0 for p in gradients.parameters)
    assert storages(p.grad for p in gradients.parameters) == {buffer_ptr}
    gradients.release()
    assert all(p.grad is None for p in flat.parameters())


def test_compacted_adamw_state_steps_and_resumes_exactly_as_the_usual_one():
    config = OptimizerConfig(lr=1e-3, weight_decay=0.01)
    models = [tiny_qwen3(seed=6), tiny_qwen3(seed=6)]
    optimizers = [policy.make_optimizer(m.parameters(), config) for m in models]
    gradients = FlatGradients(models[1].parameters())
    moved = []
    for step in range(3):
        micro = micro_batches()[step % 2]
        optimizers[0].zero_grad(set_to_none=True)
        backward(models[0], micro)
        torch.nn.utils.clip_grad_norm_(models[0].parameters(), 1.0)
        optimizers[0].step()
        gradients.zero()
        backward(models[1], micro)
        gradients.drop_untouched()
        torch.nn.utils.clip_grad_norm_(models[1].parameters(), 1.0)
        optimizers[1].step()
        moved.append(compact_optimizer_state(optimizers[1]))
        gradients.release()
    assert moved == [True, False, False]  # moved once, then already in place
    moments = [v for s in optimizers[1].state.values() for v in s.values() if v.dim() > 0]
    assert len(moments) == 2 * len(list(models[1].parameters())) and len(storages(moments)) == 1
    for a, b in zip(*(m.parameters() for m in models), strict=True):
        assert torch.equal(a, b)
    # a checkpoint of the compacted state resumes to the same next step
    saved = io.BytesIO()
    torch.save(optimizers[1].state_dict(), saved)
    saved.seek(0)
    resumed_model = tiny_qwen3(seed=6)
    resumed_model.load_state_dict(models[1].state_dict())
    resumed = policy.make_optimizer(resumed_model.parameters(), config)
    resumed.load_state_dict(torch.load(saved))
    for model, optimizer in ((models[0], optimizers[0]), (resumed_model, resumed)):
        optimizer.zero_grad(set_to_none=True)
        backward(model, micro_batches()[0])
        optimizer.step()
    for a, b in zip(models[0].parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(a, b)
