"""The direct forward (agentboost/engines/embedded/direct_forward.py): the tokens and logprobs of
transformers' forward, in prefills and decode steps, on every family it takes, checked before its first use,
and transformers' forward again for models it does not take or that change after the check (a hook, a
replaced module)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch
from conftest import run
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine

SHAPE = dict(
    vocab_size=1000,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
)
FAMILIES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, attention_bias=True, mlp_bias=True)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=None)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE)),  # biases on q, k and v
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=64, tie_word_embeddings=True)),
}
PROMPTS = [list(range(100 + 11 * i, 150 + 23 * i)) for i in range(4)]
SAMPLINGS = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=5)] * 2


def build(family: str, seed: int = 0):
    torch.manual_seed(seed)
    return FAMILIES[family]().eval()


def generate_all(engine: LocalEngine, max_new_tokens: int = 16):
    async def go():
        return await asyncio.gather(
            *(
                engine.generate(prompt, sampling, max_new_tokens=max_new_tokens)
                for prompt, sampling in zip(PROMPTS, SAMPLINGS, strict=True)
            )
        )

    return run(go())


def assert_same(ours, theirs, tolerance=1e-5):
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= tolerance


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_decodes_what_transformers_forward_decodes(family):
    model = build(family)
    direct = LocalEngine(model)
    ours = generate_all(direct)
    direct.close()
    assert direct.direct_forward_reason is None and direct._direct.difference <= 1e-5
    assert direct.direct_steps >= 15  # every decode step after the check
    assert direct.direct_prefills >= 1  # and the prefill
    plain = LocalEngine(model, direct_forward=False)
    theirs = generate_all(plain)
    plain.close()
    assert plain.direct_steps == 0 and plain.direct_forward_reason == "direct_forward=False"
    assert_same(ours, theirs)
    with torch.enable_grad():  # and a teacher-forced pass on transformers' own sdpa, gradients on
        model.config._attn_implementation = "sdpa"
        for prompt, result, sampling in zip(PROMPTS, ours, SAMPLINGS, strict=True):
            logits = model(torch.tensor([prompt + result.token_ids])).logits[0, len(prompt) - 1 : -1]
            logits = logits.detach() / (sampling.temperature or 1.0)
            expected = logits.log_softmax(-1).gather(1, torch.tensor(result.token_ids)[:, None])[:, 0]
            assert (expected - torch.tensor(result.logprobs)).abs().max() <= 1e-4


def test_models_it_does_not_take_keep_transformers_forward():
    torch.manual_seed(0)
    layers = ["full_attention", "sliding_attention"]
    sliding = Qwen3ForCausalLM(
        Qwen3Config(**SHAPE, head_dim=64, layer_types=layers, use_sliding_window=True, sliding_window=8)
    ).eval()
    engine = LocalEngine(sliding)
    generate_all(engine, max_new_tokens=4)
    engine.close()
    assert engine.direct_forward_reason == "sliding-window layers" and engine.direct_steps == 0
    wide = build("llama").to(torch.float64)
    engine = LocalEngine(wide)
    assert engine.direct_forward_reason == "weights are torch.float64 on cpu (fp32 on CPU only)"
    engine.close()


def test_a_model_that_computes_something_else_fails_the_check(caplog):
    model = build("llama", seed=1)
    model.model.layers[1].mlp.register_forward_hook(lambda module, args, output: output + 0.5)
    engine = LocalEngine(model)
    with caplog.at_level(logging.WARNING, logger="agentboost.engines.embedded"):
        ours = generate_all(engine)
    engine.close()
    assert engine.direct_steps == 0 and engine.direct_forward_reason.startswith("failed its check")
    assert engine._direct.difference > 1e-3
    assert any("keeps transformers' forward" in record.message for record in caplog.records)
    plain = LocalEngine(model, direct_forward=False)
    assert_same(ours, generate_all(plain), tolerance=0.0)  # the hook's output: transformers' forward ran
    plain.close()


class Doubled(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


def replace_a_linear(model) -> None:
    old = model.model.layers[0].mlp.down_proj
    new = Doubled(old.in_features, old.out_features, bias=old.bias is not None)
    new.load_state_dict(old.state_dict())
    model.model.layers[0].mlp.down_proj = new


def add_a_hook(model) -> None:
    model.model.layers[0].self_attn.o_proj.register_forward_hook(lambda module, args, output: -output)


@pytest.mark.parametrize("change", [replace_a_linear, add_a_hook])
def test_a_model_changed_after_the_check_goes_back_to_transformers_forward(change, caplog):
    model = build("qwen3", seed=2)
    engine = LocalEngine(model)
    generate_all(engine, max_new_tokens=4)
    assert engine.direct_steps > 0
    used = engine.direct_steps
    change(model)
    engine.weights_updated()  # the model computes something else: its cached prefixes are stale
    with caplog.at_level(logging.WARNING, logger="agentboost.engines.embedded"):
        ours = generate_all(engine)
    engine.close()
    assert engine.direct_steps == used  # not one step more
    assert engine.direct_forward_reason == "the model's modules or hooks changed after its check"
    assert any("modules or hooks changed" in record.message for record in caplog.records)
    plain = LocalEngine(model, direct_forward=False, prefix_cache_bytes=0)
    assert_same(ours, generate_all(plain))
    plain.close()


def test_gradient_checkpointings_hook_on_the_embedding_is_run_not_refused():
    """transformers' gradient checkpointing hooks the input embedding (its output requires grad); the
    direct step calls the embedding as a module, so the hook runs and the step is used."""
    model = build("llama", seed=3)
    model.gradient_checkpointing_enable()
    assert model.model.embed_tokens._forward_hooks
    engine = LocalEngine(model)
    ours = generate_all(engine)
    engine.close()
    assert engine.direct_forward_reason is None and engine.direct_steps >= 15
    plain = LocalEngine(model, direct_forward=False)
    assert_same(ours, generate_all(plain))
    plain.close()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_prefills_from_cached_prefixes_beside_running_rows_match_transformers_forward(family):
    """A second turn prefills only what follows each conversation's cached prefix, while another request
    is still decoding: its rows join the running batch. Both engines share that schedule; only the
    forward differs."""
    model = build(family, seed=4)

    async def conversations(engine: LocalEngine):
        greedy = SamplingParams(temperature=0)
        running = asyncio.ensure_future(engine.generate(PROMPTS[0][:7], greedy, max_new_tokens=40))
        first = await asyncio.gather(
            *(engine.generate(p, s, max_new_tokens=6) for p, s in zip(PROMPTS, SAMPLINGS, strict=True))
        )
        second = await asyncio.gather(
            *(
                engine.generate(p + r.token_ids + [7, 8, 9], s, max_new_tokens=6)
                for p, r, s in zip(PROMPTS, first, SAMPLINGS, strict=True)
            )
        )
        return [*first, *second, await running]

    results = {}
    for direct in (True, False):
        engine = LocalEngine(model, direct_forward=direct)
        results[direct] = run(conversations(engine))
        engine.close()
        assert engine.prefix_cache.stats.cached_tokens > 0 and engine.max_batch_seen > 4
        assert (engine.direct_prefills >= 2) == direct
    assert_same(results[True], results[False])
