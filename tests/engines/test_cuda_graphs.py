"""Graphed decode steps (engines/embedded/cuda_graphs.py): what a CPU can check of them.

The capture itself needs a CUDA GPU and is unverified (docs/engines.md). Here: the buckets, the switch
(off by default; a typed error off CUDA), and the padded, full-capacity step run eagerly
(``capture=False``) against the ordinary one: padding rows never change a real row's ids or logprobs.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from conftest import tiny_qwen3

from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.cuda_graphs import DEFAULT_BUCKETS, DecodeGraphs, bucket_for, check_buckets
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.errors import ConfigError
from agentboost.models.precision import Precision


@pytest.mark.parametrize(
    ("rows", "bucket"),
    [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (9, 16), (33, 64), (64, 64), (65, None), (500, None)],
)
def test_a_batch_runs_in_the_smallest_bucket_that_holds_it_and_eagerly_past_the_largest(rows, bucket):
    assert bucket_for(rows, DEFAULT_BUCKETS) == bucket
    assert DecodeGraphs((4, 2), capture=False).bucket_for(3) == 4


@pytest.mark.parametrize("buckets", [(), (0, 4), (2, -1), (2.5,), (True,)])
def test_bad_buckets_are_config_errors(buckets):
    with pytest.raises(ConfigError, match="positive batch sizes"):
        check_buckets(buckets)


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(seed=4)


def test_the_switch_is_off_by_default_and_a_config_error_without_a_gpu(model):
    engine = LocalEngine(model)
    try:
        assert engine._graphs is None
    finally:
        engine.close()
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the switch is allowed")
    with pytest.raises(ConfigError, match="cuda_graphs needs a model on a CUDA GPU; this one is on cpu"):
        LocalEngine(model, cuda_graphs=True)


PROMPTS = [list(range(100, 100 + n)) for n in (7, 19, 12)]


def generate_all(engine: LocalEngine, samplings: list[SamplingParams], max_new_tokens: int) -> list:
    async def go():
        return await asyncio.gather(
            *(
                engine.generate(prompt, sampling, max_new_tokens=max_new_tokens + index)
                for index, (prompt, sampling) in enumerate(zip(PROMPTS, samplings, strict=True))
            )
        )

    return asyncio.run(go())


@pytest.mark.parametrize(
    "precision",
    [None, Precision(weights=torch.float32, compute=torch.bfloat16, device_type="cpu")],
    ids=["float32", "bfloat16-compute"],
)
def test_padding_rows_never_change_the_real_rows_ids_or_logprobs(model, precision):
    """Three rows of different lengths and stops (rows leave mid-run: the batch re-packs into a smaller
    bucket), greedy and seeded: the padded full-capacity step gives the ordinary step's ids and logprobs."""
    samplings = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, seed=11),
        SamplingParams(temperature=0.7, top_k=50, seed=12),
    ]
    outcomes = []
    for graphs in (None, DecodeGraphs((2, 4, 8), capture=False)):
        # transformers' forward on both sides: a graphed step never takes the CPU-only direct forward
        engine = LocalEngine(model, direct_forward=False, precision=precision, max_batch_size=8)
        engine._graphs = graphs
        try:
            outcomes.append(generate_all(engine, samplings, max_new_tokens=12))
            if graphs is not None:
                assert graphs.padded_steps >= 12 and graphs.captures == 0
                assert engine.prefix_cache_stats().entries > 0  # finished rows' KV went to the cache
        finally:
            engine.close()
    eager, padded = outcomes
    for plain, graphed in zip(eager, padded, strict=True):
        assert graphed.token_ids == plain.token_ids
        assert graphed.logprobs == pytest.approx(plain.logprobs, abs=1e-6)
