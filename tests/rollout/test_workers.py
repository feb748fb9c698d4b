"""Worker processes that fail: bounded respawns with backoff, and result lines that cannot be read."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

import pytest
from conftest import run

from agentboost.engines.scripted import ScriptedEngine
from agentboost.engines.servers.serve import start_server
from agentboost.rollout.results import ResultStore, read_results
from agentboost.rollout.runner import RunConfig, plan_jobs, run_jobs
from agentboost.rollout.spec import RunSpec
from agentboost.rollout.workers import WorkerPool, WorkerSetupError
from agentboost.tokens.trajectory import TerminationReason

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def tokenizer_dir(qwen_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture
def importable(monkeypatch):
    """Let worker processes import tests/rollout/worker_envs.py."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


def test_a_worker_that_dies_at_start_is_respawned_with_backoff_then_the_run_ends(tokenizer_dir, importable):
    spec = RunSpec(
        "worker_envs:CrashAtStart", model=str(tokenizer_dir), engine="sglang", urls=["http://127.0.0.1:9"]
    )
    pool = WorkerPool(spec, workers=1, max_restarts=2, restart_backoff_s=0.01)

    async def main():
        with pytest.raises(WorkerSetupError, match=r"died 3 times in a row .*exited with code 7"):
            async with pool:
                pass

    run(main())
    assert pool.started == 3  # the first start and two respawns, then it gave up
    assert pool.workers == []


def test_a_worker_that_hangs_in_setup_is_killed_at_the_timeout_and_not_respawned(tokenizer_dir, importable):
    spec = RunSpec("worker_envs:HangsAtStart", model=str(tokenizer_dir), engine="sglang")
    pool = WorkerPool(spec, workers=1, restart_backoff_s=0.01, setup_timeout_s=10)

    async def main():
        started = time.monotonic()
        hang = r"did not finish its setup .* within 10 s and was killed"
        with pytest.raises(WorkerSetupError, match=hang) as error:
            async with pool:
                pass
        return time.monotonic() - started, str(error.value)

    elapsed, message = run(main())
    assert 10 <= elapsed < 60  # it waited for the timeout, not for the worker's hour-long sleep
    assert pool.started == 1  # a hang is not retried
    pid = int(re.search(r"worker process (\d+)", message).group(1))
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(pid, 0)


def test_the_setup_timeout_must_be_positive(tokenizer_dir):
    from agentboost.errors import ConfigError

    spec = RunSpec("arithmetic", model=str(tokenizer_dir))
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="setup_timeout_s"):
            WorkerPool(spec, workers=1, setup_timeout_s=bad)


def test_a_config_error_in_a_worker_is_reported_once_with_its_own_message(tokenizer_dir):
    from agentboost.envs.registry import make_environment
    from agentboost.errors import ConfigError

    with pytest.raises(ConfigError) as in_process:
        make_environment("arithmetic", {"colour": "red"})
    spec = RunSpec("arithmetic", model=str(tokenizer_dir), environment_kwargs={"colour": "red"})
    pool = WorkerPool(spec, workers=2)

    async def main():
        with pytest.raises(WorkerSetupError) as error:
            async with pool:
                pass
        return str(error.value)

    assert run(main()) == str(in_process.value)
    assert pool.started == 2  # no respawns: a setting does not fix itself


def scribbling_server(qwen_tokenizer, say):
    """Task 'a' calls the tool once, then answers; the others answer at once."""

    def script(prompt, index):
        text = qwen_tokenizer.decode(prompt)
        if "task a" in text and "<|im_start|>user\n<tool_response>" not in text:
            return say('<tool_call>\n{"name": "scribble", "arguments": {}}\n</tool_call>')
        return say("Answer: 7")

    return ScriptedEngine(script)


@pytest.mark.parametrize(
    ("line", "replacements"),
    [
        (json.dumps({"id": 1, "result": {"broken": True}}), 0),  # names rollout 1: only it fails
        ("not json at all", 1),  # names no rollout: that worker is retired, its rollouts retried
    ],
    ids=["names-its-rollout", "names-none"],
)
def test_an_unreadable_result_line_fails_only_what_it_touches(
    tokenizer_dir, qwen_tokenizer, say, tmp_path, importable, line, replacements
):
    from agentboost.envs.registry import make_environment

    reference = "worker_envs:WritesToTheResultPipe"
    kwargs = {"line": line, "marker": str(tmp_path / "scribbled")}
    environment = make_environment(reference, kwargs)
    config = RunConfig(samples=1, concurrency=3, retry_backoff_s=0.01, progress=False)

    async def main():
        server = await start_server(scribbling_server(qwen_tokenizer, say), context_length=40960)
        spec = RunSpec(
            reference,
            model=str(tokenizer_dir),
            engine="sglang",
            urls=[server.url],
            environment_kwargs=kwargs,
            concurrency=3,
        )
        try:
            async with WorkerPool(spec, workers=1, restart_backoff_s=0.01) as pool:
                with ResultStore(tmp_path / "r.jsonl") as store:
                    jobs = plan_jobs(environment, environment.tasks(), config)
                    summary = await asyncio.wait_for(run_jobs(jobs, pool.execute, store, config), 240)
            return summary, pool.started
        finally:
            await server.close()

    summary, started = run(main())
    results = {r.task_id: r for r in read_results(tmp_path / "r.jsonl")}
    assert summary.completed == 3 and summary.failed == 0
    assert all(r.termination is TerminationReason.COMPLETED for r in results.values())
    assert [m["role"] for m in results["a"].trajectory.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert results["a"].attempts == 2, (tmp_path / "scribbled").exists()  # the scribbled-on rollout ran again
    if replacements == 0:
        assert results["b"].attempts == results["c"].attempts == 1 and started == 1
    else:
        assert started == 2
