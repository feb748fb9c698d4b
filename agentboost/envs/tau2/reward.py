"""Rewards for tau2 rollouts: tau2's own evaluator, and the ToolRL-style reward as an option.

tau2's reward (the default) runs tau2's rule-based evaluators on the conversation converted to tau2's
message types, combined over the task's reward basis exactly as ``tau2.evaluator.evaluator`` does
(that module itself imports litellm, so the combination is made here from its parts): DB (the final
database, replayed from the recorded tool calls on a fresh environment, must equal the one the gold
actions produce), COMMUNICATE (each required string appears in an agent message), ENV_ASSERTION and
ACTION where a task asks for them. NL assertions need an LLM judge and are not evaluated.

The training reward (``strict``, :func:`score`) is tau2's reward, and every gold action done, and no
side effect (:mod:`agentboost.envs.tau2.integrity`: other customers' records read or written, writes
undone, refused writes, a needless transfer), on tasks the training split keeps; 0 otherwise.

The ToolRL-style reward (Qian et al., 2025, used by the single-turn "ticket" design) compares the
agent's tool calls with the gold action sequence: a format term in {0, 1} plus a correctness term
in [-3, 3], so it ranges over [-3, 4]. It never looks at the database, so a policy can score on it
without solving the task: it is offered for comparison, and both are always in the breakdown.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentboost.envs.tau2.integrity import EXCLUSIONS, gold_actions, side_effects, training_exclusion
from agentboost.envs.tau2.package import Domain, tau2_module
from agentboost.envs.tau2.tools import ToolLog

CLEAN_ENDINGS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")


def to_tau2_messages(
    messages: Sequence[Mapping[str, Any]], log: ToolLog, history: Sequence[Any] = ()
) -> list[Any]:
    """The rollout's conversation as tau2 messages, for tau2's evaluators.

    Text comes from the trajectory's chat view; tool calls and their results come from the tool log
    (what tau2 actually executed), each assistant tool-call message followed directly by its tool
    messages, as tau2's replay requires. Calls that never reached tau2 (malformed calls, unknown
    tools, calls dropped by a limit) changed nothing and are left out.
    """
    types = tau2_module("tau2.data_model.message")
    converted: list[Any] = list(history)
    placed: set[str] = set()
    for message in messages:
        role = message.get("role")
        content = message.get("content") or None
        if isinstance(content, str) and not content.strip():
            content = None
        if role == "user" and content is not None:
            converted.append(types.UserMessage(role="user", content=content))
        elif role == "assistant":
            calls = [
                log.calls_by_id[call["id"]]
                for call in message.get("tool_calls") or []
                if call.get("id") in log.calls_by_id
            ]
            if content is None and not calls:
                continue
            converted.append(
                types.AssistantMessage(role="assistant", content=content, tool_calls=calls or None)
            )
            for call in calls:
                converted.append(log.responses[call.id])
                placed.add(call.id)
    for (
        call
    ) in log.calls:  # executed but absent from the chat view (should not happen): keep the replay honest
        if call.id not in placed:
            converted.append(types.AssistantMessage(role="assistant", tool_calls=[call]))
            converted.append(log.responses[call.id])
    return converted


def tau2_evaluation(
    domain: Domain, task: Any, conversation: list[Any]
) -> tuple[float, dict[str, float], dict]:
    """tau2's reward for a finished conversation: (reward, numeric breakdown, facts)."""
    tasks = tau2_module("tau2.data_model.tasks")
    env_evaluator = tau2_module("tau2.evaluator.evaluator_env").EnvironmentEvaluator
    communicate_evaluator = tau2_module("tau2.evaluator.evaluator_communicate").CommunicateEvaluator
    action_evaluator = tau2_module("tau2.evaluator.evaluator_action").ActionEvaluator
    criteria = task.evaluation_criteria
    if criteria is None:
        return 1.0, {"tau2": 1.0}, {"note": "the task has no evaluation criteria"}

    raised: list[str] = []

    def constructor(solo_mode: bool = False) -> Any:
        environment = domain.fresh_environment()
        run_env_assertion = environment.run_env_assertion

        def checked(assertion: Any, raise_assertion_error: bool = True) -> bool:
            # tau2 checks each assertion on the rollout's end state with raise_assertion_error=False; an
            # assertion function that raises there (mock's assert_task_status on a task the agent never
            # created: "Task task_2 not found") asks about what the rollout did not make: not met. Left
            # to raise, it would leave the rollout unscored, which a policy can learn to aim for.
            try:
                return run_env_assertion(assertion, raise_assertion_error)
            except Exception as error:
                if raise_assertion_error:
                    raise
                raised.append(f"{assertion.func_name}: {type(error).__name__}: {error}")
                return False

        environment.run_env_assertion = checked
        return environment

    env_info = env_evaluator.calculate_reward(
        environment_constructor=constructor, task=task, full_trajectory=conversation, solo_mode=False
    )
    communicate_info = communicate_evaluator.calculate_reward(task=task, full_trajectory=conversation)
    action_info = action_evaluator.calculate_reward(task=task, full_trajectory=conversation)
    basis = set(criteria.reward_basis)
    reward = 1.0
    if basis & {tasks.RewardType.DB, tasks.RewardType.ENV_ASSERTION}:
        reward *= env_info.reward
    if tasks.RewardType.ACTION in basis:
        reward *= action_info.reward
    if tasks.RewardType.COMMUNICATE in basis:
        reward *= communicate_info.reward

    communicate_checks = communicate_info.communicate_checks or []
    action_checks = action_info.action_checks or []
    breakdown = {
        "tau2": reward,
        "db": float(env_info.db_check.db_reward) if env_info.db_check is not None else 1.0,
        "communicate": float(communicate_info.reward),
        "communicate_met": float(sum(check.met for check in communicate_checks)),
        "communicate_total": float(len(communicate_checks)),
        "actions_matched": float(sum(check.action_match for check in action_checks)),
        "actions_total": float(len(action_checks)),
    }
    if env_info.env_assertions:
        breakdown["env_assertions"] = float(all(check.met for check in env_info.env_assertions))
    facts: dict[str, Any] = {
        "reward_basis": sorted(item.value for item in criteria.reward_basis),
        "db_match": None if env_info.db_check is None else bool(env_info.db_check.db_match),
        "communicate_checks": [{"info": check.info, "met": bool(check.met)} for check in communicate_checks],
        "action_checks": [
            {
                "name": check.action.name,
                "arguments": check.action.arguments,
                "matched": bool(check.action_match),
            }
            for check in action_checks
        ],
    }
    if raised:
        facts["env_assertion_errors"] = raised
    if tasks.RewardType.NL_ASSERTION in basis:
        facts["unevaluated"] = "NL_ASSERTION (needs an LLM judge)"
    return reward, breakdown, facts


def score(
    domain: Domain,
    tau2_task: Any,
    conversation: list[Any],
    log: ToolLog,
    db: Any,
    *,
    clean: bool,
    predicted: Sequence[tuple[str, Mapping[str, Any]]],
    well_formed: bool,
    ending: str = "",
) -> tuple[dict[str, float], dict[str, Any]]:
    """Every reward mode's value for one finished conversation, with the parts (breakdown, facts).

    ``tau2``: tau2's reward (0 for a conversation cut short: ``clean`` False, ``ending`` says how).
    ``strict`` (the training reward): tau2's reward where every gold action was done, the task is not
    left out of training, and the rollout had no side effect (``integrity``); 0 otherwise, with the
    side effects listed in the facts. ``toolrl``: the ToolRL-style score of ``predicted`` calls.
    ``log`` holds the calls tau2 executed over ``db`` (the rollout's database, for record owners).
    """
    tau2_value, breakdown, facts = tau2_evaluation(domain, tau2_task, conversation)
    if not clean:
        facts["note"] = f"the conversation ended with {ending}; tau2 scores it 0"
        tau2_value = 0.0
    breakdown["tau2"] = tau2_value
    breakdown["ended_cleanly"] = float(clean)
    gold = [(action.name, action.arguments) for action in gold_actions(tau2_task)]
    breakdown.update(toolrl_reward(predicted, gold, well_formed=well_formed)[1])
    breakdown["tool_calls_executed"] = float(len(log.calls))
    effects = side_effects(domain, tau2_task, log, db)
    exclusion = training_exclusion(domain, tau2_task)
    all_actions = breakdown["actions_matched"] == breakdown["actions_total"]
    breakdown["side_effects"] = float(len(effects))
    breakdown["strict"] = tau2_value if all_actions and exclusion is None and not effects else 0.0
    facts["side_effects"] = effects
    if exclusion is not None:
        facts["training_exclusion"] = f"{exclusion}: {EXCLUSIONS[exclusion]}"
    return breakdown, facts


# --- ToolRL-style reward ---------------------------------------------------------------------------


def _jaccard(left: set[Any], right: set[Any]) -> float:
    if not left and not right:
        return 1.0
    return len(left & right) / len(left | right)


def call_arguments(arguments: Mapping[str, Any] | str | None) -> Mapping[str, Any]:
    """A tool call's arguments as an object: a JSON string (as some clients send) parsed; anything that
    is not an object reads as no arguments."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return {}
    return arguments if isinstance(arguments, Mapping) else {}


def toolrl_reward(
    predicted: Sequence[tuple[str, Mapping[str, Any]]],
    gold: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    well_formed: bool,
) -> tuple[float, dict[str, float]]:
    """ToolRL-style reward in [-3, 4]: format (0/1) + correctness (6 * match / max_match - 3).

    match = Jaccard of the tool-name sets + for each gold call paired with a predicted call of the
    same name (each predicted call used once, best first): Jaccard of the argument-key sets + the
    number of gold arguments whose values are equal. max_match = 1 + len(gold) + number of gold
    arguments. An unpaired gold call scores 0 on its keys and values.
    """
    names = _jaccard({name for name, _ in predicted}, {name for name, _ in gold})
    unused = list(range(len(predicted)))
    keys_score = values_score = 0.0
    for gold_name, gold_arguments in gold:
        best, best_score = None, (-1.0, -1.0)
        for index in unused:
            name, arguments = predicted[index]
            if name != gold_name:
                continue
            key_match = _jaccard(set(arguments), set(gold_arguments))
            value_match = float(
                sum(key in arguments and arguments[key] == value for key, value in gold_arguments.items())
            )
            if (key_match + value_match, key_match) > (sum(best_score), best_score[0]):
                best, best_score = index, (key_match, value_match)
        if best is not None:
            unused.remove(best)
            keys_score += best_score[0]
            values_score += best_score[1]
    max_match = 1 + len(gold) + sum(len(arguments) for _, arguments in gold)
    correctness = 6.0 * (names + keys_score + values_score) / max_match - 3.0
    format_term = 1.0 if well_formed else 0.0
    return format_term + correctness, {
        "toolrl": format_term + correctness,
        "toolrl_format": format_term,
        "toolrl_correct": correctness,
        "toolrl_names": names,
        "toolrl_keys": keys_score,
        "toolrl_values": values_score,
    }
