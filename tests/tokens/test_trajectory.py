from __future__ import annotations

import json

import pytest

from agentboost.errors import ConfigError
from agentboost.tokens.trajectory import Trajectory, read_jsonl, write_jsonl


def test_save_and_load_are_lossless(scripted_trajectory, tmp_path):
    scripted_trajectory.reward = 1.0
    scripted_trajectory.logprobs[-1] = -0.123456789012345678  # full float64 precision survives
    path = tmp_path / "one.json"
    scripted_trajectory.save(path)
    loaded = Trajectory.load(path)
    assert loaded == scripted_trajectory
    assert write_jsonl(tmp_path / "many.jsonl", [scripted_trajectory, loaded]) == 2
    assert list(read_jsonl(tmp_path / "many.jsonl")) == [scripted_trajectory, scripted_trajectory]
    data = json.loads(path.read_text())
    assert data["format"] == "agentboost.trajectory" and data["version"] == 1
    assert data["termination"] == {"reason": "completed", "detail": None}


def test_bad_files_raise_typed_errors(scripted_trajectory, tmp_path):
    path = tmp_path / "torn.jsonl"
    line = scripted_trajectory.to_json()
    path.write_text(line + "\n" + line[: len(line) // 2])
    reader = read_jsonl(path)
    assert next(reader).task_id == scripted_trajectory.task_id
    with pytest.raises(ConfigError, match=r"torn.jsonl:2"):
        next(reader)
    data = scripted_trajectory.to_dict() | {"version": 99}
    with pytest.raises(ConfigError, match="version 99"):
        Trajectory.from_dict(data)
    with pytest.raises(ValueError, match="same length"):
        Trajectory.from_dict(scripted_trajectory.to_dict() | {"loss_mask": [1]})
