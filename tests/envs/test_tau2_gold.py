"""Proof that the reward is tau2's: on EVERY airline and retail task, a scripted agent that performs the
gold actions (as tool calls through Strands, our provider and our token buffer) and says the required
information, with a scripted customer, earns 1.0; the same agent with one action changed earns 0."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.tau2.environment import Tau2Environment
from agentboost.envs.tau2.package import load_domain
from agentboost.tokens.trajectory import TerminationReason

DOMAINS = ("airline", "retail")


def _task_ids() -> list[tuple[str, str]]:
    return [(domain, task_id) for domain in DOMAINS for task_id in load_domain(domain).task_ids("all")]


def call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def changed(domain: str, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gold actions with ONE action changed so that the final database must differ.

    With a write action that succeeds in the gold run: the last such write's first text argument is altered
    (a wrong id, seat, reason...). Without one (some gold writes fail on purpose, e.g. a refund the policy
    refuses): one database write the gold never makes comes first (a certificate, an address change).
    """
    tau2_domain = load_domain(domain)
    actions = [dict(action, arguments=dict(action["arguments"])) for action in actions]
    succeeded = _succeeding(tau2_domain, actions)
    writes = [
        index
        for index, action in enumerate(actions)
        if action["name"] in tau2_domain.write_tools and succeeded[index]
    ]
    if writes:
        arguments = actions[writes[-1]]["arguments"]
        key = next((k for k, v in arguments.items() if isinstance(v, str)), None)
        if key is not None:
            arguments[key] += "-changed"
        else:
            key = next(iter(arguments))
            arguments[key] = [] if isinstance(arguments[key], list) else None
        return actions
    user_id = next(iter(tau2_domain.fresh_environment().tools.db.users))
    if domain == "airline":
        extra = {"name": "send_certificate", "arguments": {"user_id": user_id, "amount": 500}}
    else:
        address = {"address1": "1 Test St", "address2": "", "city": "X", "state": "CA", "country": "USA"}
        extra = {"name": "modify_user_address", "arguments": {"user_id": user_id, **address, "zip": "00000"}}
    return [extra, *actions]  # first: a transfer to a human at the end stops the rollout


def _succeeding(tau2_domain: Any, actions: list[dict[str, Any]]) -> list[bool]:
    """Whether each gold action succeeds when the gold actions are replayed in order on a fresh database."""
    from agentboost.envs.tau2.package import tau2_module

    message_types = tau2_module("tau2.data_model.message")
    environment = tau2_domain.fresh_environment()
    outcomes = []
    for index, action in enumerate(actions):
        call = message_types.ToolCall(
            id=f"gold-{index}", name=action["name"], arguments=action["arguments"], requestor="assistant"
        )
        outcomes.append(not environment.get_response(call).error)
    return outcomes


def scripted_rollout(qwen_tokenizer, say, domain: str, tau2_id: str, actions: list[dict[str, Any]]):
    customer = ScriptedEngine([say("Hi, I need some help."), say("Thank you. ###STOP###")])
    env = Tau2Environment(
        domain=domain, simulator_engine=customer, simulator_tokenizer=qwen_tokenizer, baselines=False
    )
    task = env.task(tau2_id)
    info = " ".join(env.domain.task(tau2_id).evaluation_criteria.communicate_info or [])
    turns = [call(action["name"], action["arguments"]) for action in actions] or [""]
    turns[0] = f"{info}\n{turns[0]}" if info else turns[0]  # said up front: a transfer ends the rollout
    turns.append("Is there anything else I can help you with?")
    engine = ScriptedEngine([say(turn) for turn in turns if turn])
    return asyncio.run(env.run_episode(task, engine, qwen_tokenizer))


@pytest.mark.slow
@pytest.mark.parametrize(("domain", "tau2_id"), _task_ids())
def test_gold_actions_earn_one_and_one_changed_action_earns_zero(qwen_tokenizer, say, domain, tau2_id):
    gold = Tau2Environment(domain=domain).task(tau2_id).ground_truth
    result = scripted_rollout(qwen_tokenizer, say, domain, tau2_id, gold)
    assert result.termination in (TerminationReason.USER_ENDED, TerminationReason.ENV_STOPPED)
    assert result.reward == 1.0, result.reward_info
    assert result.reward_breakdown["db"] == 1.0
    assert result.reward_breakdown["actions_matched"] == result.reward_breakdown["actions_total"]
    assert result.reward_breakdown["tool_calls_executed"] == len(gold)

    wrong = scripted_rollout(qwen_tokenizer, say, domain, tau2_id, changed(domain, gold))
    assert wrong.reward == 0.0, wrong.reward_info
    assert wrong.reward_breakdown["db"] == 0.0 and wrong.reward_info["db_match"] is False


def test_every_task_is_covered():
    assert len(_task_ids()) == 50 + 114
