"""Ctrl-C ends `agentboost train` promptly and cleanly whatever the load: the real command in a
subprocess, on a tiny model, while four busy-loop processes load the CPU.

SIGINT arrives during the step-0 held-out evaluation, during rollouts and during an update (each
found from the progress bar's phase label), once or twice. The command must end with status 130 and
"agentboost: interrupted", never "terminate called" (a C++ thread torn down by a second Ctrl-C: exit
134), and a restart must say whether it resumes or starts fresh. Waits are hang guards, never timing
assertions.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_train_cli_faults import model_dir  # noqa: F401 (a fixture)

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
HANG_GUARD_S = 60
"""How long an interrupted command may take to end before the test calls it hung."""


@pytest.fixture
def busy_cpu():
    """Four processes that spin forever: the load under which Ctrl-C used to be ignored for a minute."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


class Trainer:
    """`agentboost train` in a subprocess whose stderr (progress bar included) is read as it comes."""

    def __init__(self, model_dir, cwd):  # noqa: F811
        pythonpath = os.pathsep.join(
            [str(ROOT), str(TESTS), str(TESTS / "train"), os.environ.get("PYTHONPATH", "")]
        )
        overrides = [
            f"model.name_or_path={model_dir}",
            "environment.name=train_toy_env:LongReply",
            "environment.kwargs={target_id: 198}",
            "environment.train_tasks=8",
            "rollout.tasks_per_step=2",
            "rollout.group_size=2",
            "eval.every=1",
            "eval.tasks=2",
            "checkpoint.every=1",
            "checkpoint.resume=true",
            "checkpoint.save_final_model=false",
            "logging.progress=true",
            "steps=50",
            "output_dir=run",
        ]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agentboost.cli", "train", *overrides],
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.stderr = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while chunk := self.process.stderr.read1(65536):
            self.stderr.extend(chunk)

    @property
    def text(self):
        return bytes(self.stderr).decode("utf-8", errors="replace")

    def wait_for(self, marker):
        waited = 0.0
        while marker not in self.text:
            assert self.process.poll() is None, f"ended before {marker!r}: {self.text[-3000:]}"
            assert waited < 600, f"no {marker!r} in 10 minutes (hang guard): {self.text[-3000:]}"
            time.sleep(0.05)
            waited += 0.05

    def interrupt(self, times=1):
        for number in range(times):
            if number:
                time.sleep(0.3)
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"still alive {HANG_GUARD_S} s after Ctrl-C: {self.text[-3000:]}")
        self.reader.join(10)
        return self.process.returncode, self.text

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("phase", "times"),
    [("eval @0", 1), ("rollouts @0", 1), ("update @0", 1), ("eval @0", 2), ("rollouts @1", 2)],
    ids=["eval", "rollouts", "update", "eval-twice", "rollouts-twice"],
)
def test_ctrl_c_under_load_ends_with_130_and_a_restart_says_how_it_starts(
    model_dir,  # noqa: F811
    busy_cpu,
    tmp_path,
    phase,
    times,
):
    trainer = Trainer(model_dir, tmp_path)
    try:
        trainer.wait_for(phase)
        status, text = trainer.interrupt(times)
    finally:
        trainer.close()
    assert status == 130, text[-3000:]
    assert "terminate called" not in text and "Traceback" not in text, text[-3000:]
    assert "agentboost: interrupted" in text
    restarted = Trainer(model_dir, tmp_path)
    try:
        restarted.wait_for("eval @" if phase.startswith("eval") else "rollouts @")
        status, text = restarted.interrupt()
    finally:
        restarted.close()
    assert status == 130, text[-3000:]
    said = [
        line
        for line in text.splitlines()
        if "starting a fresh run in run" in line or "resuming run from" in line
    ]
    assert said, text[-3000:]
    if phase == "rollouts @1":  # step 0 was checkpointed before the interrupt
        assert "resuming run from step_000001 (step 1)" in said[0]
