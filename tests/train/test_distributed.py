"""Data-parallel training (agentboost/train/distributed.py): two gloo ranks started by the real command
(`agentboost train ... --nproc 2`, i.e. torchrun, on loopback) train as one process does.

One process trains 3 steps of the toy task in-process. Two ranks train 2 steps, then are started again
with steps=3 and resume from the checkpoint of step 2 (both ranks load it). After each the ranks'
weights match the single process's within 1e-6, the step metrics match, the results files hold the
same rollouts, and the run directory holds exactly what one process writes (rank 0 alone writes).
The ranks compare a checksum of their weights after every step (AGENTBOOST_CHECK_RANKS_EVERY=1).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_toy_env import save_toy_model

from agentboost.rollout.results import read_header, read_results
from agentboost.train.config import load_config
from agentboost.train.distributed import Ranks
from agentboost.train.logging import read_metrics
from agentboost.train.trainer import Trainer

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
LAYOUT = (
    "time/",
    "memory/",
    "rollout/tokens_per_second",
    "rollout/prefix_cache",
    "batch/padding",
    "batch/micro",
)
"""Metrics of timing, memory and of how samples were cut into micro-batches: not the same by design."""


@pytest.fixture(scope="module")
def model_dir(qwen_tokenizer, tmp_path_factory):
    return save_toy_model(tmp_path_factory.mktemp("tiny-qwen3"), qwen_tokenizer)


def settings(model_dir: Path, steps: int, output_dir: Path) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        "environment.name=train_toy_env:FirstToken",
        "environment.kwargs={target_id: 198}",
        "environment.train_tasks=16",
        "rollout.tasks_per_step=4",
        "rollout.group_size=4",
        "rollout.temperature=1.0",
        "optimizer.lr=1e-3",
        "eval.every=0",
        "checkpoint.every=1",
        "checkpoint.keep=3",
        "checkpoint.resume=true",
        "checkpoint.save_final_model=false",
        "logging.progress=false",
        f"steps={steps}",
        f"output_dir={output_dir}",
    ]


def train_ranks(*overrides: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    pythonpath = os.pathsep.join(
        [str(ROOT), str(TESTS), str(TESTS / "train"), os.environ.get("PYTHONPATH", "")]
    )
    return subprocess.run(
        [sys.executable, "-m", "agentboost.cli", "train", *overrides, "--nproc", "2"],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={
            **os.environ,
            "PYTHONPATH": pythonpath,
            "HF_HUB_OFFLINE": "1",
            "AGENTBOOST_CHECK_RANKS_EVERY": "1",
            "OMP_NUM_THREADS": "1",
        },
    )


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / f"step_{step:06d}" / "model.pt", map_location="cpu")


def assert_same_weights(a: Path, b: Path, step: int) -> None:
    expected, actual = weights(a, step), weights(b, step)
    assert expected.keys() == actual.keys()
    differences = {name: float((expected[name] - actual[name]).abs().max()) for name in expected}
    print(f"step {step}: largest weight difference {max(differences.values()):.1e}")  # pytest -s
    for name, difference in differences.items():
        assert difference <= 1e-6, (step, name, difference)


def train_records(run: Path) -> list[dict[str, float]]:
    return [
        {k: v for k, v in r.items() if k != "time" and not k.startswith(LAYOUT)}
        for r in read_metrics(run / "metrics.jsonl")
        if r["kind"] == "train"
    ]


def files(run: Path) -> set[str]:
    """The run directory's files (TensorBoard's: its one events file, whose name holds host and time)."""
    found = set()
    for path in run.rglob("*"):
        if path.is_file():
            relative = path.relative_to(run)
            found.add("tensorboard/events" if relative.parts[0] == "tensorboard" else str(relative))
    return found


@pytest.mark.slow
def test_two_gloo_ranks_train_as_one_process_and_resume_together(model_dir, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    Trainer(load_config(None, settings(model_dir, 3, one))).train()

    first = train_ranks(*settings(model_dir, 2, two), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    assert first.stdout.count("trained 2 steps") == 1  # rank 0 reports
    for step in (1, 2):
        assert_same_weights(one, two, step)

    second = train_ranks(*settings(model_dir, 3, two), cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    assert second.stderr.count("from step_000002 (step 2)") == 2, second.stderr[-4000:]  # both ranks
    assert_same_weights(one, two, 3)

    # the same steps: every metric of the rollouts and advantages exactly, the update's to rounding
    expected, actual = train_records(one), train_records(two)
    assert [r["step"] for r in actual] == [0, 1, 2]
    for a, b in zip(expected, actual, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key.startswith(("policy/", "optim/", "mismatch/")):
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
            else:
                assert b[key] == a[key], (a["step"], key)
    assert {r["optim/updates"] for r in actual} == {1.0}  # every step really updated
    # the same rollouts, in the same order, under the same header
    for step in range(3):
        path = f"rollouts/step_{step:06d}.jsonl"
        assert read_header(two / path) == read_header(one / path)
        assert [
            (r.task_id, r.sample, r.trajectory.token_ids, r.reward) for r in read_results(two / path)
        ] == [(r.task_id, r.sample, r.trajectory.token_ids, r.reward) for r in read_results(one / path)]
    assert files(two) == files(one)  # rank 1 wrote nothing; no partial rollout files are left


def test_shares_are_contiguous_cover_every_item_once_and_keep_one_process_whole():
    for world_size in (1, 2, 3, 4):
        for count in (0, 1, 4, 5, 7):
            shares = [Ranks(rank=r, world_size=world_size).share(count) for r in range(world_size)]
            assert [i for share in shares for i in share] == list(range(count))
            assert max(map(len, shares)) - min(map(len, shares)) <= 1
    alone = Ranks()
    assert alone.writes and not alone.distributed and alone.any(True) and alone.gather(3) == [3]
    assert alone.combine({"loss": 1.5}) == {"loss": 1.5}


def test_a_rank_count_below_one_is_one_line(tmp_path, capsys):
    from agentboost.cli import main

    assert main(["train", f"output_dir={tmp_path / 'run'}", "--nproc", "0"]) == 2
    assert "--nproc 0: the number of training ranks is at least 1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
