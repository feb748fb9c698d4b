"""Memory is bounded by concurrency, not by ``-n`` or ``--samples``: the real `agentboost rollout` in a
subprocess against a zero-latency engine (a scripted server on loopback), its peak resident memory
(VmHWM) read once its first results are written. A million tasks x 8 samples, fresh and resumed, must
cost what ten tasks cost: the tasks are made as the lanes take them and a resume checks the file
against them in one pass, holding none.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli_errors import BackgroundServer, one_error, tokenizer_dir  # noqa: F401 (a fixture)

from agentboost.engines.scripted import ScriptedEngine
from agentboost.memory import peak_resident_bytes

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")

TESTS = Path(__file__).resolve().parent
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")]),
}
MARGIN_MB = 64
"""A million tasks held as Task objects cost about 1 GB; ten cost nothing. 64 MB is noise room."""


@pytest.fixture
def server(say):
    running = BackgroundServer(ScriptedEngine([say("Answer: 7")], cycle=True))
    yield running
    running.close()


def peak_mb(pid: int) -> float:
    return peak_resident_bytes(pid) / 2**20


def results_in(path: Path) -> int:
    if not path.exists():
        return 0
    return max(0, len(path.read_bytes().splitlines()) - 1)


def peak_until(server, tokenizer_dir, cwd, n, results, *, out="r.jsonl"):  # noqa: F811
    """Run `rollout -n N --samples 8` until it has added ``results`` lines to its file; its peak RSS
    then (MB).

    The process is then interrupted and must end with 130 unless it had already finished. Counting
    only the lines this run adds matters on a resume: the interrupted run before it may have
    written many more than it was waited for, and a count of the whole file would send SIGINT to a
    process still starting up.
    Waits are hang guards (the command gets 10 minutes to write its first results on a loaded
    machine), never timing assertions."""
    results += results_in(cwd / out)
    command = [sys.executable, "-m", "agentboost.cli", "rollout", "-n", str(n), "--samples", "8"]
    command += ["--engine", "sglang", "--url", server.url, "--model", str(tokenizer_dir), "--out", out]
    process = subprocess.Popen(
        command, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        waited = 0.0
        while results_in(cwd / out) < results:
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert waited < 600, f"-n {n}: no {results} results in 10 minutes (hang guard)"
            time.sleep(0.2)
            waited += 0.2
        peak = peak_mb(process.pid)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        if results_in(cwd / out) < n * 8:  # interrupted while running: it says so and ends with 130
            assert process.returncode == 130 and "agentboost: interrupted" in err, err[-3000:]
        else:  # it had finished: the signal came while it exited (Python's own teardown, or not at all)
            assert process.returncode in (0, -signal.SIGINT), err[-3000:]
        return peak
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_million_tasks_cost_the_memory_of_ten_fresh_and_resumed(server, tokenizer_dir, tmp_path):  # noqa: F811
    small = peak_until(server, tokenizer_dir, tmp_path, 10, 40, out="small.jsonl")
    big = peak_until(server, tokenizer_dir, tmp_path, 1_000_000, 40)
    resumed = peak_until(server, tokenizer_dir, tmp_path, 1_000_000, 40)  # checks the first run's lines
    assert big < small + MARGIN_MB, (small, big)
    assert resumed < small + MARGIN_MB, (small, resumed)


def run(server, tokenizer_dir, cwd, command, *args):  # noqa: F811
    argv = [sys.executable, "-m", "agentboost.cli", command, "--engine", "sglang", "--url", server.url]
    argv += ["--model", str(tokenizer_dir), *args]
    return subprocess.run(argv, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


def test_an_environment_that_yields_its_tasks_runs_resumes_and_evaluates(server, tokenizer_dir, tmp_path):  # noqa: F811
    endless = ["--env", "stream_envs:Endless", "-n", "3", "--samples", "2", "--out", "r.jsonl"]
    first = run(server, tokenizer_dir, tmp_path, "rollout", *endless)
    assert first.returncode == 0, first.stderr
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["run"]["tasks"] == 3 and len(lines) == 1 + 6  # -n of an endless stream
    again = run(server, tokenizer_dir, tmp_path, "rollout", *endless)
    assert again.returncode == 0 and "6 already done" in again.stdout, (again.stdout, again.stderr)
    assert (tmp_path / "r.jsonl").read_text().splitlines() == lines
    report = tmp_path / "report.json"
    evaluated = run(server, tokenizer_dir, tmp_path, "eval", *endless[:-1], "e.jsonl", "--report", report)
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(report.read_text())["tasks"] == 3  # pass@k over the groups of the yielded tasks


def test_an_environment_that_yields_a_task_id_twice_is_one_line(server, tokenizer_dir, tmp_path):  # noqa: F811
    result = run(server, tokenizer_dir, tmp_path, "rollout", "--env", "stream_envs:Repeats", "-n", "5")
    assert "two tasks share the id 'arith-d1-s0-0'" in one_error(result)
