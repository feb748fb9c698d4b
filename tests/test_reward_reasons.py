"""`agentboost show` says why a rollout scored what it did: the environment's reason and breakdown."""

from __future__ import annotations

import asyncio

from agentboost.cli import main
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.rollout.results import ResultStore
from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs


def _results(tokenizer, say, tmp_path, replies: list[str]):
    environment = ArithmeticEnvironment()
    config = RunConfig(samples=1, concurrency=1, progress=False)
    jobs = plan_jobs(environment, environment.tasks(len(replies)), config)
    path = tmp_path / "results.jsonl"
    engine = ScriptedEngine([say(text) for text in replies])
    with ResultStore(path, fsync=False) as store:
        asyncio.run(
            run_jobs(jobs, in_process(environment, engine, tokenizer, template="qwen3"), store, config)
        )
    return path, [task.ground_truth for task in environment.tasks(len(replies))]


def test_show_prints_the_reason_of_a_zero_reward(qwen_tokenizer, say, tmp_path, capsys):
    # the case: a correct computation with no final-answer line scores 0, and now says why
    path, answers = _results(qwen_tokenizer, say, tmp_path, ["10 * 63 = 630.", "Answer: 1"])
    assert main(["show", str(path), "--index", "0"]) == 0
    shown = capsys.readouterr().out
    assert "reward: 0 (no final answer: the last message has no `Answer: ...` line" in shown
    assert main(["show", str(path), "--index", "1"]) == 0
    shown = capsys.readouterr().out
    assert f"reward: 0 (answered 1, expected {answers[1]})" in shown
    assert f'"expected": {answers[1]}' in shown


def test_show_says_when_the_environment_gave_no_reason(qwen_tokenizer, say, tmp_path, capsys):
    from agentboost.envs.base import Reward

    class Breakdown(ArithmeticEnvironment):
        def reward(self, trajectory, episode):
            return Reward(0.25, {"format": 0.25, "correct": 0.0})

    environment = Breakdown()
    config = RunConfig(samples=1, concurrency=1, progress=False)
    path = tmp_path / "breakdown.jsonl"
    engine = ScriptedEngine([say("Answer: 1")])
    with ResultStore(path, fsync=False) as store:
        execute = in_process(environment, engine, qwen_tokenizer, template="qwen3")
        asyncio.run(run_jobs(plan_jobs(environment, environment.tasks(1), config), execute, store, config))
    assert main(["show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "reward: 0.25 (the environment gave no reason) | breakdown format 0.25, correct 0" in shown
