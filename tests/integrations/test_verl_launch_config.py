"""The example launch scripts compose into a trainer config veRL accepts, and a misspelt key is caught.

Each script runs for real under bash with two stand-ins on PATH: ``python -m verl.trainer.main_ppo`` records
the overrides it would get instead of training, and ``agentboost`` runs the real ``data to-verl`` code (until
the command is wired into ``agentboost.cli``). The recorded overrides are then composed with veRL's own
``ppo_trainer.yaml`` and checked as ``main_ppo`` and veRL's workers would check them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from agentboost.errors import ConfigError
from agentboost.integrations.verl import AGENT_LOOP_NAME, agent_loop_config_path
from agentboost.integrations.verl.config import check_trainer_config, compose_trainer_config

REPOSITORY = Path(__file__).resolve().parents[2]
LAUNCH_SCRIPTS = sorted(REPOSITORY.glob("examples/*/train_verl.sh"))
SMALL = {"TRAIN_TASKS": "8", "VAL_TASKS": "4"}

RECORDER = """import json, os, sys

with open(os.environ["MAIN_PPO_ARGS"], "w") as handle:
    json.dump(sys.argv[1:], handle)
"""

PYTHON_SHIM = """#!/usr/bin/env bash
if [ "${1:-}" = "-m" ] && [ "${2:-}" = "verl.trainer.main_ppo" ]; then
    shift 2
    exec "$REAL_PYTHON" "$RECORDER" "$@"
fi
exec "$REAL_PYTHON" "$@"
"""

AGENTBOOST_SHIM = """#!/usr/bin/env bash
exec "$REAL_PYTHON" - "$@" <<'PY'
import sys
from agentboost.cli import build_parser
args = build_parser().parse_args(sys.argv[1:])
sys.exit(args.func(args))
PY
"""


def launch(
    script: Path, tmp_path: Path, *extra: str, **settings: str
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run a launch script up to main_ppo; return the run and the overrides main_ppo would have got."""
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    (shims / "record_main_ppo.py").write_text(RECORDER)
    for name, text in (("python", PYTHON_SHIM), ("agentboost", AGENTBOOST_SHIM)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    recorded = tmp_path / "main_ppo.json"
    recorded.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
        "REAL_PYTHON": sys.executable,
        "RECORDER": str(shims / "record_main_ppo.py"),
        "MAIN_PPO_ARGS": str(recorded),
        "DATA_DIR": str(tmp_path / "data"),
        **SMALL,
        **settings,
    }
    result = subprocess.run(
        ["bash", str(script), *extra], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    overrides = json.loads(recorded.read_text()) if recorded.exists() else []
    return result, overrides


PASSED_THROUGH = "trainer.total_epochs=1"
"""An extra override on the script's command line: it must reach main_ppo, last."""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[tuple[str, str], list[str]]:
    """The overrides each launch script passes to main_ppo, per rollout backend (one script run each)."""
    runs = {}
    for script in LAUNCH_SCRIPTS:
        for backend in ("vllm", "sglang"):
            directory = tmp_path_factory.mktemp(f"{script.parent.name}-{backend}")
            result, overrides = launch(script, directory, PASSED_THROUGH, ROLLOUT_BACKEND=backend)
            assert result.returncode == 0, result.stderr
            assert overrides, f"{script} did not call python -m verl.trainer.main_ppo"
            runs[script.parent.name, backend] = overrides
    return runs


def test_there_is_an_executable_launch_script():
    assert LAUNCH_SCRIPTS, "no examples/*/train_verl.sh"
    for script in LAUNCH_SCRIPTS:
        assert os.access(script, os.X_OK), f"{script} is not executable"
        assert "set -euo pipefail" in script.read_text()


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize("example", [path.parent.name for path in LAUNCH_SCRIPTS])
def test_the_launch_config_composes_and_validates(recorded, example, backend):
    overrides = recorded[example, backend]
    assert overrides[-1] == PASSED_THROUGH

    config = compose_trainer_config(overrides)
    check_trainer_config(config)  # raises ConfigError on anything main_ppo or veRL's workers would refuse

    rollout = config.actor_rollout_ref.rollout
    assert rollout.name == backend
    assert config.algorithm.adv_estimator == "grpo"
    assert rollout.agent.default_agent_loop == AGENT_LOOP_NAME
    assert rollout.agent.agent_loop_config_path == agent_loop_config_path()
    assert "wandb" in config.trainer.logger
    assert config.trainer.total_epochs == 1
    # the script's data step wrote what the trainer reads
    train = pq.read_table(config.data.train_files)
    assert train.num_rows == int(SMALL["TRAIN_TASKS"])
    assert set(train.column("agent_name").to_pylist()) == {AGENT_LOOP_NAME}
    assert pq.read_table(config.data.val_files).num_rows == int(SMALL["VAL_TASKS"])


@pytest.mark.parametrize("example", [path.parent.name for path in LAUNCH_SCRIPTS])
def test_a_misspelt_key_fails_the_dry_run(recorded, example):
    misspelt = "actor_rollout_ref.rollout.agent.agent_loop_config_pathh=/tmp/loops.yaml"
    overrides = recorded[example, "vllm"]
    with pytest.raises(
        ConfigError, match=r"Could not override 'actor_rollout_ref\.rollout\.agent\.agent_loop_config_pathh'"
    ):
        compose_trainer_config([*overrides, misspelt])
    # adding the key on purpose with + gets past Hydra, but not past veRL's config dataclasses
    with pytest.raises(ConfigError, match="agent_loop_config_pathh"):
        check_trainer_config(compose_trainer_config([*overrides, "+" + misspelt]))


@pytest.mark.parametrize("example", [path.parent.name for path in LAUNCH_SCRIPTS])
def test_a_bad_value_fails_the_dry_run(recorded, example):
    overrides = recorded[example, "vllm"]
    with pytest.raises(ConfigError, match="grpoo"):
        check_trainer_config(compose_trainer_config([*overrides, "algorithm.adv_estimator=grpoo"]))
    loop = "actor_rollout_ref.rollout.agent.default_agent_loop=agentbost"
    with pytest.raises(ConfigError, match="default_agent_loop='agentbost' is not a registered agent loop"):
        check_trainer_config(compose_trainer_config([*overrides, loop]))


@pytest.mark.parametrize("script", LAUNCH_SCRIPTS, ids=lambda path: path.parent.name)
def test_an_unknown_rollout_backend_stops_the_script(script, tmp_path):
    result, overrides = launch(script, tmp_path, ROLLOUT_BACKEND="tgi")
    assert result.returncode == 2
    assert "ROLLOUT_BACKEND must be vllm or sglang" in result.stderr
    assert overrides == []
