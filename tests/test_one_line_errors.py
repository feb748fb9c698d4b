"""Inputs that used to end in a traceback end in one line and status 2: the real command in a subprocess."""

from __future__ import annotations

import pytest
from test_user_files import agentboost, one_error

CASES = {
    "an environment whose constructor raises": (
        ["rollout", "--env", "broken_envs:FailsToBuild"],
        "environment 'broken_envs:FailsToBuild' raised RuntimeError while being built: the database is not",
    ),
    "an environment whose tasks() raises": (
        ["rollout", "--env", "broken_envs:TasksRaise"],
        "TasksRaise.tasks() raised KeyError: 'split file missing'",
    ),
    "an environment whose tasks() raises, for veRL": (
        ["data", "to-verl", "--env", "broken_envs:TasksRaise", "--out", "x.parquet"],
        "TasksRaise.tasks() raised KeyError",
    ),
    "a hub dataset while offline": (
        ["data", "prepare-coding", "someorg/no-such-dataset", "--out", "tasks.jsonl"],
        "cannot load 'someorg/no-such-dataset' from the Hugging Face hub",
    ),
    "binary data named .json": (
        ["data", "prepare-coding", "junk.json", "--out", "tasks.jsonl"],
        "junk.json is not a JSON file",
    ),
    "model.device=cuda without a GPU": (
        ["train", "model.device=cuda", "steps=1", "output_dir=run", "logging.progress=false"],
        "model.device=cuda but this machine's torch sees no CUDA GPU",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_one_line(case, tmp_path):
    import torch

    if case.startswith("model.device") and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (tmp_path / "junk.json").write_bytes(bytes(range(256)) * 8)
    command, message = CASES[case]
    assert message in one_error(agentboost(*command, cwd=tmp_path))
