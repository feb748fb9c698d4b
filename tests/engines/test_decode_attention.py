"""The grouped-query attention of one-token decode steps (agentboost/engines/embedded/decode_attention.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from conftest import tiny_qwen3
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentboost.engines.embedded import decode_attention
from agentboost.engines.embedded.engine import LocalEngine

# SmolLM2-135M's attention: 9 query heads on 3 key/value heads of 64
MODULE = SimpleNamespace(num_key_value_groups=3, is_causal=True)


def inputs(rows: int = 6, width: int = 37, queries: int = 1, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    capacity = width + 9  # keys and values are views of wider buffers, as in the engine's batch
    query = torch.randn(rows, queries, 9, 64, generator=generator).transpose(1, 2)
    key = torch.randn(rows, 3, capacity, 64, generator=generator)[:, :, :width]
    value = torch.randn(rows, 3, capacity, 64, generator=generator)[:, :, :width]
    mask = torch.ones(rows, 1, queries, width, dtype=torch.bool)
    for row in range(rows):
        mask[row, ..., : 5 * row] = False  # left padding of different widths
    return query, key, value, mask


def test_one_token_steps_equal_the_repeated_heads_path_with_and_without_padding():
    query, key, value, mask = inputs()
    with torch.inference_mode():
        for attention_mask in (mask, None):
            ours, _ = decode_attention._attention(MODULE, query, key, value, attention_mask, scaling=0.125)
            theirs, _ = sdpa_attention_forward(MODULE, query, key, value, attention_mask, scaling=0.125)
            assert ours.shape == theirs.shape == (6, 1, 9, 64)
            assert (ours - theirs).abs().max() <= 1e-5


def test_everything_but_a_gradient_free_one_token_step_is_transformers_sdpa_unchanged():
    cases = []
    query, key, value, mask = inputs(queries=4)
    cases.append((query, key, value, mask, torch.inference_mode()))  # a prefill: 4 query positions
    query, key, value, mask = inputs()
    cases.append((query.requires_grad_(), key, value, mask, torch.enable_grad()))  # training
    for query, key, value, mask, context in cases:
        with context:
            ours, _ = decode_attention._attention(MODULE, query, key, value, mask, scaling=0.125)
            theirs, _ = sdpa_attention_forward(MODULE, query, key, value, mask, scaling=0.125)
        assert torch.equal(ours, theirs)


def test_the_engine_switches_sdpa_models_only_and_saved_configs_do_not_name_it(tmp_path):
    model = tiny_qwen3(seed=3)
    assert model.config._attn_implementation == "sdpa"
    engine = LocalEngine(model)
    assert (
        engine.grouped_decode_attention and model.config._attn_implementation == decode_attention.NATIVE_NAME
    )
    engine.close()
    engine = LocalEngine(model, native_attention=False)
    assert engine.grouped_decode_attention and model.config._attn_implementation == decode_attention.NAME
    engine.close()
    model.save_pretrained(tmp_path)
    saved = json.dumps(json.loads((tmp_path / "config.json").read_text()))
    assert decode_attention.NAME not in saved and decode_attention.NATIVE_NAME not in saved

    eager = tiny_qwen3(seed=3)
    eager.config._attn_implementation = "eager"
    engine = LocalEngine(eager)
    assert not engine.grouped_decode_attention and eager.config._attn_implementation == "eager"
    engine.close()
