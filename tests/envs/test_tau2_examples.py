"""examples/tau2: prepare_data.py writes the packaged splits by id; the training scripts' dry runs pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from verl_support import NO_VERL, verl_python, with_verl_first_on_path

from agentboost.envs.task import Task
from agentboost.envs.tau2.environment import Tau2Environment

ROOT = Path(__file__).resolve().parents[2]


def test_prepare_data_writes_every_task_of_each_split_by_id(tmp_path):
    command = [sys.executable, "examples/tau2/prepare_data.py", "--domain", "retail", "--mode", "ticket"]
    done = subprocess.run(
        [*command, "--out-dir", str(tmp_path), "--verl"], cwd=ROOT, check=True, capture_output=True, text=True
    )
    # the tasks the training reward cannot judge are left out and listed, with the reason
    assert "train: 5 tasks left out, the training reward cannot judge them:" in done.stdout
    assert (
        "): retail-24, retail-50, retail-57\n" in done.stdout and "): retail-10, retail-25\n" in done.stdout
    )
    env = Tau2Environment(domain="retail", mode="ticket")
    for split, count in (("train", 69), ("test", 40)):  # train: the 74 packaged less those 5
        lines = (tmp_path / "retail-ticket" / f"{split}.jsonl").read_text().splitlines()
        tasks = [Task.from_dict(json.loads(line)) for line in lines]
        assert len(tasks) == count and tasks == env.tasks(split=split)
        import pyarrow.parquet as pq

        rows = pq.read_table(tmp_path / "retail-ticket" / f"{split}.parquet").to_pylist()
        assert [row["extra_info"]["task_id"] for row in rows] == [task.id for task in tasks]
        assert json.loads(rows[0]["extra_info"]["environment_kwargs"]) == {
            "domain": "retail",
            "mode": "ticket",
        }


def test_prepare_data_refuses_overlapping_splits_unless_asked(tmp_path):
    command = [
        sys.executable,
        "examples/tau2/prepare_data.py",
        "--domain",
        "airline",
        "--out-dir",
        str(tmp_path),
    ]
    refused = subprocess.run([*command, "--splits", "train,all"], cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 2
    assert "splits train and all: 17 test problems are also training problems" in refused.stderr
    assert not (tmp_path / "airline-simulator").exists()  # nothing written
    allowed = subprocess.run(
        [*command, "--splits", "train,all", "--allow-overlap"], cwd=ROOT, capture_output=True, text=True
    )
    assert allowed.returncode == 0 and "written anyway (--allow-overlap)" in allowed.stderr
    assert len((tmp_path / "airline-simulator" / "all.jsonl").read_text().splitlines()) == 50


@pytest.mark.parametrize("script", ["train.sh", "train_verl.sh"])
def test_training_scripts_dry_run(tmp_path, script):
    environ = {**os.environ, "DRY_RUN": "1", "DATA_ROOT": str(tmp_path), "DOMAIN": "retail"}
    if script == "train_verl.sh":  # its dry run composes veRL's config: in veRL's own environment
        verl = verl_python()
        if verl is None:
            pytest.skip(NO_VERL)
        environ = with_verl_first_on_path({**environ, "PYTHONPATH": str(ROOT)}, verl)
    done = subprocess.run(
        ["bash", f"examples/tau2/{script}"], cwd=ROOT, env=environ, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "OK" in done.stdout or "dry run: ok" in done.stdout
    if script == "train_verl.sh":
        row = json.loads((tmp_path / "retail-simulator" / "train.jsonl").read_text().splitlines()[0])
        assert row["id"].startswith("retail-")
