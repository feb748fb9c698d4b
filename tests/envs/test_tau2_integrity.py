"""The training reward pays the task and only the task: every escape an audit found (harmful or
pointless side actions on top of the gold, lookups then a transfer) replayed through tau2's own
evaluator on real tau2 data earns 0 under ``strict``, while tau2's reward pays it; the gold still earns 1.

The sample below runs in CI (a few tasks per domain). The same escapes over every airline and retail
train task run with AGENTBOOST_LONG_TESTS=1 (tens of minutes; figures in docs/tau2.md).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.tau2.baselines import (
    BASELINES,
    SAY,
    baseline_rewards,
    baseline_steps,
    gold_steps,
    scored,
)
from agentboost.envs.tau2.environment import Tau2Environment
from agentboost.envs.tau2.integrity import EXCLUSIONS, gold_profile, training_exclusion
from agentboost.envs.tau2.package import load_domain
from agentboost.envs.tau2.tools import TRANSFER_TOOL
from agentboost.eval.evaluate import build_report, summary_text

LONG = os.environ.get("AGENTBOOST_LONG_TESTS") == "1"
SAMPLE = {"airline": ("9", "14"), "retail": ("0", "2")}  # gold: writes, no transfer; 14 and 2 a statement too
NO_EFFECT = {"airline": ("1", "4"), "retail": ("10", "25")}  # gold: lookups (10: then a transfer), no write

ESCAPES = {
    "read_others": {"other_customer_read"},
    "write_other_undone": {"other_customer_write", "write_not_in_gold"},  # the second: the writes succeeded
    "write_own_undone": {"write_not_in_gold"},
    "transfer_at_end": {"transfer_not_in_gold"},
    "refused_write": {"refused_write"},
}
"""Each escape: the gold plus one side action, and the side-effect kinds the training reward names."""


def strangers(db: Any, domain: Any, tau2_task: Any, count: int) -> list[str]:
    """``count`` customers the task is not about."""
    customers = gold_profile(domain, tau2_task).customers
    return [user_id for user_id in db.users if user_id not in customers][:count]


def change_and_restore(db: Any, domain: Any, user_id: str) -> list[tuple[str, Any]]:
    """Two writes on ``user_id``'s records that cancel out: the final database is unchanged."""
    user = db.users[user_id]
    if domain.name == "retail":
        original = user.address.model_dump()
        moved = {**original, "address1": "1 Elsewhere Road", "zip": "00000"}
        return [
            ("modify_user_address", {"user_id": user_id, **moved}),
            ("modify_user_address", {"user_id": user_id, **original}),
        ]
    reservation = next(r for r in user.reservations if db.reservations[r].status != "cancelled")
    passengers = [p.model_dump() for p in db.reservations[reservation].passengers]
    renamed = [{**passengers[0], "first_name": "Mallory"}, *passengers[1:]]
    return [
        ("update_reservation_passengers", {"reservation_id": reservation, "passengers": renamed}),
        ("update_reservation_passengers", {"reservation_id": reservation, "passengers": passengers}),
    ]


def own_customer(db: Any, domain: Any, tau2_task: Any) -> str:
    """A customer the task is about who owns records (orders or reservations)."""
    records = "orders" if domain.name == "retail" else "reservations"
    customers = sorted(gold_profile(domain, tau2_task).customers)
    return next(user_id for user_id in customers if getattr(db.users[user_id], records))


def escape_steps(db: Any, domain: Any, tau2_task: Any, escape: str) -> list[tuple[str, Any]]:
    """The gold with one side action (see :data:`ESCAPES`), as scripted steps (``db``: the task's
    starting database, read for ids)."""
    gold = gold_steps(tau2_task)
    if escape == "read_others":
        reads = [("get_user_details", {"user_id": user}) for user in strangers(db, domain, tau2_task, 3)]
        return [*reads, *gold]
    if escape == "write_other_undone":
        return [*change_and_restore(db, domain, strangers(db, domain, tau2_task, 1)[0]), *gold]
    if escape == "write_own_undone":
        return [*change_and_restore(db, domain, own_customer(db, domain, tau2_task)), *gold]
    if escape == "transfer_at_end":
        return [*gold, (TRANSFER_TOOL, {"summary": "The customer may need more help."})]
    if escape == "refused_write":
        refused = (
            ("cancel_reservation", {"reservation_id": "ZZZZZZ"})
            if domain.name == "airline"
            else ("cancel_pending_order", {"order_id": "#W0000000", "reason": "no longer needed"})
        )
        return [refused, *gold]
    raise ValueError(escape)


def kinds(facts: dict) -> set[str]:
    return {effect["kind"] for effect in facts["side_effects"]}


def sample() -> list[tuple[str, str]]:
    return [(domain, task_id) for domain, ids in SAMPLE.items() for task_id in ids]


@pytest.mark.parametrize(("domain_name", "task_id"), sample())
def test_every_escape_wins_tau2_but_earns_nothing_under_the_training_reward(domain_name, task_id):
    domain = load_domain(domain_name)
    tau2_task = domain.task(task_id)
    assert training_exclusion(domain, tau2_task) is None
    db = domain.task_environment(tau2_task).tools.db
    gold, facts = scored(domain, tau2_task, gold_steps(tau2_task))
    assert (gold["tau2"], gold["strict"], gold["side_effects"]) == (1.0, 1.0, 0.0), facts
    for escape, named in ESCAPES.items():
        breakdown, facts = scored(domain, tau2_task, escape_steps(db, domain, tau2_task, escape))
        assert breakdown["tau2"] == 1.0, (escape, facts)  # tau2's reward cannot see it: a real escape
        assert breakdown["strict"] == 0.0 and named == kinds(facts), (escape, facts)


@pytest.mark.parametrize("domain_name", ["airline", "retail"])
def test_tasks_lookups_then_a_transfer_would_win_are_out_of_the_training_split(domain_name):
    domain = load_domain(domain_name)
    env = Tau2Environment(domain=domain_name)
    excluded = env.training_exclusions("train")
    train = {task.metadata["tau2_id"] for task in env.tasks(split="train")}
    assert train.isdisjoint(excluded) and set(excluded) | train == set(domain.task_ids("train"))
    assert set(excluded.values()) <= set(EXCLUSIONS)
    for task_id in NO_EFFECT[domain_name]:
        assert excluded[task_id] == "no_write"
        tau2_task = domain.task(task_id)
        breakdown, facts = scored(domain, tau2_task, baseline_steps(domain, tau2_task, "lookup_transfer"))
        assert breakdown["tau2"] == 1.0 and breakdown["strict"] == 0.0, facts  # tau2 pays it; training never
        assert facts["training_exclusion"].startswith("no_write")


def test_the_environment_reward_costs_a_side_effect_and_records_the_baselines(qwen_tokenizer, say):
    """Through the whole stack (Strands agent, provider, tools, the environment's reward): the gold
    plus a read of another customer's profile earns tau2's 1.0 but the training reward's 0, with the
    side effect named; the baselines recorded beside it are what those scripted policies earn."""
    domain = load_domain("retail")
    tau2_task = domain.task("0")
    harm = ("get_user_details", {"user_id": gold_profile(domain, tau2_task).stranger})
    turns = [
        f"<tool_call>\n{json.dumps({'name': tool, 'arguments': arguments})}\n</tool_call>"
        for tool, arguments in [harm, *gold_steps(tau2_task)]
        if tool != SAY
    ]
    customer = ScriptedEngine([say("Hi, I need some help."), say("Thank you. ###STOP###")])
    env = Tau2Environment(domain="retail", simulator_engine=customer, simulator_tokenizer=qwen_tokenizer)
    agent = ScriptedEngine([say(turn) for turn in [*turns, "Is there anything else?"]])
    result = asyncio.run(env.run_episode(env.task("0", split="train"), agent, qwen_tokenizer))
    assert result.reward_breakdown["tau2"] == 1.0 and result.reward == 0.0, result.reward_info
    assert result.reward_info["reward"] == "strict"
    assert [effect["kind"] for effect in result.reward_info["side_effects"]] == ["other_customer_read"]
    expected = baseline_rewards(domain, tau2_task)
    assert {name: result.reward_breakdown[f"{name}_baseline"] for name in BASELINES} == {
        name: expected[name]["strict"] for name in BASELINES
    }
    assert expected["gold_harm"] == {"tau2": 1.0, "strict": 0.0, "toolrl": pytest.approx(3.925)}
    report = build_report([result])
    assert report["gold_harm_baseline"] == 0.0
    assert (
        "mean reward 0.000 (baselines: do-nothing 0.000, lookup-transfer 0.000, gold-harm 0.000)"
        in summary_text(report)
    )

    quiet = Tau2Environment(domain="retail", simulator_engine=customer, baselines=False)
    assert quiet.baselines is False


@pytest.mark.skipif(not LONG, reason="every train task: tens of minutes; set AGENTBOOST_LONG_TESTS=1")
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("domain_name", ["airline", "retail"])
def test_no_escape_wins_any_train_task(domain_name):
    """Every escape and baseline on every train task of the domain: tau2's reward pays some, the
    training reward none; the gold earns 1.0 under both (prints the counts docs/tau2.md quotes)."""
    domain = load_domain(domain_name)
    train_ids = domain.task_ids("train")
    wins: dict[str, dict[str, list[str]]] = {"tau2": {}, "strict": {}}
    for task_id in train_ids:
        tau2_task = domain.task(task_id)
        db = domain.task_environment(tau2_task).tools.db
        gold, facts = scored(domain, tau2_task, gold_steps(tau2_task))
        assert gold["tau2"] == 1.0, (task_id, facts)
        kept = training_exclusion(domain, tau2_task) is None
        assert gold["strict"] == float(kept) and gold["side_effects"] == 0.0, (task_id, facts)
        runs = {name: baseline_steps(domain, tau2_task, name) for name in BASELINES}
        for escape in ESCAPES:
            if escape == "transfer_at_end" and gold_profile(domain, tau2_task).transfers:
                continue  # the gold transfers: a transfer is no side action here
            try:
                runs[escape] = escape_steps(db, domain, tau2_task, escape)
            except StopIteration:  # the customer owns no record to change
                continue
        for name, steps in runs.items():
            breakdown = scored(domain, tau2_task, steps)[0]
            for mode in ("tau2", "strict"):
                if breakdown[mode] == 1.0:
                    wins[mode].setdefault(name, []).append(task_id)
    print(f"\n{domain_name}: {len(train_ids)} train tasks, wins (reward 1.0) per escape:")
    for mode, by_name in wins.items():
        print(f"  {mode}: " + ", ".join(f"{name} {len(ids)}" for name, ids in by_name.items()))
    assert wins["strict"] == {}
