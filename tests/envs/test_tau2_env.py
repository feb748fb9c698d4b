"""The tau2 environment end to end: scripted agent and customer through Strands, the provider and the
token buffer, on mock and a few airline/retail tasks, and every documented way a conversation ends."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import Environment, Episode
from agentboost.envs.registry import make_environment
from agentboost.envs.task import Task
from agentboost.envs.tau2.environment import OPENING_PLACEHOLDER, Tau2Environment
from agentboost.envs.tau2.simulator import AGENT_GREETING
from agentboost.errors import ConfigError, EngineError
from agentboost.tokens.trajectory import TerminationReason


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def run(env, task, agent_turns, say, tokenizer, **kwargs):
    engine = ScriptedEngine([say(text) for text in agent_turns])
    return asyncio.run(env.run_episode(task, engine, tokenizer, **kwargs))


def environment(tokenizer, say, customer, **kwargs) -> Tau2Environment:
    simulator = ScriptedEngine([say(text) for text in customer])
    return Tau2Environment(simulator_engine=simulator, simulator_tokenizer=tokenizer, **kwargs)


def assert_masks(result) -> None:
    """Simulator turns and tool results are never trained on; every generated token has a logprob."""
    trajectory = result.trajectory
    for segment in trajectory.segments:
        mask = set(trajectory.loss_mask[segment.start : segment.end])
        if segment.role == "assistant":
            assert mask == {1}
            assert all(trajectory.logprobs[i] is not None for i in range(segment.start, segment.end))
        else:
            assert mask == {0}, segment


def test_registered_and_validated():
    env = make_environment("tau2", {"domain": "retail", "mode": "ticket"})
    assert isinstance(env, Tau2Environment) and env.domain.name == "retail"
    with pytest.raises(ConfigError, match="mode"):
        Tau2Environment(mode="chat")
    with pytest.raises(ConfigError, match="reward"):
        Tau2Environment(reward="llm")
    with pytest.raises(ConfigError, match="split"):
        Tau2Environment().tasks(split="validation")


def test_tasks_are_stable_by_id_and_round_trip():
    env = Tau2Environment(domain="airline", reward="tau2")  # the packaged splits, every task kept
    train = env.tasks(split="train")
    assert len(train) == 30 and len(env.tasks(split="test")) == 20 and len(env.tasks(split="all")) == 50
    assert env.tasks(5, split="train") == train[:5]
    assert env.tasks(5, seed=3, split="train") != train[:5]
    assert {task.id for task in env.tasks(split="train")}.isdisjoint(
        task.id for task in env.tasks(split="test")
    )
    task = env.task("5")
    assert task.id == "airline-5" and task.metadata["tau2_id"] == "5"
    assert Task.from_dict(json.loads(json.dumps(task.to_dict()))) == task
    assert task.messages == [
        {"role": "assistant", "content": AGENT_GREETING},
        {"role": "user", "content": OPENING_PLACEHOLDER},
    ]
    assert all(isinstance(action["arguments"], dict) for action in task.ground_truth)


def test_gold_conversation_with_a_simulated_customer_earns_one(qwen_tokenizer, say):
    customer = ["Hi, I want to exchange some items.", "Great, thanks! ###STOP###"]
    env = environment(qwen_tokenizer, say, customer, domain="retail")
    task = env.task("0")
    turns = [call(action["name"], action["arguments"]) for action in task.ground_truth] + ["Done."]
    result = run(env, task, turns, say, qwen_tokenizer)
    assert result.termination is TerminationReason.USER_ENDED
    assert result.trajectory.termination_detail == "###STOP###"
    assert result.reward == 1.0 and result.reward_breakdown["db"] == 1.0
    assert result.reward_breakdown["toolrl"] == 4.0
    assert result.reward_breakdown["actions_matched"] == result.reward_breakdown["actions_total"] == 5
    messages = result.trajectory.messages
    # the greeting, the customer's words: the environment's, not the policy's (docs/gateway.md)
    assert messages[1] == {"role": "assistant", "content": AGENT_GREETING, "source": "environment"}
    assert messages[2] == {
        "role": "user",
        "content": "Hi, I want to exchange some items.",
        "source": "environment",
    }
    assert messages[-1] == {"role": "user", "content": "Great, thanks! ###STOP###", "source": "environment"}
    assert_masks(result)
    simulator = result.trajectory.info["simulator"]["turns"]
    assert [turn["text"] for turn in simulator] == [messages[2]["content"], messages[-1]["content"]]
    assert all(turn["token_ids"] for turn in simulator)  # recorded for inspection, outside the trajectory


def test_customer_turns_are_appended_token_exactly_with_mask_zero(qwen_tokenizer, say):
    env = environment(
        qwen_tokenizer, say, ["Hello, my user id is mia_li_3668.", "I want to book a flight.", "###STOP###"]
    )
    task = env.task("1")
    engine = ScriptedEngine([say("How can I help?"), say("Sure, from where?")])
    engine.record_prompts = True
    result = asyncio.run(env.run_episode(task, engine, qwen_tokenizer))
    assert result.termination is TerminationReason.USER_ENDED
    trajectory = result.trajectory
    user_segments = [segment for segment in trajectory.segments if segment.role == "user"]
    assert len(user_segments) == 1  # the second customer turn; the opening is part of the prompt
    text = qwen_tokenizer.decode(trajectory.token_ids[user_segments[0].start : user_segments[0].end])
    assert "I want to book a flight." in text
    # what the engine saw on its second call is exactly the trajectory's prefix
    second_prompt = engine.prompts[1]
    assert trajectory.token_ids[: len(second_prompt)] == second_prompt
    assert_masks(result)


def test_transfer_to_a_human_ends_the_rollout(qwen_tokenizer, say):
    env = environment(qwen_tokenizer, say, ["I want a human."])
    task = env.task("0")
    turns = [call("transfer_to_human_agents", {"summary": "customer asks for a human"}), "never generated"]
    result = run(env, task, turns, say, qwen_tokenizer)
    assert result.termination is TerminationReason.ENV_STOPPED
    assert result.trajectory.termination_detail == "transfer_to_human_agents"
    assert result.reward_breakdown["ended_cleanly"] == 1.0
    assert result.reward == 1.0  # task 0: the right outcome is to change nothing


def test_a_customer_who_never_stops_is_cut_at_max_user_turns(qwen_tokenizer, say):
    env = Tau2Environment(
        domain="mock",
        max_user_turns=3,
        simulator_engine=ScriptedEngine([say("Please keep going.")], cycle=True),
        simulator_tokenizer=qwen_tokenizer,
    )
    task = env.tasks(1, split="all")[0]
    engine = ScriptedEngine([say("Anything else?")], cycle=True)
    result = asyncio.run(env.run_episode(task, engine, qwen_tokenizer))
    assert result.termination is TerminationReason.USER_ENDED
    assert result.trajectory.termination_detail == "max_user_turns (3)"
    assert len(result.trajectory.info["simulator"]["turns"]) == 3
    assert result.reward == 0.0 and result.reward_breakdown["ended_cleanly"] == 0.0
    assert "scores it 0" in result.reward_info["note"]
    assert_masks(result)


def test_a_blank_customer_leaves_the_rollout_unscored(qwen_tokenizer, say):
    env = Tau2Environment(
        domain="mock",
        simulator_engine=ScriptedEngine([say("Create a task please."), say("  "), say(""), say("\n")]),
        simulator_tokenizer=qwen_tokenizer,
        simulator_retries=2,
    )
    task = env.tasks(1, split="all")[0]
    result = run(env, task, ["Sure, what title?"], say, qwen_tokenizer)
    assert result.termination is TerminationReason.USER_ENDED
    assert result.trajectory.termination_detail == "simulator_failed: empty_reply"
    assert result.reward is None and "simulated customer failed" in result.reward_error
    assert result.outcome.value == "unscorable"  # not the agent's doing: counted apart, rerun on resume
    assert not result.termination.failed  # the agent's turns are fine; only the score is missing


def test_malformed_customer_text_is_just_text(qwen_tokenizer, say):
    garbage = '<tool_call>{"name": broken</tool_call> ```{{{'
    env = environment(qwen_tokenizer, say, ["Hi", garbage, "###STOP###"], domain="mock")
    task = env.tasks(1, split="all")[0]
    result = run(env, task, ["Hello", "I did not understand."], say, qwen_tokenizer)
    assert result.termination is TerminationReason.USER_ENDED
    assert {"role": "user", "content": garbage, "source": "environment"} in result.trajectory.messages
    assert result.trajectory.metrics["tool_calls"] == 0  # the customer's text never runs tools
    assert_masks(result)


def test_simulator_engine_failure_is_a_retryable_engine_error(qwen_tokenizer, say):
    responses = iter([say("Hi")])

    def flaky(_prompt, _index):
        try:
            return next(responses)
        except StopIteration:
            raise EngineError("simulator server is down") from None

    env = Tau2Environment(
        domain="mock", simulator_engine=ScriptedEngine(flaky), simulator_tokenizer=qwen_tokenizer
    )
    result = run(env, env.tasks(1, split="all")[0], ["Hello"], say, qwen_tokenizer)
    assert result.termination is TerminationReason.ENGINE_ERROR and result.termination.retryable
    assert "simulator server is down" in result.trajectory.termination_detail
    assert result.reward is None


def test_simulator_that_cannot_open_is_an_env_error(qwen_tokenizer, say):
    env = environment(qwen_tokenizer, say, ["###STOP###"], domain="mock")
    result = run(env, env.tasks(1, split="all")[0], ["Hello"], say, qwen_tokenizer)
    assert result.termination is TerminationReason.ENV_ERROR
    assert "could not open the conversation" in result.trajectory.termination_detail


def test_bad_arguments_and_unknown_tools_come_back_as_tool_errors(qwen_tokenizer, say):
    env = environment(qwen_tokenizer, say, ["Hi", "###STOP###"], domain="airline")
    task = env.task("0")
    turns = [
        call("get_reservation_details", {"reservation": "EHGLP3"}),  # wrong argument name
        call("cancel_reservation", {"reservation_id": 12345}),  # wrong type, unknown id
        call("delete_database", {}),  # no such tool
        '<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": </tool_call>',  # malformed JSON
        "Sorry, I cannot cancel this reservation.",
    ]
    result = run(env, task, turns, say, qwen_tokenizer)
    assert result.termination is TerminationReason.USER_ENDED
    tool_messages = [m for m in result.trajectory.messages if m["role"] == "tool"]
    assert len(tool_messages) == 4 and all(m.get("error") for m in tool_messages)
    assert result.reward_breakdown["tool_calls_executed"] == 2.0  # well-formed calls to real tools
    assert result.reward == 1.0  # nothing changed: task 0's right outcome
    assert result.reward_breakdown["toolrl_format"] == 0.0  # parse errors cost the ToolRL format term
    assert_masks(result)


def test_ticket_mode_has_no_simulator_and_scores_the_gold_actions(qwen_tokenizer, say):
    env = Tau2Environment(domain="retail", mode="ticket", reward="toolrl")
    task = env.task("0")
    assert isinstance(task.prompt, str) and "Ticket:" in task.prompt and "Yusuf Rossi" in task.prompt
    turns = [call(action["name"], action["arguments"]) for action in task.ground_truth] + ["Done."]
    result = run(env, task, turns, say, qwen_tokenizer)
    assert result.termination is TerminationReason.COMPLETED
    assert "simulator" not in result.trajectory.info
    assert result.reward == 4.0  # reward="toolrl": the ToolRL term is the value ...
    assert result.reward_breakdown["tau2"] == 1.0  # ... and tau2's is recorded next to it
    wrong = run(env, task, [*turns[:1], "Done."], say, qwen_tokenizer)
    assert wrong.reward_breakdown["tau2"] == 0.0 and -3.0 <= wrong.reward < 4.0


def test_a_limit_scores_zero_like_tau2(qwen_tokenizer, say):
    from agentboost.agent.limits import RolloutLimits

    env = Tau2Environment(domain="retail", mode="ticket")
    task = env.task("0")
    turns = [call(action["name"], action["arguments"]) for action in task.ground_truth] + ["Done."]
    result = run(env, task, turns, say, qwen_tokenizer, limits=RolloutLimits(max_turns=2))
    assert result.termination is TerminationReason.MAX_TURNS
    assert result.reward == 0.0 and result.reward_breakdown["ended_cleanly"] == 0.0


def test_mock_tasks_with_initial_state_replay_their_history(qwen_tokenizer, say):
    env = Tau2Environment(domain="mock", mode="ticket")
    for tau2_id in ("update_task_with_initialization_data", "update_task_with_initialization_actions"):
        task = env.task(tau2_id)
        info = " ".join(env.domain.task(tau2_id).evaluation_criteria.communicate_info or [])
        turns = [call(action["name"], action["arguments"]) for action in task.ground_truth] + [
            f"Done. {info}"
        ]
        result = run(env, task, turns, say, qwen_tokenizer)
        assert result.reward == 1.0, (tau2_id, result.reward_info)
        assert result.reward_breakdown["db"] == 1.0
        assert run(env, task, ["Done."], say, qwen_tokenizer).reward == 0.0


def test_the_simulator_shares_the_agents_engine_by_default(qwen_tokenizer, say):
    env = Tau2Environment(domain="mock")
    task = env.tasks(1, split="all")[0]
    # one engine serves both: the customer's opening, the agent's turn, the customer's goodbye; each
    # rollout uses its OWN engine (veRL builds one per rollout), never the first one the env saw
    for opening in ("Hi, create a task.", "Hello, I need a task."):
        engine = ScriptedEngine([say(opening), say("What title?"), say("Never mind. ###STOP###")])
        result = asyncio.run(env.run_episode(task, engine, qwen_tokenizer))
        assert result.termination is TerminationReason.USER_ENDED and engine.calls == 3
        assert result.trajectory.messages[2]["content"] == opening
    with pytest.raises(ConfigError, match=r"carries only inside run_episode\(\)"):
        env.simulator(Episode(task))


def test_concurrent_rollouts_each_reach_their_own_engine_through_the_episode(qwen_tokenizer, say):
    """No ContextVar and no rollout override: the episode carries the engine to the simulator."""
    env = Tau2Environment(domain="mock")
    task = env.tasks(1, split="all")[0]
    assert type(env).run_episode is Environment.run_episode
    engines = [
        ScriptedEngine([say(opening), say("What title?"), say("Never mind. ###STOP###")])
        for opening in ("Hi, create a task.", "Hello, I need a task.")
    ]

    async def both():
        return await asyncio.gather(*(env.run_episode(task, engine, qwen_tokenizer) for engine in engines))

    results = asyncio.run(both())
    assert [engine.calls for engine in engines] == [3, 3]
    assert [r.trajectory.messages[2]["content"] for r in results] == [
        "Hi, create a task.",
        "Hello, I need a task.",
    ]
