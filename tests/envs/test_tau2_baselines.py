"""Policies that do no work earn nothing under the default training reward, and tau2's own reward
(kept for evaluation, with the do-nothing baseline beside it) pays them what tau2 pays them."""

from __future__ import annotations

import pytest

from agentboost.envs.tau2.baselines import POLICIES, run_policy
from agentboost.envs.tau2.environment import Tau2Environment
from agentboost.envs.tau2.integrity import training_exclusion
from agentboost.envs.tau2.package import load_domain, scenario_text
from agentboost.eval.evaluate import build_report, summary_text

# tau2's own reward pays a do-nothing policy on these many tasks (the gold changes nothing, says nothing)
TAU2_DO_NOTHING_WINS = {"airline": (19, 50), "retail": (7, 114)}


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_splits_are_disjoint_by_id_and_text_and_training_leaves_out_tasks_with_nothing_to_learn(domain):
    env = Tau2Environment(domain=domain)  # reward "auto": strict on the train split, tau2 elsewhere
    train, test = env.tasks(split="train"), env.tasks(split="test")
    packaged = load_domain(domain)
    assert {t.id for t in train}.isdisjoint(t.id for t in test)
    text = {t.id: scenario_text(packaged.task(t.metadata["tau2_id"])) for t in [*train, *test]}
    assert {text[t.id] for t in train}.isdisjoint(text[t.id] for t in test)
    assert all(training_exclusion(packaged, packaged.task(t.metadata["tau2_id"])) is None for t in train)
    left_out = [i for i in packaged.task_ids("train") if training_exclusion(packaged, packaged.task(i))]
    assert len(train) + len(left_out) == len(packaged.task_ids("train")) and left_out  # 13 airline, 5 retail
    assert len(test) == len(packaged.task_ids("test"))  # evaluation keeps every task
    assert (env.reward_for("train"), env.reward_for("test"), env.reward_for(None)) == (
        "strict",
        "tau2",
        "tau2",
    )


def test_do_nothing_policies_win_tau2_but_not_the_training_reward_on_sample_tasks(qwen_tokenizer):
    # airline 0 and 1: the gold leaves the database unchanged and requires no statement
    for policy in POLICIES:
        trained = run_policy(policy, "airline", "auto", qwen_tokenizer, ["0", "1", "2"], split="train")
        assert [r.reward for r in trained] == [0.0, 0.0, 0.0], policy
        assert [r.reward_breakdown["tau2"] for r in trained] == [1.0, 1.0, 0.0], policy
        evaluated = run_policy(policy, "airline", "auto", qwen_tokenizer, ["0", "1", "2"], split="test")
        assert [r.reward for r in evaluated] == [1.0, 1.0, 0.0], policy
        report = build_report(evaluated)
        assert report["do_nothing_baseline"] == pytest.approx(2 / 3)
        baselines = "(baselines: do-nothing 0.667, lookup-transfer 0.667, gold-harm 1.000)"
        assert f"mean reward 0.667 {baselines}" in summary_text(report)  # tau2 pays all three
        baselines = "(baselines: do-nothing 0.000, lookup-transfer 0.000, gold-harm 0.000)"
        assert f"mean reward 0.000 {baselines}" in summary_text(build_report(trained))


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 50 or 114 rollouts: ~2 s each idle, far more on a shared machine
@pytest.mark.parametrize("domain", ["airline", "retail"])
@pytest.mark.parametrize("policy", POLICIES)
def test_every_task_pays_nothing_to_policies_that_do_nothing_under_the_training_reward(
    qwen_tokenizer, policy, domain
):
    results = run_policy(policy, domain, "auto", qwen_tokenizer, split="train", baselines=False)
    assert len(results) == TAU2_DO_NOTHING_WINS[domain][1] and all(r.reward is not None for r in results)
    assert sum(r.reward for r in results) == 0.0  # mean 0 on all tasks under the default training reward
    wins = sum(r.reward_breakdown["tau2"] == 1.0 for r in results)  # tau2's own reward, as tau2 defines it
    assert (wins, len(results)) == TAU2_DO_NOTHING_WINS[domain]
