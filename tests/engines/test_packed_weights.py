"""Batched decode steps on MKL-packed weights: the same tokens and logprobs, fresh after weight changes,
memory given back, and the model left as it was."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from conftest import run, tiny_qwen3

from agentboost.engines import local
from agentboost.engines.base import SamplingParams
from agentboost.engines.local import LocalEngine
from agentboost.engines.packed_linear import STEADY_STEPS, packing_supported

pytestmark = pytest.mark.skipif(
    not packing_supported(tiny_qwen3()), reason="this PyTorch has no MKL packed linear kernels"
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


def test_packed_decode_steps_give_the_unpacked_tokens_and_logprobs():
    model = tiny_qwen3(seed=1, hidden=128)

    async def both():
        packed, plain = LocalEngine(model), LocalEngine(model, packed_weights=False)
        results = await generate_all(packed), await generate_all(plain)
        steps = packed.packed_steps, plain.packed_steps
        await packed.aclose()
        await plain.aclose()
        return results, steps

    (with_packs, without), (packed_steps, plain_steps) = run(both())
    # about 19 decode steps of 6 rows (how the six are admitted varies): packed from the STEADY_STEPS-th on
    assert 19 - STEADY_STEPS - 2 <= packed_steps <= 19 - STEADY_STEPS + 1 and plain_steps == 0
    for a, b in zip(with_packs, without, strict=True):
        assert a.token_ids == b.token_ids and len(a.token_ids) == 20
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-5
    # nothing of the packed path is left on the model
    assert not any("forward" in module.__dict__ for module in model.modules())


def test_packs_follow_weight_changes_and_are_given_back():
    model = tiny_qwen3(seed=2, hidden=128)
    engine = LocalEngine(model)

    async def main():
        before = await generate_all(engine)
        with torch.no_grad():  # an optimizer-style in-place change: the packs must not serve old weights
            for parameter in model.parameters():
                parameter.mul_(1.5)
        after = await generate_all(engine)
        reference_engine = LocalEngine(model, packed_weights=False)
        reference = await generate_all(reference_engine)
        await reference_engine.aclose()
        return before, after, reference

    before, after, reference = run(main())
    assert [r.token_ids for r in after] == [r.token_ids for r in reference]
    assert [r.token_ids for r in after] != [r.token_ids for r in before]
    for a, b in zip(after, reference, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-5

    # an idle engine drops its packs by itself; release_memory() drops them at once
    assert engine._packed is not None
    deadline = time.monotonic() + local.PACKED_IDLE_RELEASE_S + 10
    while engine._packed.held and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not engine._packed.held
    run(generate_all(engine, max_new_tokens=4))
    assert engine._packed.held
    engine.release_memory()
    assert not engine._packed.held
    engine.close()


def test_one_running_sequence_does_not_use_the_packs():
    engine = LocalEngine(tiny_qwen3(seed=3))
    run(engine.generate(PROMPTS[0], SamplingParams(temperature=0), max_new_tokens=8))
    assert engine.packed_steps == 0 and engine.steps == 7
    engine.close()
