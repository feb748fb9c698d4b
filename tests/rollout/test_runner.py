"""The runner: resumable results, retries, kill -9 and resume, worker processes, tool isolation."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run
from strands import tool

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.envs.base import Environment, Reward, Task
from agentboost.errors import ConfigError, EngineError
from agentboost.rollout.results import ResultStore, read_results
from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs
from agentboost.tokens.trajectory import TerminationReason

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def tokenizer_dir(qwen_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(directory)
    return directory


def answer_engine(say, text="Answer: 7"):
    return ScriptedEngine([say(text)], cycle=True)


def test_results_resume_skip_done_pairs_and_cut_a_torn_line(qwen_tokenizer, say, tmp_path):
    environment = ArithmeticEnvironment()
    config = RunConfig(samples=2, progress=False)
    jobs = plan_jobs(environment, environment.tasks(3), config)
    path = tmp_path / "results.jsonl"
    with ResultStore(path) as store:
        first = run(
            run_jobs(jobs[:4], in_process(environment, answer_engine(say), qwen_tokenizer), store, config)
        )
    assert first.completed == 4
    with open(path, "ab") as handle:  # what a kill in the middle of a write leaves behind
        handle.write(b'{"task_id": "arith-d1-s0-2", "sample": 0, "traj')
    with ResultStore(path) as store:
        assert store.torn_bytes > 0 and len(store.done) == 4
        second = run(
            run_jobs(jobs, in_process(environment, answer_engine(say), qwen_tokenizer), store, config)
        )
        with pytest.raises(ConfigError, match="already in"):
            store.write(next(read_results(path)))
    assert second.skipped == 4 and second.completed == 2
    results = list(read_results(path))
    assert sorted((r.task_id, r.sample) for r in results) == sorted((j.task_id, j.sample) for j in jobs)
    assert all(line.endswith("}") for line in path.read_text().splitlines())
    assert len(path.read_text().splitlines()) == 1 + len(jobs)  # the header, then one line per pair


def test_runner_killed_with_sigkill_resumes_to_exactly_tasks_times_samples(tokenizer_dir, tmp_path):
    out = tmp_path / "killed.jsonl"
    command = [sys.executable, str(HERE / "slow_runner.py"), str(out), str(tokenizer_dir), "12", "3"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 6):
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    lines_before = out.read_text().count("\n") - 1  # the header is the first line
    assert 5 <= lines_before < 36, "the runner must be killed mid-run"
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert f"({lines_before} already done" in finished.stdout
    header, *lines = out.read_text().splitlines()
    assert json.loads(header)["format"] == "agentboost.results"
    keys = [(json.loads(line)["task_id"], json.loads(line)["sample"]) for line in lines]
    assert len(keys) == 36 == len(set(keys))  # 12 tasks x 3 samples, no duplicates, no torn lines


def test_engine_errors_are_retried_and_the_attempts_recorded(qwen_tokenizer, say, tmp_path):
    calls = {"n": 0}

    def flaky(prompt, index):
        calls["n"] += 1
        if calls["n"] == 1:
            raise EngineError("connection reset")
        return say("Answer: 7")

    environment = ArithmeticEnvironment()
    config = RunConfig(retries=1, retry_backoff_s=0.01, progress=False)
    with ResultStore(tmp_path / "r.jsonl") as store:
        summary = run(
            run_jobs(
                plan_jobs(environment, environment.tasks(1), config),
                in_process(environment, ScriptedEngine(flaky), qwen_tokenizer),
                store,
                config,
            )
        )
    result = next(read_results(tmp_path / "r.jsonl"))
    assert summary.retried == 1 and result.attempts == 2
    assert result.termination is TerminationReason.COMPLETED


class Notes(Environment):
    """Each rollout gets its own notepad; a reward that reads it, and one that fails on demand."""

    system_prompt = "Keep notes."

    def tools(self, episode):
        notes: list[str] = []

        @tool
        async def write_note(text: str) -> str:
            """Write a note.

            Args:
                text: The note.
            """
            await asyncio.sleep(0.01)  # let the other rollout interleave
            notes.append(text)
            return "ok"

        @tool
        def read_notes() -> str:
            """Read all notes."""
            return "|".join(notes)

        return [write_note, read_notes]

    def tasks(self, n=None, *, seed=0, split="train"):
        words = ("apple", "banana", "boom")
        return [Task(task_id, word, ground_truth=word) for task_id, word in zip("abc", words, strict=True)]

    async def reward(self, trajectory, episode):
        if episode.task.ground_truth == "boom":
            raise ValueError("the reward exploded")
        seen = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
        return Reward(1.0 if seen[-1] == episode.task.ground_truth else 0.0, {"notes_seen": float(len(seen))})


def test_concurrent_rollouts_of_a_stateful_tool_never_share_state(qwen_tokenizer, say, tmp_path):
    def script(prompt, index):
        text = qwen_tokenizer.decode(prompt)
        question = text.split("<|im_start|>user\n", 1)[1]
        word = "apple" if question.startswith("apple") else "banana"
        results_so_far = text.count("<|im_start|>user\n<tool_response>")
        if results_so_far == 0:
            call = {"name": "write_note", "arguments": {"text": word}}
        elif results_so_far == 1:
            call = {"name": "read_notes", "arguments": {}}
        else:
            return say("done")
        return say(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")

    environment = Notes()
    config = RunConfig(samples=3, progress=False)
    with ResultStore(tmp_path / "notes.jsonl") as store:
        summary = run(
            run_jobs(
                plan_jobs(environment, environment.tasks(), config),
                in_process(environment, ScriptedEngine(script), qwen_tokenizer),
                store,
                config,
            )
        )
    results = {(r.task_id, r.sample): r for r in read_results(tmp_path / "notes.jsonl")}
    for sample in range(3):
        for task_id, word in (("a", "apple"), ("b", "banana")):
            result = results[(task_id, sample)]
            assert result.reward == 1.0 and result.reward_breakdown == {"notes_seen": 2.0}
            assert [m["content"] for m in result.trajectory.messages if m["role"] == "tool"] == ["ok", word]
        failed = results[("c", sample)]
        assert failed.reward is None and "the reward exploded" in failed.reward_error and failed.failed
    assert summary.failed == 3 and summary.completed == 9


def test_a_killed_worker_is_replaced_and_the_run_completes(tokenizer_dir, qwen_tokenizer, say, tmp_path):
    from agentboost.engines.servers.serve import start_server
    from agentboost.rollout.spec import RunSpec
    from agentboost.rollout.workers import WorkerPool

    class Slow(ScriptedEngine):
        async def generate(self, prompt_ids, sampling, *, max_new_tokens):
            await asyncio.sleep(0.3)
            return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)

    async def main():
        server = await start_server(Slow([say("Answer: 7")], cycle=True), context_length=40960)
        environment = ArithmeticEnvironment()
        config = RunConfig(samples=2, progress=False, retry_backoff_s=0.05)
        spec = RunSpec(
            "arithmetic", model=str(tokenizer_dir), engine="sglang", urls=[server.url], concurrency=8
        )
        try:
            async with WorkerPool(spec, workers=2, restart_backoff_s=0.0) as pool:
                with ResultStore(tmp_path / "w.jsonl") as store:
                    runner = asyncio.create_task(
                        run_jobs(
                            plan_jobs(environment, environment.tasks(8), config), pool.execute, store, config
                        )
                    )
                    while not any(w.in_flight for w in pool.workers) or store.written < 1:
                        await asyncio.sleep(0.05)
                    victim = max(pool.workers, key=lambda w: len(w.in_flight))
                    in_flight = len(victim.in_flight)
                    os.kill(victim.process.pid, signal.SIGKILL)
                    summary = await runner
                return summary, pool.started, in_flight
        finally:
            await server.close()

    summary, started, in_flight = run(main())
    assert in_flight >= 1 and started == 3  # two workers, one replacement
    results = list(read_results(tmp_path / "w.jsonl"))
    assert len(results) == 16 == len({(r.task_id, r.sample) for r in results})
    assert all(r.termination is TerminationReason.COMPLETED and r.reward == 0.0 for r in results)
    # the killed worker's rollouts ran again (so may jobs sent to it before its death was noticed)
    assert any(r.attempts > 1 for r in results)
    assert summary.retried == sum(r.attempts - 1 for r in results)
