"""Settings from YAML and the command line; training tensors from Trajectories."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import torch

from agentboost.envs.base import RolloutResult
from agentboost.errors import ConfigError
from agentboost.tokens.trajectory import Segment, TerminationReason, Trajectory
from agentboost.train.batching import bucket_by_length, collate, micro_batches, sample_from_result
from agentboost.train.cli import register_train_command
from agentboost.train.config import TrainConfig, load_config

# --- config ----------------------------------------------------------------------------------------


def test_yaml_then_dotted_overrides_typed_by_the_dataclass(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(
        "optimizer:\n  lr: 1e-5\nrollout:\n  group_size: 4\nenvironment:\n  kwargs: {difficulty: 1}\n"
    )
    config = load_config(
        path,
        [
            "optimizer.lr=3e-5",
            "lora.enabled=true",
            "algorithm.tis_cap=2",
            "eval.max_new_tokens=null",
            "steps=7",
        ],
    )
    assert config.optimizer.lr == 3e-5 and isinstance(config.optimizer.lr, float)
    assert config.rollout.group_size == 4
    assert config.lora.enabled is True
    assert config.algorithm.tis_cap == 2.0
    assert config.environment.kwargs == {"difficulty": 1}
    assert config.steps == 7
    assert load_config(path).optimizer.lr == 1e-5  # YAML reads "1e-5" as a string: still a float here


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optimizer.learning_rate=1", "unknown setting 'optimizer.learning_rate'"),
        ("optimiser.lr=1", "unknown setting 'optimiser'; did you mean 'optimizer'"),
        ("rollout.group_size=many", "rollout.group_size must be an integer"),
        ("algorithm.advantage=ppo", "algorithm.advantage must be one of grpo, rloo, reinforce_pp"),
        ("lora.enabled=maybe", "lora.enabled must be true or false"),
        ("rollout.group_size=1", "group_size must be >= 2"),
        ("rollout.engine_memory_gib=nan", "rollout.engine_memory_gib must be a finite number"),
        ("rollout.engine_memory_gib=inf", "rollout.engine_memory_gib must be a finite number"),
        ("rollout.engine_memory_gib=-1", "rollout.engine_memory_gib must be a finite number of GiB > 0"),
        ("rollout.engine_memory_gib=lots", "rollout.engine_memory_gib must be a number"),
        ("steps", "not of the form key=value"),
        ("steps.x=1", "'steps' is a value, not a section"),
    ],
)
def test_bad_settings_are_typed_errors_that_say_what_to_do(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        # a value first set as a scalar then used as a section is caught too
        load_config(None, ["steps=3", override] if override.startswith("steps.") else [override])


def test_the_train_command_parses_overrides(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="agentboost")
    register_train_command(parser.add_subparsers(dest="command"))
    config = tmp_path / "c.yaml"
    config.write_text("steps: 3\n")
    args = parser.parse_args(["train", str(config), "rollout.temperature=0.7", "--print-config"])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["steps"] == 3 and printed["rollout"]["temperature"] == 0.7
    assert printed["optimizer"] == TrainConfig().to_dict()["optimizer"]


def test_the_train_command_takes_overrides_without_a_config_file(capsys):
    parser = argparse.ArgumentParser(prog="agentboost")
    register_train_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", "steps=3", "rollout.temperature=0.7", "--print-config"])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["steps"] == 3 and printed["rollout"]["temperature"] == 0.7


def test_the_example_config_loads():
    config = load_config(Path(__file__).parents[2] / "examples" / "arithmetic" / "train.yaml")
    assert config.environment.name == "arithmetic"


# --- batching --------------------------------------------------------------------------------------


def result_of(ids, mask, reward=1.0):
    logprobs = [-0.5 - 0.1 * i if m else None for i, m in enumerate(mask)]
    trajectory = Trajectory(
        task_id="t",
        messages=[],
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        segments=[Segment("prompt", 0, mask.index(1), 0), Segment("assistant", mask.index(1), len(ids), 0)],
        termination=TerminationReason.COMPLETED,
    )
    return RolloutResult("t", 0, trajectory, reward)


def test_a_sample_predicts_each_token_from_the_ones_before_it():
    # prompt 10 11 | generated 12 13 | tool 14 | generated 15
    sample = sample_from_result(
        result_of([10, 11, 12, 13, 14, 15], [0, 0, 1, 1, 0, 1]), index=0, group=0, advantage=1
    )
    assert sample.input_ids.tolist() == [10, 11, 12, 13, 14]
    assert sample.target_ids.tolist() == [11, 12, 13, 14, 15]
    assert sample.loss_mask.tolist() == [False, True, True, False, True]
    torch.testing.assert_close(sample.rollout_logprobs, torch.tensor([0.0, -0.7, -0.8, 0.0, -1.0]))


def test_collate_right_pads_and_masks_padding():
    short = sample_from_result(result_of([1, 2, 3], [0, 1, 1]), index=0, group=0, advantage=0.5)
    long = sample_from_result(result_of([1, 2, 3, 4, 5], [0, 0, 1, 1, 1]), index=1, group=0, advantage=-0.5)
    batch = collate([short, long], pad_id=99)
    assert batch.input_ids.tolist() == [[1, 2, 99, 99], [1, 2, 3, 4]]
    assert batch.attention_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch.loss_mask.tolist() == [[True, True, False, False], [False, True, True, True]]
    assert batch.advantages.tolist() == [0.5, -0.5]
    assert batch.padded_tokens == 8 and batch.real_tokens == 6


def test_bucketing_keeps_similar_lengths_together_within_the_budget():
    lengths = [10, 90, 12, 88, 11, 300]
    buckets = bucket_by_length(lengths, max_tokens=200)
    assert buckets == [[5], [1, 3], [2, 4, 0]]  # 300 alone (over budget); 2 x 90; 3 x 12
    for bucket in buckets[1:]:
        assert len(bucket) * max(lengths[i] for i in bucket) <= 200
    samples = [
        sample_from_result(result_of(list(range(n + 1)), [0] + [1] * n), index=i, group=0, advantage=0)
        for i, n in enumerate(lengths)
    ]
    batches = micro_batches(samples, max_tokens=200)
    padding = 1 - sum(b.real_tokens for b in batches) / sum(b.padded_tokens for b in batches)
    assert padding < 0.02  # one batch of all six would be 1 - 511 / 1800 = 72% padding


def test_logged_rollout_metrics_average_scored_rollouts_and_count_the_rest():
    from results_support import coding_fixture

    from agentboost.train.collect import result_metrics

    # rewards 1, 0, 0, 1, failed (engine error), 0; rollouts a/0, b/0, b/1 and c/1 call a tool
    metrics = result_metrics(coding_fixture())
    assert metrics["reward_mean"] == pytest.approx(2 / 5)  # one definition: over the scored rollouts
    assert metrics["reward_std"] == pytest.approx(math.sqrt((2 * (3 / 5) ** 2 + 3 * (2 / 5) ** 2) / 4))
    assert (metrics["scored"], metrics["failed"], metrics["unscorable"]) == (5.0, 1.0, 0.0)
    assert metrics["failed/engine_error"] == 1.0 and metrics["coverage"] == pytest.approx(5 / 6)
    assert metrics["tool_use_rate"] == pytest.approx(4 / 6)
    assert math.isnan(result_metrics([])["reward_mean"])  # no scored rollout: no mean, not 0
