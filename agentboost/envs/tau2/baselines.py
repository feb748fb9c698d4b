"""Policies that do no work, run through the real environment to see what a reward pays them.

A reward a do-nothing policy can win is one RL will find. Each policy is a scripted agent (no model)
driven through :meth:`Tau2Environment.run_episode` with a scripted customer, exactly like a trained one:

``do_nothing``       says one polite line; the customer ends the conversation (``###STOP###``)
``always_transfer``  calls ``transfer_to_human_agents`` on its first turn (ends ``env_stopped``)
``always_end``       ticket mode: answers the ticket with one closing line and nothing else

    python -m agentboost.envs.tau2.baselines            # every policy x reward x domain, all tasks

prints each policy's mean reward per domain and reward mode (figures in docs/tau2.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import RolloutResult
from agentboost.envs.tau2.package import load_domain

POLICIES = ("do_nothing", "always_transfer", "always_end")
POLITE_LINE = "Thank you for reaching out. I am sorry, but I am unable to help with that."
CUSTOMER = ("Hi, I need some help with my booking.", "Thank you. ###STOP###")


def _turn(tokenizer: Any, text: str) -> list[int]:
    stop = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    end = end if isinstance(end, int) and end != tokenizer.unk_token_id else stop
    return [*tokenizer.encode(text, add_special_tokens=False), end]


def policy_environment(policy: str, domain: str, reward: str, tokenizer: Any) -> Any:
    """The environment a policy runs in (ticket mode for ``always_end``; a scripted customer otherwise)."""
    from agentboost.envs.tau2.environment import Tau2Environment

    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "always_end":
        return Tau2Environment(domain=domain, mode="ticket", reward=reward)
    customer = ScriptedEngine([_turn(tokenizer, text) for text in CUSTOMER])
    return Tau2Environment(
        domain=domain, reward=reward, simulator_engine=customer, simulator_tokenizer=tokenizer
    )


def run_policy(
    policy: str,
    domain: str,
    reward: str,
    tokenizer: Any,
    task_ids: Sequence[str] | None = None,
    *,
    split: str | None = None,
) -> list[RolloutResult]:
    """One rollout of ``policy`` on each task (every task of the domain by default); ``split`` is the
    split the tasks count as drawn from (it picks the ``auto`` reward)."""
    ids = list(task_ids) if task_ids is not None else load_domain(domain).task_ids("all")
    if policy == "always_transfer":
        call = {"name": "transfer_to_human_agents", "arguments": {"summary": "The customer needs help."}}
        text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    else:
        text = POLITE_LINE

    async def run_all() -> list[RolloutResult]:
        results = []
        for tau2_id in ids:  # a fresh customer per rollout: its script starts over
            environment = policy_environment(policy, domain, reward, tokenizer)
            engine = ScriptedEngine([_turn(tokenizer, text)], cycle=True)
            task = environment.task(tau2_id, split=split)
            results.append(await environment.run_episode(task, engine, tokenizer))
        return results

    return asyncio.run(run_all())


BREAKDOWN_OF = {"tau2": "tau2", "strict": "strict", "toolrl": "toolrl"}
"""Every reward mode's value is in each rollout's breakdown, so one run per policy measures them all."""


def main() -> int:
    from agentboost.models.tokenizers import load_qwen3_tokenizer

    tokenizer = load_qwen3_tokenizer()
    print("| policy | domain | reward | mean reward | reward >= 1 on | coverage |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for policy in POLICIES:
        for domain in ("airline", "retail"):
            results = run_policy(policy, domain, "tau2", tokenizer)
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
