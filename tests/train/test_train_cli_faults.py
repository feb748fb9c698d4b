"""`agentboost train` as a user meets it after a crash: the real command in a subprocess, a tiny model.

A restarted trainer says whether it resumes or starts fresh; a damaged checkpoint is named and the
intact one before it is used; with none intact, one line names them and the way out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_qwen3

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def train(*overrides, cwd):
    pythonpath = os.pathsep.join(
        [str(ROOT), str(TESTS), str(TESTS / "train"), os.environ.get("PYTHONPATH", "")]
    )
    return subprocess.run(
        [sys.executable, "-m", "agentboost.cli", "train", *map(str, overrides)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1"},
    )


@pytest.fixture(scope="module")
def model_dir(qwen_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-qwen3")
    tiny_qwen3(seed=0, hidden=32).save_pretrained(directory)
    qwen_tokenizer.save_pretrained(directory)
    return directory


def settings(model_dir, steps):
    return [
        f"model.name_or_path={model_dir}",
        "environment.name=train_toy_env:FirstToken",
        "environment.kwargs={target_id: 198}",
        "environment.train_tasks=4",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "eval.every=0",
        "checkpoint.every=1",
        "checkpoint.keep=3",
        "checkpoint.resume=true",
        "checkpoint.save_final_model=false",
        "logging.progress=false",
        f"steps={steps}",
        "output_dir=run",
    ]


@pytest.mark.slow
def test_a_damaged_checkpoint_is_named_and_the_one_before_it_is_used(model_dir, tmp_path):
    first = train(*settings(model_dir, 2), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "starting a fresh run in run" in first.stderr
    checkpoints = tmp_path / "run" / "checkpoints"
    latest = checkpoints / "step_000002" / "model.pt"
    latest.write_bytes(latest.read_bytes()[:100])  # truncated, as by a full disk
    resumed = train(*settings(model_dir, 3), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    assert f"checkpoint file {Path('run/checkpoints/step_000002/model.pt')} is damaged" in resumed.stderr
    assert "resuming run from step_000001 (step 1)" in resumed.stderr
    assert (checkpoints / "step_000003" / "state.json").exists()


@pytest.mark.slow
def test_no_intact_checkpoint_is_one_line_naming_them(model_dir, tmp_path):
    done = train(*settings(model_dir, 1), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (tmp_path / "run" / "checkpoints" / "step_000001" / "state.json").write_bytes(b"\x00garbage{")
    again = train(*settings(model_dir, 2), cwd=tmp_path)
    assert again.returncode == 2, again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    [line] = [line for line in again.stderr.splitlines() if "error:" in line]
    assert "no intact checkpoint" in line and "step_000001/state.json is damaged" in line
    assert "choose a new output_dir to start fresh" in line


def test_a_binary_config_file_is_one_line(tmp_path):
    (tmp_path / "config.yaml").write_bytes(bytes(range(256)))
    done = train("config.yaml", "--print-config", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "config.yaml is not a YAML text file" in done.stderr


def test_the_step_0_evaluation_says_it_is_running(model_dir, tmp_path):
    """Issue 24 item 17: the held-out evaluation before the first step is announced, not silent."""
    overrides = [o for o in settings(model_dir, 1) if not o.startswith("eval.every")]
    done = train(*overrides, "eval.every=1", "eval.tasks=2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "agentboost: eval @0: 2 held-out rollouts" in done.stderr, done.stderr[-3000:]
