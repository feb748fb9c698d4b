"""The training step's words on the progress bar and the closing line: updates, loss, KL, grad norm,
and why a step made no update."""

from __future__ import annotations

import json

from agentboost.train.logging import read_metrics, step_line, steps_line


def test_a_step_that_updated_shows_updates_loss_kl_and_grad_norm():
    line = step_line(
        {
            "reward/mean": 0.5,
            "optim/updates": 2.0,
            "policy/loss": -0.0123,
            "policy/approx_kl": 0.00031,
            "policy/kl_ref": 0.002,
            "optim/grad_norm": 0.42,
            "groups/zero_signal_fraction": 0.5,
        }
    )
    assert line == "reward 0.500 | 2 updates | loss -0.0123 | kl 2.00e-03 | grad 0.420"


def test_a_step_without_updates_says_every_group_had_zero_signal():
    line = step_line({"reward/mean": 0.0, "optim/updates": 0.0, "groups/zero_signal_fraction": 1.0})
    assert line.startswith("reward 0.000 | 0 updates: every group had zero signal")
    assert "loss" not in line


def test_the_closing_line_counts_the_steps_that_made_no_update(tmp_path):
    records = [
        {"step": 0, "kind": "eval", "eval/reward_mean": 0.0},
        {
            "step": 0,
            "kind": "train",
            "reward/mean": 0.0,
            "optim/updates": 0.0,
            "groups/zero_signal_fraction": 1.0,
        },
        {
            "step": 1,
            "kind": "train",
            "reward/mean": 0.25,
            "optim/updates": 1.0,
            "policy/loss": 0.1,
            "policy/approx_kl": 0.0,
            "optim/grad_norm": 1.5,
        },
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    line = steps_line(read_metrics(path))
    assert line == (
        "last step: reward 0.250 | 1 update | loss 0.1000 | kl 0.00e+00 | grad 1.500 "
        "| 1 of 2 steps made no update (see groups/zero_signal_fraction)"
    )
    assert steps_line(records[:1]) is None
