"""The engine's linears through oneDNN, packed or not: the tokens and logprobs of PyTorch's own linears,
fresh packs after weight changes, memory given back, the model left as it was, and another thread's pass
(the trainer's, sharing the model) computed by PyTorch as before."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from conftest import run, tiny_qwen3

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded import packed_linear, scheduler
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.engines.embedded.packed_linear import PackedLinears, onednn_supported

pytestmark = pytest.mark.skipif(
    not onednn_supported(tiny_qwen3()), reason="this PyTorch has no oneDNN linear kernels"
)

PROMPTS = [list(range(200 + 13 * i, 260 + 17 * i)) for i in range(6)]
SAMPLINGS = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=3)] * 3


async def generate_all(engine: LocalEngine, max_new_tokens: int = 20):
    return await asyncio.gather(
        *(
            engine.generate(prompt, sampling, max_new_tokens=max_new_tokens)
            for prompt, sampling in zip(PROMPTS, SAMPLINGS, strict=True)
        )
    )


@pytest.fixture
def onednn_calls(monkeypatch):
    """Counts the calls that reach oneDNN, by thread."""
    calls: dict[int, int] = {}
    original = packed_linear._onednn_linear

    def counting(x, weight, bias):
        calls[threading.get_ident()] = calls.get(threading.get_ident(), 0) + 1
        return original(x, weight, bias)

    monkeypatch.setattr(packed_linear, "_onednn_linear", counting)
    return calls


def test_onednn_linears_give_the_tokens_and_logprobs_of_torch_linears(onednn_calls):
    model = tiny_qwen3(seed=1, hidden=128)

    async def generate(**options):
        engine = LocalEngine(model, **options)
        engine._use_direct()  # the direct forward's first-use check: its passes are not counted below
        engine.packed_passes = 0
        onednn_calls.clear()
        results = await generate_all(engine)
        await engine.aclose()
        return results, engine, sum(onednn_calls.values())

    packed, packed_engine, packed_calls = run(generate())
    unpacked, unpacked_engine, unpacked_calls = run(generate(packed_weights=False))
    plain, _, plain_calls = run(generate(onednn_linears=False))
    # every pass of the default engine ran on packs; each pass makes 4 products in each of the 2 layers
    # (query, key and value together; the output; gate and up together; down) and the head's
    assert packed_engine.packed_passes > packed_engine.steps >= 19
    assert packed_calls == 9 * packed_engine.packed_passes
    assert unpacked_engine.packed_passes == 0 and unpacked_calls >= 15 * unpacked_engine.steps
    assert plain_calls == 0
    for results in (packed, unpacked):
        for a, b in zip(results, plain, strict=True):
            assert a.token_ids == b.token_ids and len(a.token_ids) == 20
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-5
    # nothing of the oneDNN path is left on the model
    assert not any("forward" in module.__dict__ for module in model.modules())


def test_grouped_linears_are_one_product_and_ungrouped_ones_get_their_own_packs_again():
    model = tiny_qwen3(seed=4, hidden=128)
    layer = model.model.layers[0]
    attention, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = (attention.q_proj, attention.k_proj, attention.v_proj), (mlp.gate_proj, mlp.up_proj)
    linears = PackedLinears(
        model, [qkv, gate_up, (attention.o_proj, mlp.down_proj)]
    )  # the last: other inputs
    linears.pack(epoch=0)
    x = torch.randn(3, 5, 128)
    with torch.inference_mode():
        for group in (qkv, gate_up):
            outs = linears.project(x, group)
            assert [o.shape[-1] for o in outs] == [m.out_features for m in group]
            for out, module in zip(outs, group, strict=True):
                assert torch.allclose(out, F.linear(x, module.weight, module.bias), atol=1e-5)
                assert linears._packs[linears._index[id(module)]] is None  # no pack of its own
        assert linears._packs[linears._index[id(attention.o_proj)]] is not None  # not grouped
        linears.group(())  # transformers' forward from now on
        assert not linears.held
        linears.pack(epoch=1)
        assert all(pack is not None for pack in linears._packs)
        outs = linears.project(x, qkv)  # now three products
        for out, module in zip(outs, qkv, strict=True):
            assert torch.allclose(out, F.linear(x, module.weight, module.bias), atol=1e-5)


def test_packs_follow_weight_changes_and_are_given_back():
    model = tiny_qwen3(seed=2, hidden=128)
    engine = LocalEngine(model)

    async def main():
        before = await generate_all(engine)
        with torch.no_grad():  # an optimizer-style in-place change: the packs must not serve old weights
            for parameter in model.parameters():
                parameter.mul_(1.5)
        after = await generate_all(engine)
        reference_engine = LocalEngine(model, onednn_linears=False)
        reference = await generate_all(reference_engine)
        await reference_engine.aclose()
        return before, after, reference

    before, after, reference = run(main())
    assert [r.token_ids for r in after] == [r.token_ids for r in reference]
    assert [r.token_ids for r in after] != [r.token_ids for r in before]
    for a, b in zip(after, reference, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-5

    # an idle engine drops its packs by itself; release_memory() drops them at once
    assert engine._linears is not None
    deadline = time.monotonic() + scheduler.PACKED_IDLE_RELEASE_S + 10
    while engine._linears.held and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not engine._linears.held
    run(generate_all(engine, max_new_tokens=4))
    assert engine._linears.held
    engine.release_memory()
    assert not engine._linears.held
    engine.close()


@pytest.mark.parametrize("packed", [True, False])
def test_another_threads_pass_is_computed_by_torch(onednn_calls, packed):
    """While the engine's thread has the linears routed, the trainer's thread (with or without autograd)
    gets exactly what the model computed before."""
    model = tiny_qwen3(seed=4, hidden=128)
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        expected = model(ids).logits
    linears = PackedLinears(model)
    if packed:
        linears.pack(epoch=0)
    inside, leave = threading.Event(), threading.Event()

    def engine_thread():
        with linears.active():
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=engine_thread)
    thread.start()
    try:
        assert inside.wait(30)
        with torch.no_grad():
            assert torch.equal(model(ids).logits, expected)
        logits = model(ids).logits  # autograd records this one
        assert logits.requires_grad and torch.equal(logits.detach(), expected)
    finally:
        leave.set()
        thread.join(30)
    assert onednn_calls == {}
    # the engine's own thread, inside the routing, does reach oneDNN, and agrees to fp32 rounding
    routed: list[torch.Tensor] = []

    def routed_pass():
        with torch.no_grad(), linears.active():
            routed.append(model(ids).logits)

    thread = threading.Thread(target=routed_pass)
    thread.start()
    thread.join(30)
    assert sum(onednn_calls.values()) == 15
    assert torch.allclose(routed[0], expected, rtol=0, atol=1e-4)
    assert not any("forward" in module.__dict__ for module in model.modules())


def test_routing_matches_f_linear_on_odd_shapes():
    """Bias, batch and sequence dimensions, non-contiguous inputs: oneDNN's answer is F.linear's."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 40)
    model = torch.nn.Sequential(layer)
    linears = PackedLinears(model)
    for packed in (False, True):
        if packed:
            linears.pack(epoch=0)
        for x in (torch.randn(7, 96), torch.randn(3, 5, 96), torch.randn(5, 3, 96).transpose(0, 1)):
            with torch.no_grad(), linears.active():
                got = layer(x)
            assert torch.allclose(got, F.linear(x, layer.weight, layer.bias), rtol=0, atol=1e-5)
