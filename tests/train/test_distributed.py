"""Data-parallel training (agentboost/train/distributed.py): two gloo ranks started by the real command
(`agentboost train ... --nproc 2`, i.e. torchrun, on loopback) train as one process does.

One process trains 3 steps of the toy task in-process. Two ranks start the same 3 steps and die in the
middle of step 1's collection; started again, both ranks resume from the checkpoint of step 1 and each
continues its partial share of step 1's rollouts. After every step the ranks' weights match the single
process's within 1e-6, the step and held-out metrics match, the results files hold the same rollouts,
and the run directory holds exactly what one process writes (rank 0 alone writes; no partial file is
left).
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
        "environment.name=train_toy_env:KilledAfter",  # TOY_KILL_AFTER_REWARDS unset: never
        "environment.kwargs={target_id: 198}",
        "environment.train_tasks=16",
        "rollout.tasks_per_step=4",
        "rollout.group_size=8",
        # every sample in the update, so the ranks' token counts differ from the step's (the normaliser
        # must be the step's) and both ranks' backward passes count
        "algorithm.drop_zero_signal_groups=false",
        "rollout.temperature=1.0",
        # the 20 likeliest tokens: sampling from the whole 151k vocabulary lands in a tail of near-equal
        # probabilities, where an engine batch of other rows (16 rollouts per rank, not 32) rounds the
        # cumulative sum otherwise and picks the neighbouring token (seen: 9992 for 9993)
        "rollout.top_k=20",
        "optimizer.lr=1e-3",
        # AdamW moves a weight by up to lr * g / eps: with eps=1e-8 a gradient's float rounding (which
        # depends on how the samples were cut, ~1e-10 here) became 7e-6 in one step; 1e-5 keeps the
        # comparison about the ranks' arithmetic, not about that amplifier
        "optimizer.eps=1e-5",
        "eval.every=2",  # held-out evaluations at steps 0, 2 and 3: split over the ranks too
        "eval.tasks=4",
        "eval.samples=2",
        "checkpoint.every=1",
        "checkpoint.keep=3",
        "checkpoint.resume=true",
        "checkpoint.save_final_model=false",
        "logging.progress=false",
        f"steps={steps}",
        f"output_dir={output_dir}",
    ]


def train_ranks(*overrides: str, cwd: Path, kill_after_rewards: int = 0) -> subprocess.CompletedProcess[str]:
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
            "TOY_KILL_AFTER_REWARDS": str(kill_after_rewards),
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


def records(run: Path, kind: str) -> list[dict[str, float]]:
    return [
        {k: v for k, v in r.items() if k not in ("time", "eval/seconds") and not k.startswith(LAYOUT)}
        for r in read_metrics(run / "metrics.jsonl")
        if r["kind"] == kind
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

    # each rank dies on its 24th reward (4 held-out at step 0, 16 in step 0): in step 1's collection,
    # its share (2 tasks x 8) part done
    killed = train_ranks(*settings(model_dir, 3, two), cwd=tmp_path, kill_after_rewards=24)
    assert killed.returncode != 0 and "SimulatedKill" in killed.stderr, killed.stderr[-4000:]
    assert_same_weights(one, two, 1)
    partial = [len(list(read_results(path))) for path in (two / "rollouts" / "step_000001.ranks").iterdir()]
    assert partial and all(0 <= count < 16 for count in partial) and sum(partial) > 0, partial

    resumed = train_ranks(*settings(model_dir, 3, two), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert resumed.stderr.count("from step_000001 (step 1)") == 2, resumed.stderr[-4000:]  # both ranks
    assert resumed.stdout.count("held-out mean reward") == 1  # rank 0 reports
    for step in (2, 3):
        assert_same_weights(one, two, step)

    # the same steps: every metric of the rollouts and advantages exactly, the update's to rounding
    assert records(two, "eval") == records(one, "eval")
    assert [r["step"] for r in records(two, "eval")] == [0, 2, 3]
    expected, actual = records(one, "train"), records(two, "train")
    assert [r["step"] for r in actual] == [0, 1, 2]
    for a, b in zip(expected, actual, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key.startswith("mismatch/"):  # vs the engine, whose rounding depends on its batch and cache
                assert b[key] == pytest.approx(a[key], abs=1e-5), (a["step"], key)
            elif key.startswith(("policy/", "optim/")):
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
            else:
                assert b[key] == a[key], (a["step"], key)
    assert {r["optim/updates"] for r in actual} == {1.0}  # every step really updated
    # the same rollouts, in the same order, under the same header
    for path in [f"rollouts/step_{step:06d}.jsonl" for step in range(3)] + [
        f"evals/step_{step:06d}.jsonl" for step in (0, 2, 3)
    ]:
        assert read_header(two / path) == read_header(one / path)
        assert [
            (r.task_id, r.sample, r.trajectory.token_ids, r.reward) for r in read_results(two / path)
        ] == [(r.task_id, r.sample, r.trajectory.token_ids, r.reward) for r in read_results(one / path)]
    assert files(two) == files(one)  # rank 1 wrote nothing; no partial rollout files are left
    # not a vacuous comparison: in some step each rank's share (tasks 0-1, tasks 2-3) had a group whose
    # rewards differ, i.e. both ranks' gradients counted
    signal = [set(), set()]
    for step in range(3):
        rewards: dict[str, set[float]] = {}
        for result in read_results(one / f"rollouts/step_{step:06d}.jsonl"):
            rewards.setdefault(result.task_id, set()).add(result.reward)
        for position, values in enumerate(rewards.values()):
            if len(values) > 1:
                signal[position // 2].add(step)
    assert signal[0] and signal[1], signal


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


def _two_ranks(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks: gradients of different parameters reach the two backward passes; then
    ranks whose weights differ are stopped."""
    import torch.distributed as dist

    from agentboost.errors import RanksDivergedError
    from agentboost.train.buffers import FlatGradients

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ranks = Ranks.join(torch.device("cpu"))
    ranks.check_every = 1
    model = torch.nn.ModuleDict(
        {"a": torch.nn.Linear(2, 1, bias=False), "b": torch.nn.Linear(2, 1, bias=False)}
    )
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(1.0)
    gradients = FlatGradients(model.parameters())
    gradients.zero()
    used = model["a"] if rank == 0 else model["b"]  # each rank's backward reaches one parameter
    used(torch.full((1, 2), float(rank + 1))).sum().backward()
    ranks.reduce_gradients(gradients)
    gradients.drop_untouched()
    summed = [p.grad.tolist() if p.grad is not None else None for p in (model["a"].weight, model["b"].weight)]
    ranks.check_weights(model, 1)  # equal: passes
    with torch.no_grad():
        model["a"].weight.add_(rank)
    try:
        ranks.check_weights(model, 2)
        diverged = ""
    except RanksDivergedError as error:
        diverged = str(error)
    Path(out, f"rank{rank}.json").write_text(
        __import__("json").dumps({"grads": summed, "diverged": diverged})
    )
    dist.destroy_process_group()


def test_gradients_sum_over_ranks_and_diverged_weights_stop_the_run(tmp_path):
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_two_ranks, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # a reached by rank 0's backward (input 1), b by rank 1's (input 2): both kept on both ranks
        assert found["grads"] == [[[1.0, 1.0]], [[2.0, 2.0]]]
        assert "after step 2 the ranks' weights differ" in found["diverged"]
