"""Nothing keeps the process alive: the real `agentboost` command in a subprocess, a real hung tool.

A synchronous tool that never returns (a plain ``def`` Strands runs on a thread) ends its rollout at
``--timeout`` and the process then exits; Ctrl-C while it hangs ends the process with status 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli_errors import BackgroundServer

from agentboost.engines.scripted import ScriptedEngine
from agentboost.rollout.results import read_results

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CALL = '<tool_call>\n{"name": "wait_forever", "arguments": {}}\n</tool_call>'


@pytest.fixture
def server(say):
    running = BackgroundServer(ScriptedEngine([say(CALL)], cycle=True))
    yield running
    running.close()


@pytest.fixture(scope="module")
def tokenizer_dir(qwen_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(directory)
    return directory


def start(server, tokenizer_dir, cwd, *extra):
    command = [sys.executable, "-m", "agentboost.cli", "rollout", "--env", "hung_tool_env:HungTool"]
    command += ["--engine", "sglang", "--url", server.url, "--model", str(tokenizer_dir), "-n", "1"]
    command += ["--out", "r.jsonl", *extra]
    pythonpath = os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": pythonpath, "AGENTBOOST_TEST_MARKER": str(cwd / "entered")}
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(process, timeout=120):
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the process was still alive after {timeout} s: {err[-2000:]}")
    return process.returncode, out, err


def test_a_hung_synchronous_tool_ends_at_the_timeout_and_the_process_exits(server, tokenizer_dir, tmp_path):
    process = start(server, tokenizer_dir, tmp_path, "--timeout", "2")
    status, _, err = finish(process)
    assert (tmp_path / "entered").exists()
    assert status == 0, err[-2000:]
    [result] = list(read_results(tmp_path / "r.jsonl"))
    assert result.trajectory.termination.value == "timeout"


def test_ctrl_c_ends_a_run_whose_synchronous_tool_hangs(server, tokenizer_dir, tmp_path):
    process = start(server, tokenizer_dir, tmp_path)
    deadline = time.monotonic() + 120
    while not (tmp_path / "entered").exists():
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the tool was never called"
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    status, _, err = finish(process)
    assert status == 130, err[-2000:]
    assert "agentboost: interrupted" in err


@pytest.mark.slow
def test_a_rollout_that_never_reached_the_engine_says_so_and_the_limits_are_printed(
    say, tokenizer_dir, tmp_path
):
    """A stalled engine is not a bad model: the timeout's detail says no generation came back."""
    from agentboost.engines.servers.faults import FaultConfig

    slow = BackgroundServer(
        ScriptedEngine([say("Answer: 7")], cycle=True),
        faults=FaultConfig(probabilities={"slow": 1.0}, slow_delay_s=30),
    )
    try:
        command = [sys.executable, "-m", "agentboost.cli", "rollout", "--engine", "sglang", "--url", slow.url]
        command += [
            "--model",
            str(tokenizer_dir),
            "-n",
            "1",
            "--timeout",
            "2",
            "--retries",
            "0",
            "--out",
            "r.jsonl",
        ]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        slow.close()
    # an infrastructure failure, not a scored 0: the run fails, saying the cause and the fix
    assert done.returncode == 1, done.stderr[-2000:]
    assert "limits per rollout:" in done.stderr and "timeout 2 s" in done.stderr
    assert "1 of 1 rollouts failed" in done.stderr and "raise --timeout or lower --concurrency" in done.stderr
    [result] = list(read_results(tmp_path / "r.jsonl"))
    assert result.trajectory.termination.value == "engine_timeout" and result.outcome.value == "failed"
    assert "before the engine answered once" in result.trajectory.termination_detail


def test_retries_0_sends_no_request_twice(say, tokenizer_dir, tmp_path):
    """`--retries 0` is no retry at all: the HTTP client does not retry the server's 500 either."""
    from agentboost.engines.servers.faults import FaultConfig

    failing_once = BackgroundServer(
        ScriptedEngine([say("Answer: 7")], cycle=True), faults=FaultConfig(schedule=["http_500"])
    )
    try:
        command = [sys.executable, "-m", "agentboost.cli", "rollout", "--engine", "sglang"]
        command += ["--url", failing_once.url, "--model", str(tokenizer_dir), "-n", "1", "--retries", "0"]
        done = subprocess.run(
            [*command, "--out", "r.jsonl"], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
    finally:
        failing_once.close()
    assert done.returncode == 1, done.stderr[-2000:]
    [result] = list(read_results(tmp_path / "r.jsonl"))
    assert result.trajectory.termination.value == "engine_error" and result.attempts == 1


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["in-process", "workers"])
def test_every_server_down_ends_the_run_with_one_line_and_keeps_the_results(
    say, tokenizer_dir, tmp_path, workers
):
    """The server goes away mid-run: once `--server-down-timeout` is spent the run stops (no rollout
    failed one by one), says so once naming the server and the option, and a resume continues."""
    from agentboost.engines.servers.faults import FaultConfig

    served = BackgroundServer(
        ScriptedEngine([say("Answer: 7")], cycle=True),
        faults=FaultConfig(probabilities={"slow": 1.0}, slow_delay_s=0.05),
    )
    out = tmp_path / "r.jsonl"
    command = [sys.executable, "-m", "agentboost.cli", "rollout", "--engine", "sglang", "--url", served.url]
    command += ["--model", str(tokenizer_dir), "-n", "1000", "--concurrency", "4"]
    command += ["--server-down-timeout", "2", "--out", str(out), *workers]
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not out.exists() or len(out.read_text().splitlines()) < 6:  # the header and 5 results
            assert process.poll() is None, process.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no results were written"
            time.sleep(0.05)
    finally:
        served.close()
    status, _, err = finish(process)
    # before the fix: ~12 minutes of rollouts failing one by one
    assert status == 2, err[-2000:]
    assert "Traceback" not in err and "Unclosed" not in err, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("agentboost: error: ")]
    assert len(errors) == 1, err[-2000:]
    assert served.url in errors[0] and "--server-down-timeout" in errors[0]
    results = list(read_results(out))
    assert 5 <= len(results) < 50  # what was written before the outage, no flood of failures
    assert sum(result.failed for result in results) <= 4  # at most the rollouts in flight


STARTING = """
import sys, time
from agentboost import cli

def still_importing():
    print("importing", flush=True)
    time.sleep(120)  # the subcommands' modules, slow on a loaded machine

cli.build_parser = still_importing
cli.run()
"""


def test_ctrl_c_while_the_command_is_still_starting_ends_it_with_130_and_no_traceback(tmp_path):
    pythonpath = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    process = subprocess.Popen(
        [sys.executable, "-c", STARTING],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": pythonpath},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "importing\n", process.communicate()[1][-2000:]
    process.send_signal(signal.SIGINT)
    status, _, err = finish(process)
    assert status == 130, err[-2000:]
    assert err.strip() == "agentboost: interrupted"  # not a KeyboardInterrupt traceback
