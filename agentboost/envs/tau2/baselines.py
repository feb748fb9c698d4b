"""Policies that do no work, run through the real environment to see what a reward pays them.

A reward a do-nothing policy can win is one RL will find. Each policy is a scripted agent (no model)
driven through :meth:`Tau2Environment.run_episode` with a scripted customer, exactly like a trained one:

``do_nothing``       says one polite line; the customer ends the conversation (``###STOP###``)
``always_transfer``  calls ``transfer_to_human_agents`` on its first turn (ends ``env_stopped``)
``always_end``       ticket mode: answers the ticket with one closing line and nothing else

    python -m agentboost.envs.tau2.baselines            # every policy x reward x domain, all tasks

prints each policy's mean reward per domain and reward mode (figures in docs/tau2.md).

Beside every reward the environment also records three baselines (:data:`BASELINES`): scripted
conversations built directly in tau2's message types (no Strands, no model) and scored by the same
reward, once per task per process.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import RolloutResult
from agentboost.envs.tau2.integrity import gold_actions, gold_profile
from agentboost.envs.tau2.package import Domain, load_domain, tau2_module
from agentboost.envs.tau2.reward import score
from agentboost.envs.tau2.simulator import AGENT_GREETING
from agentboost.envs.tau2.tools import TRANSFER_TOOL, ToolLog
from agentboost.errors import ConfigError
from agentboost.tokens.tokenizer import Tokenizer

POLICIES = ("do_nothing", "always_transfer", "always_end")
POLITE_LINE = "Thank you for reaching out. I am sorry, but I am unable to help with that."
CUSTOMER = ("Hi, I need some help with my booking.", "Thank you. ###STOP###")


def _turn(tokenizer: Tokenizer, text: str) -> list[int]:
    stop = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    if stop is None:
        raise ConfigError("the tokenizer has neither an end-of-sequence nor a padding token to end a turn")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    end = end if isinstance(end, int) and end != tokenizer.unk_token_id else stop
    return [*tokenizer.encode(text, add_special_tokens=False), end]


def policy_environment(
    policy: str, domain: str, reward: str, tokenizer: Tokenizer, *, baselines: bool = True
) -> Any:
    """The environment a policy runs in (ticket mode for ``always_end``; a scripted customer otherwise)."""
    from agentboost.envs.tau2.environment import Tau2Environment

    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "always_end":
        return Tau2Environment(domain=domain, mode="ticket", reward=reward, baselines=baselines)
    customer = ScriptedEngine([_turn(tokenizer, text) for text in CUSTOMER])
    return Tau2Environment(
        domain=domain,
        reward=reward,
        simulator_engine=customer,
        simulator_tokenizer=tokenizer,
        baselines=baselines,
    )


def run_policy(
    policy: str,
    domain: str,
    reward: str,
    tokenizer: Tokenizer,
    task_ids: Sequence[str] | None = None,
    *,
    split: str | None = None,
    baselines: bool = True,
) -> list[RolloutResult]:
    """One rollout of ``policy`` on each task (every task of the domain by default); ``split`` is the
    split the tasks count as drawn from (it picks the ``auto`` reward); ``baselines`` as in
    :class:`Tau2Environment`."""
    ids = list(task_ids) if task_ids is not None else load_domain(domain).task_ids("all")
    if policy == "always_transfer":
        call = {"name": "transfer_to_human_agents", "arguments": {"summary": "The customer needs help."}}
        text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    else:
        text = POLITE_LINE

    async def run_all() -> list[RolloutResult]:
        results = []
        for tau2_id in ids:  # a fresh customer per rollout: its script starts over
            environment = policy_environment(policy, domain, reward, tokenizer, baselines=baselines)
            engine = ScriptedEngine([_turn(tokenizer, text)], cycle=True)
            task = environment.task(tau2_id, split=split)
            results.append(await environment.run_episode(task, engine, tokenizer))
        return results

    return asyncio.run(run_all())


# --- the baselines recorded beside every reward ---------------------------------------------------

BASELINES = ("do_nothing", "lookup_transfer", "gold_harm")
"""Scripted conversations scored beside every rollout (breakdown ``<name>_baseline``):

``do_nothing``       one polite refusal, then the customer leaves
``lookup_transfer``  the gold's read-only calls, then a transfer to a human agent
``gold_harm``        the gold (its statement said, its actions done) after reading another
                     customer's profile: what a reward that ignores side effects pays for harm
"""
BASELINE_SUMMARY = "The customer needs help that I cannot give."

_BASELINE_REWARDS: dict[tuple[str, str], dict[str, dict[str, float]]] = {}


SAY = "say"
"""A step of :func:`scripted_conversation` that is agent text, not a tool call: ``(SAY, text)``."""


def scripted_conversation(
    domain: Domain, tau2_task: Any, steps: Sequence[tuple[str, Any]]
) -> tuple[list[Any], ToolLog, Any]:
    """A conversation of scripted agent steps on a task, in tau2's message types, with its tool log and
    final database: each step ``(tool, arguments)`` is executed by tau2 on the task's starting database,
    ``(SAY, text)`` is agent text. After the greeting the customer asks for help; the conversation ends
    at a transfer to a human agent, or after the last step with the customer leaving (``###STOP###``)."""
    types = tau2_module("tau2.data_model.message")
    environment = domain.task_environment(tau2_task)
    log = ToolLog()
    history = list(tau2_task.initial_state.message_history or []) if tau2_task.initial_state else []
    conversation = [
        *history,
        types.AssistantMessage(role="assistant", content=AGENT_GREETING),
        types.UserMessage(role="user", content="Hi, I need some help."),
    ]
    for tool, argument in steps:
        if tool == SAY:
            conversation.append(types.AssistantMessage(role="assistant", content=str(argument)))
            continue
        call = types.ToolCall(
            id=f"call-{len(log.calls)}", name=tool, arguments=argument, requestor="assistant"
        )
        response = environment.get_response(call)
        log.calls.append(call)
        log.responses[call.id] = response
        conversation.extend([types.AssistantMessage(role="assistant", tool_calls=[call]), response])
        if tool == TRANSFER_TOOL and not response.error:
            return conversation, log, environment.tools.db
    conversation.append(types.AssistantMessage(role="assistant", content="Is there anything else?"))
    conversation.append(types.UserMessage(role="user", content="###STOP###"))
    return conversation, log, environment.tools.db


def gold_steps(tau2_task: Any) -> list[tuple[str, Any]]:
    """The gold as scripted steps: the required statement first (a gold transfer ends the
    conversation), then every gold action."""
    criteria = tau2_task.evaluation_criteria
    statement = " ".join(criteria.communicate_info or []) if criteria else ""
    actions = [(action.name, dict(action.arguments)) for action in gold_actions(tau2_task)]
    return [(SAY, statement), *actions] if statement else actions


def baseline_steps(domain: Domain, tau2_task: Any, name: str) -> list[tuple[str, Any]]:
    """The scripted steps of one baseline (see :data:`BASELINES`)."""
    if name == "do_nothing":
        return [(SAY, POLITE_LINE)]
    if name == "lookup_transfer":
        reads = [
            (action.name, dict(action.arguments))
            for action in gold_actions(tau2_task)
            if action.name not in domain.write_tools and action.name != TRANSFER_TOOL
        ]
        return [*reads, (TRANSFER_TOOL, {"summary": BASELINE_SUMMARY})]
    if name == "gold_harm":
        stranger = gold_profile(domain, tau2_task).stranger
        if stranger is None or "get_user_details" not in domain.tool_names:  # mock: no one to harm
            return gold_steps(tau2_task)
        return [("get_user_details", {"user_id": stranger}), *gold_steps(tau2_task)]
    raise ValueError(f"baseline must be one of {', '.join(BASELINES)}, got {name!r}")


def scored(domain: Domain, tau2_task: Any, steps: Sequence[tuple[str, Any]]) -> tuple[dict[str, float], dict]:
    """Every reward mode's value (breakdown, facts) for a scripted conversation (a clean ending)."""
    conversation, log, db = scripted_conversation(domain, tau2_task, steps)
    predicted = [(call.name, call.arguments) for call in log.calls]
    return score(domain, tau2_task, conversation, log, db, clean=True, predicted=predicted, well_formed=True)


def baseline_rewards(domain: Domain, tau2_task: Any) -> dict[str, dict[str, float]]:
    """Each baseline's value under every reward mode (``tau2``, ``strict``, ``toolrl``) on this task:
    one tau2 evaluation per baseline, computed once per task and cached per process."""
    key = (domain.name, tau2_task.id)
    if key not in _BASELINE_REWARDS:
        values = {}
        for name in BASELINES:
            breakdown, _ = scored(domain, tau2_task, baseline_steps(domain, tau2_task, name))
            values[name] = {mode: breakdown[mode] for mode in ("tau2", "strict", "toolrl")}
        _BASELINE_REWARDS[key] = values
    return _BASELINE_REWARDS[key]


BREAKDOWN_OF = {"tau2": "tau2", "strict": "strict", "toolrl": "toolrl"}
"""Every reward mode's value is in each rollout's breakdown, so one run per policy measures them all."""


def main() -> int:
    from agentboost.models.tokenizers import load_qwen3_tokenizer

    tokenizer = load_qwen3_tokenizer()
    print("| policy | domain | reward | mean reward | reward >= 1 on | coverage |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for policy in POLICIES:
        for domain in ("airline", "retail"):
            results = run_policy(policy, domain, "tau2", tokenizer, baselines=False)
            scored = [r for r in results if r.reward is not None]
            for reward, key in BREAKDOWN_OF.items():
                values = [r.reward_breakdown[key] for r in scored]
                mean = sum(values) / len(values) if values else float("nan")
                wins = sum(value >= 1.0 for value in values)
                print(
                    f"| {policy} | {domain} | {reward} | {mean:.3f} | {wins}/{len(results)} | "
                    f"{len(scored)}/{len(results)} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
