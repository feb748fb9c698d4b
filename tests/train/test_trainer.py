"""The whole loop on a tiny random Qwen3: it learns, it measures its own consistency, it resumes exactly."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from train_toy_env import BrokenRewards, FirstToken, KilledAfter, SimulatedKill, save_toy_model

from agentboost.rollout.results import read_results
from agentboost.train.config import config_from_dict
from agentboost.train.logging import read_metrics
from agentboost.train.trainer import Trainer


@pytest.fixture(scope="module")
def toy_model_dir(qwen_tokenizer, tmp_path_factory):
    """The toy task's tiny Qwen3 (:func:`train_toy_env.save_toy_model`), saved once for the module."""
    return save_toy_model(tmp_path_factory.mktemp("tiny-qwen3"), qwen_tokenizer)


@pytest.fixture(scope="module")
def line_break(qwen_tokenizer) -> int:
    (token,) = qwen_tokenizer.encode("\n", add_special_tokens=False)
    return token


def toy_config(model_dir, output_dir, **sections):
    data = {
        "model": {"name_or_path": str(model_dir)},
        "environment": {"train_tasks": 16},
        "rollout": {"tasks_per_step": 4, "group_size": 8, "temperature": 1.0},
        "optimizer": {"lr": 1e-2},
        "eval": {"every": 0, "tasks": 16, "samples": 4, "temperature": 1.0},
        "checkpoint": {"every": 1, "save_final_model": False},
        "logging": {"progress": False},
        "steps": 2,
        "seed": 0,
        "output_dir": str(output_dir),
    }
    for section, values in sections.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    return config_from_dict(data)


def test_a_tiny_model_learns_the_toy_task(toy_model_dir, line_break, tmp_path):
    config = toy_config(toy_model_dir, tmp_path / "run", steps=12, eval={"every": 12})
    summary = Trainer(config, environment=FirstToken(line_break)).train()

    before, after = summary.eval_rewards[0], summary.eval_rewards[12]
    assert before < 0.4, f"the untrained model already scores {before}"  # ~0.14
    assert after > 0.9, f"held-out reward went {before:.3f} -> {after:.3f}"

    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(12))
    # same weights, float32, CPU: the trainer's recomputation matches the engine's logprobs
    assert max(r["mismatch/logprob_abs_diff"] for r in train) < 1e-4
    assert max(r["mismatch/kl"] for r in train) < 1e-6
    assert all(r["optim/updates"] in (0, 1) for r in train)
    if Path("/proc/self/status").exists():  # the process's peak memory never falls, and holds the model
        peaks = [(r["memory/peak_after_rollouts_gib"], r["memory/peak_gib"]) for r in train]
        assert all(0 < after_rollouts <= after_update for after_rollouts, after_update in peaks)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(peaks))
        assert all(0 < r["memory/resident_gib"] <= r["memory/peak_gib"] for r in train)
    assert (tmp_path / "run" / "reward_curve.png").stat().st_size > 0
    assert any((tmp_path / "run" / "tensorboard").iterdir())


def test_a_killed_run_resumes_to_the_same_state_as_an_uninterrupted_one(toy_model_dir, line_break, tmp_path):
    sections = {"rollout": {"tasks_per_step": 4, "group_size": 4}, "optimizer": {"lr": 1e-3}}

    uninterrupted = Trainer(
        toy_config(toy_model_dir, tmp_path / "a", **sections), environment=FirstToken(line_break)
    )
    uninterrupted.train()

    # the second run dies in step 1's collection: after the checkpoint of step 0's update, with only
    # some of step 1's 16 rollouts written
    killed = Trainer(
        toy_config(toy_model_dir, tmp_path / "b", **sections), environment=KilledAfter(line_break, calls=20)
    )
    with pytest.raises(SimulatedKill):
        killed.train()
    assert [path.name for path in killed.checkpoints()] == ["step_000001"]
    assert 0 < len(list(read_results(tmp_path / "b" / "rollouts" / "step_000001.jsonl"))) < 16

    resumed = Trainer(
        toy_config(toy_model_dir, tmp_path / "b", **sections), environment=FirstToken(line_break)
    )
    resumed.train()
    assert resumed.resumed_from == 1

    for (name, expected), (_, actual) in zip(
        uninterrupted.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert torch.equal(expected, actual), name
    expected_state = uninterrupted.optimizer.state_dict()["state"]
    actual_state = resumed.optimizer.state_dict()["state"]
    assert expected_state.keys() == actual_state.keys()
    for key in expected_state:
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(expected_state[key][field], actual_state[key][field]), (key, field)
    # the same rollouts, the same metrics, step by step
    for step in (0, 1):
        a = sorted(
            (r.task_id, r.sample, r.trajectory.token_ids)
            for r in read_results(tmp_path / "a" / "rollouts" / f"step_{step:06d}.jsonl")
        )
        b = sorted(
            (r.task_id, r.sample, r.trajectory.token_ids)
            for r in read_results(tmp_path / "b" / "rollouts" / f"step_{step:06d}.jsonl")
        )
        assert a == b

    def train_records(run):
        records = [r for r in read_metrics(tmp_path / run / "metrics.jsonl") if r["kind"] == "train"]
        return [
            {
                k: v
                for k, v in r.items()
                if not k.startswith(("time", "memory/")) and "per_second" not in k and "prefix_cache" not in k
            }  # speed figures depend on timing (which requests the engine admits together); memory
            # figures on the process (a resumed one has not lived through the first steps)
            for r in records
        ]

    # The engine's logprobs (what mismatch/* compares against the trainer's) depend on which prompt prefix
    # its cache held, which a restart empties: equal to fp32 rounding, not bit for bit. Everything the
    # update reads is exact (the weights and optimizer state above are bit-identical).
    exact = [{k: v for k, v in r.items() if not k.startswith("mismatch/")} for r in train_records("a")]
    assert exact == [
        {k: v for k, v in r.items() if not k.startswith("mismatch/")} for r in train_records("b")
    ]
    for a, b in zip(train_records("a"), train_records("b"), strict=True):
        for key in (k for k in a if k.startswith("mismatch/")):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
    assert [r["optim/updates"] for r in train_records("b")] == [1, 1]  # both steps really updated
    state = json.loads((tmp_path / "b" / "checkpoints" / "step_000002" / "state.json").read_text())
    assert state["step"] == 2 and state["tasks_consumed"] == 8


def test_lora_kl_minibatches_and_importance_correction_run_together(toy_model_dir, line_break, tmp_path):
    config = toy_config(
        toy_model_dir,
        tmp_path / "lora",
        steps=1,
        lora={"enabled": True, "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        algorithm={
            "kl_coef": 0.1,
            "mini_batches": 2,
            "epochs": 2,
            "tis_cap": 2.0,
            "loss_aggregation": "sequence_mean",
            "advantage": "rloo",
            "drop_zero_signal_groups": False,
        },
        optimizer={"lr": 1e-3, "micro_batch_tokens": 64},
        checkpoint={"every": 1, "save_final_model": True},
    )
    trainer = Trainer(config, environment=FirstToken(line_break))
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    trainer.train()

    (record,) = [r for r in read_metrics(tmp_path / "lora" / "metrics.jsonl") if r["kind"] == "train"]
    assert record["optim/updates"] == 4  # 2 epochs x 2 mini-batches
    assert record["batch/micro_batches"] > 1  # the token budget forced gradient accumulation
    assert record["mismatch/logprob_abs_diff"] < 1e-4  # recomputed before the first update
    assert 0.99 < record["mismatch/tis_weight_mean"] <= 1.01
    assert record["policy/kl_ref"] >= 0
    for name, value in base_before.items():  # only the adapters train; the base is the reference
        assert torch.equal(value, dict(trainer.model.named_parameters())[name]), name
    saved = torch.load(tmp_path / "lora" / "checkpoints" / "step_000001" / "model.pt")
    assert saved and all("lora_" in name for name in saved)
    assert (tmp_path / "lora" / "final" / "adapter_config.json").exists()


def test_a_time_limit_stops_after_the_current_step_with_a_checkpoint(toy_model_dir, line_break, tmp_path):
    config = toy_config(toy_model_dir, tmp_path / "timed", steps=50, time_limit_minutes=1e-6)
    summary = Trainer(config, environment=FirstToken(line_break)).train()
    assert summary.steps == 1
    assert sorted(path.name for path in (tmp_path / "timed" / "checkpoints").iterdir()) == ["step_000001"]


def test_a_group_with_unscored_members_masks_them_and_too_many_failures_stop_the_run(
    toy_model_dir, line_break, tmp_path
):
    from agentboost.errors import TooManyFailuresError
    from agentboost.train import algorithms

    config = toy_config(toy_model_dir, tmp_path / "run", steps=1)
    trainer = Trainer(config, environment=FirstToken(line_break))
    task_ids = [task.id for task in trainer.tasks_for_step(0)]
    environment = BrokenRewards(line_break, buggy={task_ids[0]}, down={task_ids[0], task_ids[1]})
    trainer = Trainer(config, environment=environment)
    results = trainer.collect(0)
    samples, metrics = trainer.make_samples(results)
    # three members masked (one reward bug, two unscorable), never scored 0: 32 - 3 samples remain
    assert len(samples) == 29
    assert (metrics["rollout/failed"], metrics["rollout/failed/reward_error"]) == (1.0, 1.0)
    assert (metrics["rollout/unscorable"], metrics["rollout/scored"]) == (2.0, 29.0)
    assert metrics["rollout/coverage"] == pytest.approx(29 / 32)
    assert metrics["groups/with_unscored"] == 2.0
    scored = [r.reward for r in results if r.reward is not None]
    assert metrics["reward/mean"] == pytest.approx(sum(scored) / len(scored))  # over scored rollouts
    # task 0's group statistics are over its six scored members only
    group = [r for r in results if r.task_id == task_ids[0] and r.reward is not None]
    assert len(group) == 6
    expected = algorithms.compute_advantages(
        torch.tensor([r.reward for r in group]), torch.zeros(6, dtype=torch.long), "grpo", normalize_std=True
    )
    got = [s.advantage for s in samples if s.group == 0]
    assert got == pytest.approx(expected.tolist(), abs=1e-6)

    everything_broken = BrokenRewards(line_break, buggy=set(task_ids), down=set())
    strict = toy_config(toy_model_dir, tmp_path / "strict", steps=1, rollout={"max_failed_fraction": 0.1})
    with pytest.raises(TooManyFailuresError, match=r"4 of 32 rollouts of the step failed \(reward_error 4\)"):
        Trainer(strict, environment=everything_broken).train()
