"""The embedded engine: batching that changes nothing, cancellation, limits, sampling."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from conftest import SYSTEM, add, multiply, run
from transformers import AutoModelForCausalLM

from agentboost.agent.episode import run_agent
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.errors import ConfigError, ContextLengthError


def test_64_concurrent_agents_match_one_by_one(memorized_qwen3, qwen_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(memorized_qwen3, dtype=torch.float32)
    questions = [f"What is ({i} + {2 * i}) * {i % 7 + 1}?" for i in range(64)]
    limits = RolloutLimits(max_turns=3, max_new_tokens=24)

    def one(engine, question):
        return run_agent(
            engine,
            qwen_tokenizer,
            question,
            system_prompt=SYSTEM,
            tools=[add, multiply],
            template="qwen3",
            sampling=SamplingParams(temperature=0),
            limits=limits,
        )

    async def together():
        engine = LocalEngine(model)
        results = await asyncio.gather(*(one(engine, q) for q in questions))
        await engine.aclose()
        return results, engine.max_batch_seen

    async def alone():
        engine = LocalEngine(model, max_batch_size=1)
        results = [await one(engine, q) for q in questions]
        await engine.aclose()
        return results

    concurrent, widest = run(together())
    sequential = run(alone())
    assert widest >= 32  # they really ran batched
    for a, b in zip(concurrent, sequential, strict=False):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        pairs = [(x, y) for x, y in zip(a.logprobs, b.logprobs, strict=False) if x is not None]
        assert max(abs(x - y) for x, y in pairs) <= 1e-4


def test_sampling_is_reproducible_per_seed_and_top_k_1_is_greedy(random_qwen3):
    engine = LocalEngine(random_qwen3)
    prompt = list(range(500, 540))

    async def main():
        greedy = await engine.generate(prompt, SamplingParams(temperature=0), max_new_tokens=12)
        top1 = await engine.generate(
            prompt, SamplingParams(temperature=1.3, top_k=1, seed=1), max_new_tokens=12
        )
        seeded = [
            await engine.generate(prompt, SamplingParams(temperature=1.0, seed=5), max_new_tokens=12)
            for _ in range(2)
        ]
        other = await engine.generate(prompt, SamplingParams(temperature=1.0, seed=6), max_new_tokens=12)
        await engine.aclose()
        return greedy, top1, seeded, other

    greedy, top1, seeded, other = run(main())
    assert top1.token_ids == greedy.token_ids
    assert seeded[0].token_ids == seeded[1].token_ids != other.token_ids
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 12


def test_a_seeded_request_draws_the_same_ids_alone_and_in_a_mixed_batch(random_qwen3):
    """Sampling is batched; each request's draws still come from its own generator only."""
    prompts = [list(range(300 + 7 * i, 340 + 9 * i)) for i in range(8)]
    mine = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=123)
    others = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0),  # unseeded: the OS seeds it
        SamplingParams(temperature=0.7, top_p=0.8, seed=4),
        SamplingParams(temperature=1.3, top_k=5, seed=5),
        SamplingParams(temperature=1.0, seed=6),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.5, top_k=200, top_p=0.5, seed=7),
    ]

    async def alone():
        engine = LocalEngine(random_qwen3, max_batch_size=1)
        result = await engine.generate(prompts[0], mine, max_new_tokens=24)
        await engine.aclose()
        return result

    async def together():
        engine = LocalEngine(random_qwen3)
        results = await asyncio.gather(
            engine.generate(prompts[0], mine, max_new_tokens=24),
            *(
                engine.generate(prompt, sampling, max_new_tokens=16 + 3 * i)
                for i, (prompt, sampling) in enumerate(zip(prompts[1:], others, strict=True))
            ),
        )
        await engine.aclose()
        return results, engine.max_batch_seen

    single = run(alone())
    batched, widest = run(together())
    assert widest == 8
    assert batched[0].token_ids == single.token_ids and len(single.token_ids) == 24
    assert max(abs(a - b) for a, b in zip(batched[0].logprobs, single.logprobs, strict=True)) <= 1e-5


SAMPLINGS = [
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(temperature=0.6, top_k=50, seed=2),
    SamplingParams(temperature=1.2, top_p=0.9, seed=3),
    SamplingParams(temperature=0.8, top_k=300, top_p=0.7, seed=4),
    SamplingParams(temperature=1.0, seed=5),
]


def _truncated_probabilities(row: torch.Tensor, sampling: SamplingParams) -> np.ndarray:
    """The row's distribution after top-k then top-p, written out independently of the engine."""
    values = row.double().numpy()
    keep = np.ones(values.shape, dtype=bool)
    if sampling.top_k and sampling.top_k < values.size:
        keep &= values >= np.sort(values)[-sampling.top_k]
    if sampling.top_p < 1.0:
        order = np.argsort(-np.where(keep, values, -np.inf), kind="stable")
        weights = np.exp(np.where(keep, values, -np.inf)[order] - values[keep].max())
        weights /= weights.sum()
        before = np.cumsum(weights) - weights  # mass of the ids ranked above each one
        dropped = order[before >= sampling.top_p]
        keep[dropped] = False
    weights = np.where(keep, np.exp(values - values[keep].max()), 0.0)
    return weights / weights.sum()


@pytest.mark.parametrize(
    "rows", [[0, 2, 3, 4, 6], [0, 1, 2, 3, 4]], ids=["some-rows-greedy", "all-rows-drawn"]
)
def test_batched_draws_are_each_rows_own_inverse_cdf_draw(rows):
    """Every row gets the id its own generator's uniform picks on its own tempered, truncated
    distribution (the first id whose cumulative probability exceeds it), whatever else is in the batch."""
    from types import SimpleNamespace

    vocabulary = 4096
    ours = [SimpleNamespace(sampling=s, generator=torch.Generator().manual_seed(s.seed)) for s in SAMPLINGS]
    theirs = [torch.Generator().manual_seed(s.seed) for s in SAMPLINGS]
    logits_source = torch.Generator().manual_seed(0)
    distinct = 0
    for _ in range(40):
        width = max(rows) + 1  # rows not listed are greedy rows, not drawn
        logits = torch.randn(width, vocabulary, generator=logits_source) * 4
        temperatures = torch.ones(width, 1)
        temperatures[rows] = torch.tensor([s.temperature for s in SAMPLINGS]).unsqueeze(1)
        logprobs = torch.log_softmax(logits / temperatures, dim=-1)
        before = logprobs.clone()
        drawn = LocalEngine._draw(ours, logprobs, rows)
        expected = []
        for row, sampling, generator in zip(rows, SAMPLINGS, theirs, strict=True):
            probabilities = _truncated_probabilities(logprobs[row], sampling)
            uniform = float(torch.rand(1, dtype=torch.float64, generator=generator))
            expected.append(int(np.searchsorted(np.cumsum(probabilities), uniform, side="right")))
            assert probabilities[drawn[len(expected) - 1]] > 0  # never a truncated id
        assert drawn == expected
        assert torch.equal(logprobs, before)  # the stored logprobs stay those of the whole distribution
        distinct += len(set(drawn))
    assert distinct > 40  # the draws vary


def test_draws_follow_the_distribution_and_never_pick_truncated_ids():
    """20,000 draws from a known 6-id distribution land on each id at its probability (within 5
    standard deviations), and with top_k=3 only the three likeliest ids ever come out."""
    from types import SimpleNamespace

    probabilities = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    logprobs = probabilities.log().unsqueeze(0)
    draws = 20_000
    for sampling, allowed in (
        (SamplingParams(temperature=1.0, seed=7), probabilities),
        (SamplingParams(temperature=1.0, top_k=3, seed=8), torch.tensor([0.4, 0.25, 0.15, 0, 0, 0]) / 0.8),
    ):
        request = SimpleNamespace(sampling=sampling, generator=torch.Generator().manual_seed(sampling.seed))
        drawn = [LocalEngine._draw([request], logprobs, [0])[0] for _ in range(draws)]
        counts = np.bincount(drawn, minlength=6)
        expected = allowed.double().numpy() * draws
        spread = np.sqrt(expected * (1 - allowed.double().numpy())) + 1e-9
        assert np.all(np.abs(counts - expected) <= 5 * spread), (counts, expected)
        assert np.all(counts[expected == 0] == 0)


def test_stop_ids_context_and_cancellation(random_qwen3):
    engine = LocalEngine(random_qwen3, context_length=64)
    prompt = list(range(1000, 1040))

    async def main():
        first = await engine.generate(prompt, SamplingParams(temperature=0), max_new_tokens=5)
        stop = first.token_ids[2]
        stopped = await engine.generate(
            prompt, SamplingParams(temperature=0, stop_token_ids=(stop,)), max_new_tokens=5
        )
        capped = await engine.generate(prompt, SamplingParams(temperature=0), max_new_tokens=100)
        with pytest.raises(ContextLengthError):
            await engine.generate(list(range(64)), SamplingParams(), max_new_tokens=5)
        slow = asyncio.ensure_future(
            engine.generate(prompt[:10], SamplingParams(temperature=0), max_new_tokens=50)
        )
        await asyncio.sleep(0.05)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        after = await engine.generate(prompt, SamplingParams(temperature=0), max_new_tokens=5)
        await engine.aclose()
        return first, stopped, capped, after, stop

    first, stopped, capped, after, stop = run(main())
    assert (
        stopped.finish_reason == "stop"
        and stopped.token_ids == first.token_ids[: first.token_ids.index(stop) + 1]
    )
    assert capped.finish_reason == "length" and len(prompt) + len(capped.token_ids) == 64
    assert after.token_ids == first.token_ids  # a cancelled request leaves the engine healthy


def test_sampling_params_and_the_token_budget_are_validated(random_qwen3):
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": -2}):
        with pytest.raises(ConfigError):
            SamplingParams(**bad)
    engine = LocalEngine(random_qwen3)
    for budget in (0, -3, True, 2.5):
        with pytest.raises(ConfigError, match="max_new_tokens"):
            run(engine.generate([1, 2, 3], SamplingParams(temperature=0), max_new_tokens=budget))
    engine.close()


@pytest.mark.filterwarnings("error::FutureWarning")
def test_the_engine_uses_the_cache_argument_its_transformers_names(random_qwen3):
    """transformers 5.2x renamed ``past_key_values`` to ``cache`` (the old name warns, then goes in 5.40):
    a warning in the scheduler would crash the engine here, on every version CI and users install."""
    engine = LocalEngine(random_qwen3)
    first_prompt = list(range(100, 140))

    async def main():
        greedy = SamplingParams(temperature=0.0)
        first = await engine.generate(first_prompt, greedy, max_new_tokens=8)
        return await engine.generate(first_prompt + first.token_ids + [5, 6, 7], greedy, max_new_tokens=8)

    try:
        second = run(main())
    finally:
        engine.close()
    assert second.metrics["prompt_cached_tokens"] > 0  # the cached-prefix path ran too
