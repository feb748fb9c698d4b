"""`SMOKE=1 bash examples/X/train.sh` runs every stage at a smoke size, under runs/smoke/: checked by
running each script with `agentboost` and `python` replaced by stubs that record their arguments, then
loading every training command's config with its overrides (an unknown key fails). The smoke runs
themselves run in tests/test_readme.py (minutes each; their cost in docs/training.md)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from agentboost.train.config import TrainConfig, load_config
from agentboost.train.sft import SFTConfig

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("math", "deepcoder", "tau2", "gateway", "mcp")
STUB = """#!/usr/bin/env bash
printf '%s' "$(basename "$0")" >> "$COMMANDS_LOG"
for argument in "$@"; do printf ' %q' "$argument" >> "$COMMANDS_LOG"; done
echo >> "$COMMANDS_LOG"
"""


def commands(example: str, tmp_path: Path, *, smoke: bool) -> list[list[str]]:
    """The commands ``examples/<example>/train.sh`` runs, as the stubs recorded them."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name in ("agentboost", "python", "curl"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    log = tmp_path / f"{example}-{smoke}.log"
    log.write_text("")
    env = {
        **os.environ,
        "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
        "COMMANDS_LOG": str(log),
        "SMOKE": "1" if smoke else "0",
        "DATA_DIR": str(tmp_path / "no-data"),  # deepcoder: as on a fresh clone, the data is prepared
    }
    if not smoke:
        env.pop("SMOKE")
    finished = subprocess.run(
        ["bash", str(ROOT / "examples" / example / "train.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 0, finished.stderr
    return [shlex.split(line) for line in log.read_text().splitlines()]


def _trainings(recorded: list[list[str]]) -> list[tuple[type, str, list[str]]]:
    found = []
    for command in recorded:
        if command[:2] in (["agentboost", "train"], ["agentboost", "sft"]):
            cls = TrainConfig if command[1] == "train" else SFTConfig
            found.append((cls, command[2], [a for a in command[3:] if "=" in a]))
    return found


@pytest.mark.parametrize("example", EXAMPLES)
def test_smoke_runs_every_training_stage_small_and_apart_from_the_full_run(example, tmp_path):
    smoke = commands(example, tmp_path, smoke=True)
    trainings = _trainings(smoke)
    assert trainings, smoke
    for cls, config_path, overrides in trainings:
        config = load_config(str(ROOT / config_path), overrides, cls=cls)  # unknown keys raise
        assert config.steps == 1, (config_path, overrides)
        assert str(config.output_dir).startswith("runs/smoke/"), config.output_dir
        assert config.eval.tasks <= 4 and config.eval.every == 1
        if cls is TrainConfig:
            assert config.rollout.tasks_per_step * config.rollout.group_size <= 4
    for command in smoke:  # rollouts and evaluations: a few tasks, written under runs/smoke/
        if command[:2] in (["agentboost", "rollout"], ["agentboost", "eval"]) and "--out" in command:
            assert int(command[command.index("-n") + 1]) <= 4, command
            assert command[command.index("--out") + 1].startswith("runs/smoke/"), command
    full = _trainings(commands(example, tmp_path, smoke=False))
    assert [config for _, config, _ in full] == [config for _, config, _ in trainings]
    for cls, config_path, overrides in full:  # without SMOKE: the configs' own sizes
        config = load_config(str(ROOT / config_path), overrides, cls=cls)
        assert config.steps > 1 and not str(config.output_dir).startswith("runs/smoke")
