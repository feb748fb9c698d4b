"""The failure rule: a failure the policy can cause is scored, an infrastructure failure is masked.

Each path that reads a rollout's outcome is checked with real rollouts (scripted engine, real Qwen
tokenizer): the result, its JSON round trip, the trainer's group rule, the reward summary and resume.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import run
from strands.hooks import AfterModelCallEvent, BeforeModelCallEvent

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.arithmetic import ArithmeticEnvironment
from agentboost.errors import ConfigError
from agentboost.eval.evaluate import build_report, summary_text
from agentboost.outcomes import FailureRule, Outcome, RolloutResult, reward_summary
from agentboost.rollout.results import ResultStore
from agentboost.rollout.runner import RunConfig, in_process, plan_jobs, plan_keys, run_jobs
from agentboost.tokens.trajectory import TerminationReason
from agentboost.train.collect import step_results


class CrashingHook:
    """Raises inside the agent at ``event``: after a model turn, like an agent breaking on what the model
    wrote; before the first model call, like an agent that breaks before the policy acted."""

    def __init__(self, event: type) -> None:
        self.event = event

    def register_hooks(self, registry, **_):
        registry.add_callback(self.event, self.crash)

    def crash(self, event):
        raise RuntimeError("the agent broke")


class CrashingArithmetic(ArithmeticEnvironment):
    crash_at: type = AfterModelCallEvent

    def hooks(self, episode):
        return [CrashingHook(self.crash_at)]


class StalledEngine(ScriptedEngine):
    """Never answers within the rollout's timeout (an overloaded server)."""

    async def generate(self, prompt_ids, sampling, *, max_new_tokens):
        await asyncio.sleep(30)
        raise AssertionError("unreachable: the rollout's timeout ends the wait")


def episode(environment, engine, tokenizer, **options) -> RolloutResult:
    task = environment.tasks(1)[0]
    return run(environment.run_episode(task, engine, tokenizer, **options))


@pytest.fixture
def answer(say):
    return lambda: ScriptedEngine([say("Answer: 7")], cycle=True)


def test_an_agent_crash_after_a_model_turn_is_scored_with_the_failure_reward_not_masked(
    qwen_tokenizer, answer
):
    result = episode(CrashingArithmetic(), answer(), qwen_tokenizer)
    assert result.termination is TerminationReason.AGENT_ERROR and result.trajectory.generated_tokens > 0
    assert result.outcome is Outcome.SCORED and result.reward == 0.0 and result.policy_failure
    assert result.failure is None and result.reward_error is None
    assert result.reward_info == {"policy_failure": "agent_error"}  # says why it scored
    again = RolloutResult.from_dict(result.to_dict())  # what a results file and resume read back
    assert again.outcome is Outcome.SCORED and again.reward == 0.0 and again.policy_failure

    class Punishing(CrashingArithmetic):
        failure_rule = FailureRule(reward=-1.0)

    assert episode(Punishing(), answer(), qwen_tokenizer).reward == -1.0


def test_failures_the_policy_cannot_cause_stay_failed_and_masked(qwen_tokenizer, say, answer):
    class CrashesFirst(CrashingArithmetic):
        crash_at = BeforeModelCallEvent

    before = episode(CrashesFirst(), answer(), qwen_tokenizer)
    assert before.termination is TerminationReason.AGENT_ERROR and before.trajectory.generated_tokens == 0
    assert before.outcome is Outcome.FAILED and before.reward is None and before.failure == "agent_error"

    stalled = episode(
        ArithmeticEnvironment(),
        StalledEngine([say("x")]),
        qwen_tokenizer,
        limits=RolloutLimits(timeout_s=0.5),
    )
    assert stalled.termination is TerminationReason.ENGINE_TIMEOUT
    assert stalled.outcome is Outcome.FAILED and stalled.failure == "engine_timeout"

    class MasksEverything(CrashingArithmetic):
        failure_rule = FailureRule(policy=frozenset())

    masked = episode(MasksEverything(), answer(), qwen_tokenizer)
    assert masked.outcome is Outcome.FAILED and masked.reward is None


def test_the_trainer_and_reports_count_a_policy_failure_as_scored_and_mask_an_infrastructure_one(
    qwen_tokenizer, say, answer
):
    environment = ArithmeticEnvironment()
    won = episode(
        environment, ScriptedEngine([say(f"Answer: {environment.tasks(1)[0].ground_truth}")]), qwen_tokenizer
    )
    crashed = episode(CrashingArithmetic(), answer(), qwen_tokenizer)
    stalled = episode(
        environment, StalledEngine([say("x")]), qwen_tokenizer, limits=RolloutLimits(timeout_s=0.5)
    )
    assert won.reward == 1.0

    usable, metrics = step_results([won, crashed, stalled], max_failed_fraction=0.5)
    assert usable == [won, crashed]  # the crash stays in its group with reward 0; the stall is left out
    assert metrics["reward/mean"] == 0.5 and metrics["rollout/failed/engine_timeout"] == 1.0
    assert metrics["rollout/policy_failures"] == 1.0
    summary = reward_summary([won, crashed, stalled])
    assert (summary.scored, summary.policy_failures, summary.failed, summary.mean) == (2, 1, 1, 0.5)
    assert summary.failures == {"engine_timeout": 1}
    report = build_report([won, crashed, stalled], samples=3)  # what `agentboost eval` prints and writes
    assert (report["scored"], report["policy_failures"], report["coverage"]) == (2, 1, 2 / 3)
    assert "2 scored (1 policy failures at the failure reward), 0 unscorable, 1 failed" in summary_text(
        report
    )


def test_resume_keeps_a_policy_failure_and_runs_an_engine_timeout_again(
    qwen_tokenizer, say, answer, tmp_path
):
    def fill(environment, engine):
        config = RunConfig(samples=1, progress=False, retries=0)
        tasks = environment.tasks(1)
        identity = {"environment": "arithmetic", "tasks": 1}
        plan = plan_keys(environment, tasks, config)
        with ResultStore(tmp_path / f"{environment.name}.jsonl", identity=identity, plan=plan) as store:
            jobs = plan_jobs(environment, tasks, config)
            return run(run_jobs(jobs, in_process(environment, engine, qwen_tokenizer), store, config))

    crashed = CrashingArithmetic()
    first = fill(crashed, answer())
    assert first.completed == 1 and first.failed == 0 and first.terminations["agent_error"] == 1
    assert fill(crashed, answer()).skipped == 1  # scored: not run again

    class Impatient(ArithmeticEnvironment):
        name = "impatient"
        limits = RolloutLimits(timeout_s=0.5)

    stalled = fill(Impatient(), StalledEngine([say("x")]))
    assert stalled.failed == 1 and "engine_timeout" in stalled.first_failure
    assert "raise --timeout or lower --concurrency" in stalled.first_failure  # the cause and the fix
    again = fill(Impatient(), answer())
    assert again.skipped == 0 and again.completed == 1 and again.failed == 0


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"policy": frozenset({"timeout"})}, "normal endings are scored by the reward"),
        ({"policy": frozenset({"engine_error"})}, "engine or worker failures are never the policy's"),
        ({"policy": frozenset({"engine_timeout"})}, "never the policy's"),
        ({"policy": frozenset({"crashed"})}, "must be termination reasons"),
        ({"reward": float("nan")}, "finite number"),
        ({"reward": "0"}, "finite number"),
    ],
)
def test_a_failure_rule_names_only_failures_the_policy_can_cause(options, says):
    with pytest.raises(ConfigError, match=None) as raised:
        FailureRule(**options)
    assert says in str(raised.value)
