"""Signs of life: a long multi-turn rollout shows its turns and tokens before it ends, a stalled run says
what it waits for, and a run whose engine never answered says so with the fix."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from conftest import run
from pty_support import run_in_terminal

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.rollout.results import ResultStore
from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, run_jobs

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def tokenizer_dir(qwen_tokenizer, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    qwen_tokenizer.save_pretrained(directory)
    return directory


def test_a_multi_turn_rollout_shows_turns_and_tokens_and_a_stall_says_what_it_waits_for(
    tokenizer_dir, tmp_path
):
    out = tmp_path / "live.jsonl"
    screen = run_in_terminal([sys.executable, str(HERE / "live_runner.py"), str(out), str(tokenizer_dir)])
    # before the rollout ended (0/1 on the bar), its finished turns and their tokens were on the bar
    drawn = screen.replace("\r", "\n").splitlines()
    during = [line for line in drawn if "0/1" in line and "turns=2" in line]
    assert during, repr(screen)
    assert "tokens=" in during[0] and "tokens=0," not in during[0]
    # the third turn took 3 s: the run said it waited for the engine, with the turns so far
    notice = next(line for line in drawn if "nothing finished in the last" in line)
    assert "1 rollouts in flight: 1 waiting for the engine to answer; 2 turns and" in notice, notice
    assert drawn.index(notice) < max(i for i, line in enumerate(drawn) if "1/1" in line)
    assert "1 rollouts (0 already done, 0 failed" in screen


def test_a_tau2_rollout_shows_the_agents_turns_and_tokens_before_it_ends(tokenizer_dir, tmp_path):
    """The tau2 quick start sat at 0/3 with no counter: a conversation with a simulated customer shows
    the agent's turns and tokens on the bar while it runs."""
    pytest.importorskip("tau2")
    out = tmp_path / "tau2.jsonl"
    screen = run_in_terminal(
        [sys.executable, str(HERE / "live_runner.py"), str(out), str(tokenizer_dir), "tau2"]
    )
    drawn = screen.replace("\r", "\n").splitlines()
    for turns in (1, 2):  # each agent turn counted while the customer still talks (0/1: not ended)
        during = [line for line in drawn if "0/1" in line and f"turns={turns}," in line]
        assert during and "tokens=0," not in during[0], repr(screen)
    assert any("1/1" in line and "turns=3," in line for line in drawn), repr(screen)
    assert "1 rollouts (0 already done, 0 failed" in screen
    assert "user_ended 1" in screen


class NeverAnswers(ScriptedEngine):
    """An engine that takes every request and never answers (a machine far too busy for it)."""

    async def generate(self, prompt_ids, sampling, *, max_new_tokens):
        await asyncio.Event().wait()


def test_rollouts_out_of_time_before_the_engine_answered_put_the_fix_on_the_summary_line(
    qwen_tokenizer, tmp_path
):
    environment = ArithmeticEnvironment()
    config = RunConfig(samples=1, concurrency=2, retries=0, progress=False)
    jobs = plan_jobs(environment, environment.tasks(2), config)
    execute = in_process(environment, NeverAnswers([]), qwen_tokenizer, limits=RolloutLimits(timeout_s=0.3))
    with ResultStore(tmp_path / "stalled.jsonl", fsync=False) as store:
        summary = run(run_jobs(jobs, execute, store, config))
    assert summary.engine_never_answered == 2
    line = summary.line()
    assert "2 of 2 rollouts ran out of time before the engine answered once" in line
    assert "raise --timeout or lower --concurrency" in line
