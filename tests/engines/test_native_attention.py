"""The native decode-step attention (agentboost/engines/embedded/native_attention.py and
native/decode_attention.c): equal to PyTorch's on every shape it takes, declining what it does not, built once
into agentboost's cache, and an engine that cannot build it still generates the same tokens on PyTorch's
attention."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import run, tiny_qwen3
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded import decode_attention, native_attention
from agentboost.engines.embedded.engine import LocalEngine

pytestmark = pytest.mark.skipif(
    not native_attention.available(),
    reason=f"the native kernel is not built here: {native_attention.status()}",
)


def inputs(rows, kv_heads, groups, head_dim, width, *, seed=0, padding=5, spread=1.0):
    generator = torch.Generator().manual_seed(seed)
    heads = kv_heads * groups
    capacity = width + 7  # keys and values are views of a wider buffer, as in the engine's batch
    query = spread * torch.randn(rows, 1, heads, head_dim, generator=generator).transpose(1, 2)
    buffer = torch.randn(2, rows, kv_heads, capacity, head_dim, generator=generator)
    key, value = buffer[0, :, :, :width], buffer[1, :, :, :width]
    mask = torch.ones(rows, 1, 1, width, dtype=torch.bool)
    for row in range(rows):
        mask[row, ..., : min(padding * row, width - 1)] = False  # left padding, every row reads one position
    return query, key, value, mask


def reference(query, key, value, mask, scale):
    module = SimpleNamespace(num_key_value_groups=query.shape[1] // key.shape[1], is_causal=True)
    return sdpa_attention_forward(module, query, key, value, mask, scaling=scale)[0]


def exact(query, key, value, mask, scale):
    """The attention in float64, laid out as ``reference`` returns it ([rows, 1, heads, head_dim])."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.double().repeat_interleave(groups, 1), value.double().repeat_interleave(groups, 1)
    scores = (query.double() @ key.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ value).transpose(1, 2)


@pytest.mark.parametrize(
    ("kv_heads", "groups", "head_dim", "width"),
    [
        (3, 3, 64, 419),  # SmolLM2-135M at the benchmark's cache length
        (3, 3, 64, 1),
        (3, 3, 64, 64),  # one whole block of positions
        (3, 3, 64, 65),  # a block and one position
        (2, 4, 128, 130),  # Qwen3-style heads of 128
        (2, 2, 16, 37),  # the tests' tiny Qwen3: the general loops
        (1, 1, 80, 50),  # no grouping, a head size with no fast path
        (4, 8, 64, 200),
    ],
)
def test_equal_to_pytorchs_attention_with_and_without_padding(kv_heads, groups, head_dim, width):
    query, key, value, mask = inputs(5, kv_heads, groups, head_dim, width)
    scale = head_dim**-0.5
    with torch.inference_mode():
        for attention_mask in (mask, None):
            ours = native_attention.attend(query, key, value, attention_mask, scale)
            theirs = reference(query, key, value, attention_mask, scale)
            assert ours is not None and ours.shape == theirs.shape == (5, 1, kv_heads * groups, head_dim)
            assert (ours - theirs).abs().max() <= 2e-6


def test_large_scores_holes_in_the_mask_and_a_query_that_is_a_view():
    query, key, value, mask = inputs(
        4, 3, 3, 64, 300, spread=40.0
    )  # scores in the hundreds: softmax is peaked
    mask[:, ..., 100:180:3] = False  # positions masked in the middle, not only on the left
    wide = torch.randn(4, 9, 3, 64)[:, :, 1:2]  # a query that is a strided view of a bigger tensor
    wide.copy_(query)
    # judged against float64: with scores in the hundreds two float32 paths differ by ~1e-5, and PyTorch's
    # moved from 7e-6 to 1.5e-5 off the exact result with transformers 5.24 (one query: pack_gqa)
    with torch.inference_mode():
        for q in (query, wide):
            ours = native_attention.attend(q, key, value, mask, 0.125)
            assert (
                torch.isfinite(ours).all() and (ours - exact(q, key, value, mask, 0.125)).abs().max() <= 1e-5
            )


def test_declines_what_it_is_not_exact_for():
    query, key, value, mask = inputs(2, 3, 3, 64, 20)
    additive = torch.zeros(2, 1, 1, 20)
    assert native_attention.attend(query.double(), key.double(), value.double(), mask, 0.125) is None
    assert native_attention.attend(query.bfloat16(), key.bfloat16(), value.bfloat16(), mask, 0.125) is None
    assert native_attention.attend(query, key, value, additive, 0.125) is None  # only boolean masks
    assert native_attention.attend(query.expand(2, 9, 4, 64), key, value, None, 0.125) is None  # 4 positions
    transposed = key.transpose(2, 3).contiguous().transpose(2, 3)  # head dimension not contiguous
    assert native_attention.attend(query, transposed, value, None, 0.125) is None
    assert native_attention.attend(query, key, value.contiguous(), None, 0.125) is None  # unequal strides
    assert native_attention.attend(query[:, :8], key, value, None, 0.125) is None  # 8 heads on 3


def engine_prefill_mask(cached: list[int], new: list[int]) -> torch.Tensor:
    """The 4-D mask of one engine prefill: rows ``[pad | cached prefix | pad | new tokens]``, causal."""
    past, width = max(cached), max(new)
    columns = torch.zeros(len(new), past + width, dtype=torch.bool)
    for row, (c, n) in enumerate(zip(cached, new, strict=True)):
        columns[row, past - c : past] = True
        columns[row, past + width - n :] = True
    causal = torch.arange(past + width)[None, :] <= (past + torch.arange(width))[:, None]  # [width, W]
    return (columns[:, None, :] & causal[None])[:, None]  # [B, 1, width, past + width]


def prefill_inputs(rows, kv_heads, groups, head_dim, length, width, *, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, length, kv_heads * groups, head_dim, generator=generator).transpose(1, 2)
    buffer = torch.randn(2, rows, kv_heads, width + 3, head_dim, generator=generator)
    return query, buffer[0, :, :, :width], buffer[1, :, :, :width]


def attended(mask: torch.Tensor) -> torch.Tensor:
    """[B, 1, heads, ...] broadcastable: query positions that attend to anything (padding rows do not)."""
    return mask[:, 0].any(-1)[:, :, None, None]


@pytest.mark.parametrize(
    ("kv_heads", "groups", "head_dim", "cached", "new"),
    [
        (3, 3, 64, [0, 0, 0, 0], [40, 33, 17, 1]),  # a fresh batch, left-padded
        (3, 3, 64, [30, 0, 12, 30], [20, 25, 5, 1]),  # prefix-cache hits: a hole between cached and new
        (2, 4, 128, [0, 9], [21, 21]),
        (1, 1, 64, [7], [70]),  # no grouping: one query per lane
        (4, 8, 64, [0, 0], [3, 2]),
    ],
)
def test_prefills_equal_pytorchs_attention(kv_heads, groups, head_dim, cached, new):
    mask = engine_prefill_mask(cached, new)
    rows, _, length, width = mask.shape
    query, key, value = prefill_inputs(rows, kv_heads, groups, head_dim, length, width)
    scale = head_dim**-0.5
    with torch.inference_mode():
        ours = native_attention.prefill(query, key, value, mask, scale)
        theirs = reference(query, key, value, mask, scale)
    assert ours is not None and ours.shape == theirs.shape == (rows, length, kv_heads * groups, head_dim)
    live = attended(mask).expand_as(ours)
    assert (ours - theirs)[live].abs().max() <= 2e-6
    assert not ours[~live].any()  # positions that attend to nothing: zeros, as PyTorch gives here
    assert not theirs[~live].any()


def test_a_causal_prefill_without_a_mask_and_what_prefills_it_declines():
    query, key, value = prefill_inputs(2, 3, 3, 64, 50, 50)
    with torch.inference_mode():
        ours = native_attention.prefill(query, key, value, None, 0.125, is_causal=True)
        module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
        theirs, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.125)
    assert (ours - theirs).abs().max() <= 2e-6
    assert native_attention.prefill(query, key, value, None, 0.125) is None  # not causal: every position
    two_holes = engine_prefill_mask([0, 0], [50, 50])
    two_holes[0, 0, 30, 5] = two_holes[0, 0, 30, 9] = False
    assert native_attention.prefill(query, key, value, two_holes, 0.125) is None
    odd = prefill_inputs(2, 3, 3, 80, 50, 50)
    assert native_attention.prefill(*odd, None, 0.125, is_causal=True) is None  # heads of 80: no kernel
    assert native_attention.prefill(query, key, value, two_holes.float(), 0.125) is None


def test_gradient_free_passes_use_it_and_passes_with_gradients_are_transformers_sdpa():
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    query, key, value, mask = inputs(3, 3, 3, 64, 40)
    decode_before, prefill_before = native_attention.calls, native_attention.prefill_calls
    with torch.inference_mode():
        ours, _ = decode_attention._native_attention(module, query, key, value, mask, scaling=0.125)
    assert native_attention.calls == decode_before + 1
    assert (ours - reference(query, key, value, mask, 0.125)).abs().max() <= 2e-6
    prefill_query, prefill_key, prefill_value = prefill_inputs(3, 3, 3, 64, 40, 40)
    with torch.no_grad():
        ours, _ = decode_attention._native_attention(module, prefill_query, prefill_key, prefill_value, None)
        theirs, _ = sdpa_attention_forward(module, prefill_query, prefill_key, prefill_value, None)
    assert native_attention.prefill_calls == prefill_before + 1 and (ours - theirs).abs().max() <= 2e-6
    for q, k, v in ((query, key, value), (prefill_query, prefill_key, prefill_value)):
        q = q.clone().requires_grad_()
        with torch.enable_grad():
            ours, _ = decode_attention._native_attention(module, q, k, v, None, scaling=0.125)
            theirs, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.125)
        assert torch.equal(ours, theirs) and ours.requires_grad
    assert (
        native_attention.calls == decode_before + 1 and native_attention.prefill_calls == prefill_before + 1
    )


PROMPTS = [list(range(300 + 11 * i, 350 + 23 * i)) for i in range(5)]
SAMPLINGS = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=5)] * 2 + [
    SamplingParams(temperature=0.7, seed=9)
]


def generate_all(model, **options):
    async def go():
        engine = LocalEngine(model, **options)
        results = await asyncio.gather(
            *(
                engine.generate(prompt, sampling, max_new_tokens=24)
                for prompt, sampling in zip(PROMPTS, SAMPLINGS, strict=True)
            )
        )
        await engine.aclose()
        return results

    return run(go())


def test_an_engine_on_it_generates_what_pytorchs_attention_generates_and_logprobs_match_teacher_forcing():
    """Prefills and decode steps on the kernel; against the engine on PyTorch's attention and a
    teacher-forced pass with gradients on (the trainer's: transformers' sdpa)."""
    model = tiny_qwen3(seed=2, hidden=256)  # heads of 64: the kernel's fast path
    before, prefills_before = native_attention.calls, native_attention.prefill_calls
    native = generate_all(model)
    used, prefills = native_attention.calls - before, native_attention.prefill_calls - prefills_before
    assert model.config._attn_implementation == decode_attention.NATIVE_NAME
    plain = generate_all(model, native_attention=False)
    assert model.config._attn_implementation == decode_attention.NAME
    assert native_attention.calls - before == used and used >= 2 * 23  # two layers, every decode step
    assert native_attention.prefill_calls - prefills_before == prefills >= 2  # two layers, every prefill
    for ours, theirs in zip(native, plain, strict=True):
        assert ours.token_ids == theirs.token_ids
        assert max(abs(a - b) for a, b in zip(ours.logprobs, theirs.logprobs, strict=True)) <= 1e-5
    with torch.enable_grad():  # an independent teacher-forced pass, on transformers' own sdpa
        model.config._attn_implementation = "sdpa"
        for prompt, result, sampling in zip(PROMPTS, native, SAMPLINGS, strict=True):
            ids = torch.tensor([prompt + result.token_ids])
            logits = model(ids).logits[0, len(prompt) - 1 : -1].detach().float()
            if sampling.temperature:
                logits = logits / sampling.temperature
            expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(result.token_ids)[:, None])[:, 0]
            assert (expected - torch.tensor(result.logprobs)).abs().max() <= 1e-4


@pytest.mark.parametrize("shape", [(1, 1, 576), (16, 400, 576), (3, 7, 4, 64), (2, 5, 33)])
def test_rms_norm_equals_transformers_rmsnorm_to_float_rounding(shape):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    generator = torch.Generator().manual_seed(sum(shape))
    norm = LlamaRMSNorm(shape[-1], eps=1e-5)
    norm.weight.data = torch.randn(shape[-1], generator=generator)
    x = torch.randn(shape, generator=generator) * 3
    with torch.inference_mode():
        ours, theirs = native_attention.rms_norm(x, norm.weight, norm.variance_epsilon), norm(x)
        strided = native_attention.rms_norm(x[..., :-1], norm.weight[:-1], 1e-5)  # rows wider than D
    assert ours.shape == x.shape and torch.allclose(ours, theirs, rtol=2e-6, atol=2e-6)
    assert torch.allclose(
        strided, LlamaRMSNorm(shape[-1] - 1, eps=1e-5).forward(x[..., :-1]) * norm.weight[:-1]
    )
    assert native_attention.rms_norm(x.double(), norm.weight.double(), 1e-5) is None  # fp32 only


@pytest.mark.parametrize("shape", [(1, 1, 9, 64), (16, 400, 3, 64), (2, 5, 4, 128), (1, 3, 2, 6)])
def test_rotary_is_transformers_apply_rotary_pos_emb_to_the_bit(shape):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    generator = torch.Generator().manual_seed(sum(shape))
    batch, length, heads, dim = shape
    query = torch.randn(shape, generator=generator) * 4
    key = torch.randn(batch, length, max(1, heads // 3), dim, generator=generator)
    angles = torch.rand(batch, length, dim // 2, generator=generator) * 1000
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    expected = apply_rotary_pos_emb(query.transpose(1, 2), key.transpose(1, 2), cos, sin)
    assert native_attention.rotary(query, key, cos, sin)
    assert torch.equal(query.transpose(1, 2), expected[0]) and torch.equal(key.transpose(1, 2), expected[1])


def test_rotary_declines_what_it_cannot_rotate_and_then_touches_neither():
    query, key, cos = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 8)
    before = query.clone(), key.clone()
    assert not native_attention.rotary(query, key.transpose(1, 2), cos, cos)  # heads and positions swapped
    assert not native_attention.rotary(query, key, cos[..., :4], cos[..., :4])  # cos of another size
    assert not native_attention.rotary(query.double(), key.double(), cos.double(), cos.double())
    assert torch.equal(query, before[0]) and torch.equal(key, before[1])


def test_the_build_is_cached_per_source_compiler_and_cpu(tmp_path):
    first = native_attention.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert first.parent == tmp_path and first.name.startswith("attention-") and first.suffix == ".so"
    assert native_attention.build(tmp_path) == first and first.stat().st_mtime_ns == stamp  # not rebuilt
    assert [path.name for path in tmp_path.iterdir()] == [first.name]  # no partial files left


def test_a_missing_compiler_is_a_typed_error_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(native_attention.BuildError, match="no C compiler"):
        native_attention.build(tmp_path / "cache")
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'cc: fatal error: simulated' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with pytest.raises(native_attention.BuildError, match="simulated"):
        native_attention.build(tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


ENGINE_WITHOUT_KERNEL = textwrap.dedent(
    """
    import asyncio, json, sys
    sys.path.insert(0, {tests!r})
    from conftest import tiny_qwen3
    from agentboost.engines.embedded import native_attention
    from agentboost.engines.base import SamplingParams
    from agentboost.engines.embedded.engine import LocalEngine

    async def main():
        engine = LocalEngine(tiny_qwen3(seed=2, hidden=256))
        result = await engine.generate(list(range(300, 360)), SamplingParams(temperature=0),
                                       max_new_tokens=12)
        await engine.aclose()
        print(json.dumps({{"status": native_attention.status(), "calls": native_attention.calls,
                          "ids": result.token_ids, "logprobs": result.logprobs}}))

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("how", ["no compiler", "switched off"])
def test_an_engine_that_cannot_use_the_kernel_says_why_and_generates_the_same(tmp_path, how):
    environment = {**os.environ, "AGENTBOOST_HOME": str(tmp_path / "home")}
    if how == "no compiler":
        environment["CC"] = str(tmp_path / "no-such-cc")
    else:
        environment["AGENTBOOST_NATIVE_ATTENTION"] = "0"
    script = ENGINE_WITHOUT_KERNEL.format(tests=str(Path(__file__).parent.parent))
    done = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["calls"] == 0
    if how == "no compiler":
        assert result["status"].startswith("not built: no C compiler")
        assert "decode steps keep PyTorch's attention" in done.stderr  # said once, in the log
    else:
        assert result["status"] == "disabled by AGENTBOOST_NATIVE_ATTENTION"
    assert not (tmp_path / "home" / "kernels").exists() or not any((tmp_path / "home" / "kernels").iterdir())

    model = tiny_qwen3(seed=2, hidden=256)

    async def here():
        engine = LocalEngine(model)
        outcome = await engine.generate(
            list(range(300, 360)), SamplingParams(temperature=0), max_new_tokens=12
        )
        await engine.aclose()
        return outcome

    native = run(here())
    assert native.token_ids == result["ids"]
    assert max(abs(a - b) for a, b in zip(native.logprobs, result["logprobs"], strict=True)) <= 1e-5


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_the_kernel_shares_pytorchs_openmp_runtime():
    """A second OpenMP runtime would bring a second pool of threads competing with PyTorch's for the cores."""
    assert native_attention.available()
    runtimes = {
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if "gomp" in line.rsplit("/", 1)[-1] or "libomp" in line.rsplit("/", 1)[-1]
    }
    assert len(runtimes) == 1, runtimes
