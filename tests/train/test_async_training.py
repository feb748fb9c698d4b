"""Asynchronous training (agentboost/train/async_collect.py): equivalence, the staleness bound, whole
groups, partial rollouts, resume."""

from __future__ import annotations

import pytest
import torch
from test_trainer import toy_config
from train_toy_env import FirstToken, save_toy_model

from agentboost.rollout.results import read_results
from agentboost.train.logging import read_metrics
from agentboost.train.trainer import Trainer


@pytest.fixture(scope="module")
def toy_model(qwen_tokenizer, tmp_path_factory):
    return save_toy_model(tmp_path_factory.mktemp("tiny-qwen3"), qwen_tokenizer)


@pytest.fixture(scope="module")
def target(qwen_tokenizer) -> int:
    """The toy task's target: the line-break token."""
    (token,) = qwen_tokenizer.encode("\n", add_special_tokens=False)
    return token


def rollouts(run_dir, step):
    return sorted(
        (r.task_id, r.sample, r.trajectory.token_ids, r.reward)
        for r in read_results(run_dir / "rollouts" / f"step_{step:06d}.jsonl")
    )


def logprobs(run_dir, step):
    found = sorted(
        (r.task_id, r.sample, [p for p in r.trajectory.logprobs if p is not None])
        for r in read_results(run_dir / "rollouts" / f"step_{step:06d}.jsonl")
    )
    return [value for *_, values in found for value in values]


def test_max_staleness_0_through_the_async_path_is_the_synchronous_trainer_bit_for_bit(
    toy_model, target, tmp_path
):
    sections = {"rollout": {"tasks_per_step": 4, "group_size": 4}, "optimizer": {"lr": 1e-2}, "steps": 2}
    synchronous = Trainer(
        toy_config(toy_model, tmp_path / "sync", **sections), environment=FirstToken(target)
    )
    synchronous.train()
    sections["rollout"] = {**sections["rollout"], "asynchronous": True, "max_staleness": 0}
    asynchronous = Trainer(
        toy_config(toy_model, tmp_path / "async", **sections), environment=FirstToken(target)
    )
    asynchronous.train()

    for (name, expected), (_, actual) in zip(
        synchronous.model.named_parameters(), asynchronous.model.named_parameters(), strict=True
    ):
        assert torch.equal(expected, actual), name
    for step in range(2):
        assert rollouts(tmp_path / "sync", step) == rollouts(tmp_path / "async", step)
        # the engine's own logprobs depend on which requests it batched together (timing): equal to
        # float32 rounding; the update reads the trainer's, so the weights above are bit for bit
        assert logprobs(tmp_path / "async", step) == pytest.approx(
            logprobs(tmp_path / "sync", step), abs=1e-5
        )
        # every generated token carries the version that made it: step s's rollouts ran on version s
        for result in read_results(tmp_path / "async" / "rollouts" / f"step_{step:06d}.jsonl"):
            assert result.trajectory.weight_versions == [step]
    train = [r for r in read_metrics(tmp_path / "async" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["async/staleness_0"] for r in train] == [16.0, 16.0]
    assert [r["async/dropped_groups"] for r in train] == [0.0, 0.0]

    def comparable(run):  # what the update did; timing, memory and the engine's logprobs aside
        return [
            {
                k: v
                for k, v in r.items()
                if k.startswith(("policy/", "optim/", "reward/", "batch/", "groups/"))
            }
            for r in read_metrics(tmp_path / run / "metrics.jsonl")
            if r["kind"] == "train"
        ]

    assert comparable("sync") == comparable("async")
    assert sum(r["optim/updates"] for r in train) >= 1  # the weights really moved
