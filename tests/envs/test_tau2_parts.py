"""The tau2 environment's parts against the real tau2 package: tools, schemas, rewards, the simulator."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.tau2.package import (
    agent_system_prompt,
    load_domain,
    scenario_text,
    stop_markers,
    user_guidelines,
)
from agentboost.envs.tau2.reward import call_arguments, tau2_evaluation, to_tau2_messages, toolrl_reward
from agentboost.envs.tau2.simulator import AGENT_GREETING, UserSimulator, flip_roles, simulator_prompt
from agentboost.envs.tau2.tools import ToolLog, resolve_refs, tau2_tools
from agentboost.errors import ConfigError, EngineError
from agentboost.tokens.templates import get_template, tool_specs_to_openai


def call_tool(tool, tool_use_id: str, arguments) -> dict:
    async def run():
        events = [event async for event in tool.stream({"toolUseId": tool_use_id, "input": arguments}, {})]
        return events[-1].tool_result

    return asyncio.run(run())


def test_tau2_loads_without_litellm_and_from_the_package_data():
    airline = load_domain("airline")
    retail = load_domain("retail")
    assert (len(airline.task_ids("train")), len(airline.task_ids("test")), len(airline.task_ids("all"))) == (
        30,
        20,
        50,
    )
    assert (len(retail.task_ids("train")), len(retail.task_ids("test"))) == (74, 40)
    assert "litellm" not in sys.modules
    prompt = agent_system_prompt(airline)
    assert "<policy>" in prompt and "customer service agent" in prompt
    assert airline.policy.strip()[:40] in prompt
    assert "book_reservation" in airline.write_tools and "get_user_details" not in airline.write_tools
    with pytest.raises(ConfigError, match="splits"):
        airline.task_ids("validation")
    with pytest.raises(ConfigError, match="unknown tau2 domain"):
        load_domain("telecom-full")


def test_resolve_refs_inlines_defs_and_rejects_what_it_cannot_inline():
    schema = {
        "$defs": {"Pax": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "type": "object",
        "properties": {"passengers": {"type": "array", "items": {"$ref": "#/$defs/Pax"}}},
    }
    resolved = resolve_refs(schema)
    assert "$defs" not in json.dumps(resolved) and "$ref" not in json.dumps(resolved)
    assert resolved["properties"]["passengers"]["items"]["properties"]["name"] == {"type": "string"}
    with pytest.raises(ConfigError, match="recursive"):
        resolve_refs({"$defs": {"A": {"items": {"$ref": "#/$defs/A"}}}, "items": {"$ref": "#/$defs/A"}})
    with pytest.raises(ConfigError, match="names no definition"):
        resolve_refs({"items": {"$ref": "#/$defs/Missing"}})
    with pytest.raises(ConfigError, match="not a local"):
        resolve_refs({"items": {"$ref": "https://example.com/schema.json"}})


@pytest.mark.parametrize("domain", ["airline", "retail", "mock"])
@pytest.mark.parametrize("template", ["qwen3", "chatml"])
def test_every_domain_tool_renders_with_its_whole_schema(domain, template):
    environment = load_domain(domain).fresh_environment()
    tools = tau2_tools(environment, ToolLog())
    assert sorted(tool.tool_name for tool in tools) == sorted(tool.name for tool in environment.get_tools())
    specs = [tool.tool_spec for tool in tools]
    rendered = get_template(template).render([{"role": "user", "content": "hi"}], tool_specs_to_openai(specs))
    assert "$ref" not in rendered and "$defs" not in rendered
    for spec in specs:
        assert spec["name"] in rendered
    if domain == "airline":  # book_reservation's passengers are a $ref to Passenger: its fields must show
        book = next(spec for spec in specs if spec["name"] == "book_reservation")
        passengers = book["inputSchema"]["json"]["properties"]["passengers"]
        passenger = passengers["items"]["anyOf"][0]  # Passenger, or any object
        assert set(passenger["properties"]) == {"first_name", "last_name", "dob"}


def test_tools_execute_on_the_rollouts_own_database_and_errors_come_back_as_errors():
    domain = load_domain("airline")
    first, second = domain.fresh_environment(), domain.fresh_environment()
    log = ToolLog()
    tools = {tool.tool_name: tool for tool in tau2_tools(first, log)}
    result = call_tool(tools["get_reservation_details"], "c1", {"reservation_id": "EHGLP3"})
    assert result["status"] == "success"
    assert json.loads(result["content"][0]["text"])["reservation_id"] == "EHGLP3"
    unknown = call_tool(tools["get_reservation_details"], "c2", {"reservation_id": "NOPE00"})
    assert unknown["status"] == "error" and "not found" in unknown["content"][0]["text"].lower()
    bad = call_tool(tools["get_reservation_details"], "c3", {"reservation": "EHGLP3"})
    assert bad["status"] == "error"
    cancelled = call_tool(tools["cancel_reservation"], "c4", {"reservation_id": "EHGLP3"})
    assert cancelled["status"] == "success"
    assert first.tools.db.reservations["EHGLP3"].status == "cancelled"
    assert second.tools.db.reservations["EHGLP3"].status != "cancelled"  # a copy per rollout
    assert [call.id for call in log.calls] == ["c1", "c2", "c3", "c4"]
    assert log.responses["c3"].error and not log.responses["c4"].error


def _replay(domain_name: str, task_id: str, *, say_info: bool = True, skip_last_write: bool = False):
    domain = load_domain(domain_name)
    task = domain.task(task_id)
    log = ToolLog()
    tools = {tool.tool_name: tool for tool in tau2_tools(domain.fresh_environment(), log)}
    actions = list(task.evaluation_criteria.actions or [])
    if skip_last_write:
        last = max(i for i, action in enumerate(actions) if action.name in domain.write_tools)
        actions.pop(last)
    info = " ".join(task.evaluation_criteria.communicate_info or [])
    messages = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": info if say_info else "ok"},
    ]
    for index, action in enumerate(actions):
        call_id = f"call_{index}"
        call_tool(tools[action.name], call_id, dict(action.arguments))
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": action.name, "arguments": {}}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "(display only)"})
    return tau2_evaluation(domain, task, to_tau2_messages(messages, log))


def test_tau2_reward_pays_the_gold_actions_and_nothing_less():
    reward, breakdown, facts = _replay("retail", "0")
    assert reward == 1.0 and breakdown["db"] == 1.0 and facts["db_match"] is True
    assert breakdown["actions_matched"] == breakdown["actions_total"] > 0
    reward, breakdown, facts = _replay("retail", "0", skip_last_write=True)
    assert reward == 0.0 and breakdown["db"] == 0.0 and facts["db_match"] is False


def test_an_assertion_about_what_the_agent_never_made_scores_zero_not_an_error():
    """mock's assert_task_status raises "Task task_2 not found" when the agent created no task; that
    rollout must score 0 (the assertion not met), not be left unscored for a policy to aim at."""
    assert _replay("mock", "create_task_1_with_env_assertions")[0] == 1.0
    reward, breakdown, facts = _replay("mock", "create_task_1_with_env_assertions", skip_last_write=True)
    assert reward == 0.0 and breakdown["env_assertions"] == 0.0
    assert facts["env_assertion_errors"] == ["assert_task_status: ValueError: Task task_2 not found"]
    domain = load_domain("mock")
    for task_id in domain.task_ids("all"):  # doing nothing is scored on every mock task, never raises
        reward, _, facts = tau2_evaluation(domain, domain.task(task_id), [])
        assert 0.0 <= reward <= 1.0, (task_id, facts)


def test_tau2_reward_needs_the_required_information_said():
    domain = load_domain("retail")
    task_id = next(
        task_id
        for task_id in domain.task_ids("all")
        if domain.task(task_id).evaluation_criteria.communicate_info
    )
    assert _replay("retail", task_id)[0] == 1.0
    reward, breakdown, facts = _replay("retail", task_id, say_info=False)
    assert reward == 0.0 and breakdown["db"] == 1.0 and breakdown["communicate"] == 0.0
    assert not facts["communicate_checks"][0]["met"]


def test_conversion_puts_each_call_directly_before_its_result_and_drops_calls_tau2_never_ran():
    domain = load_domain("airline")
    log = ToolLog()
    tools = {tool.tool_name: tool for tool in tau2_tools(domain.fresh_environment(), log)}
    call_tool(tools["get_user_details"], "a", {"user_id": "emma_kim_9957"})
    call_tool(tools["list_all_airports"], "b", {})
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "a", "function": {"name": "get_user_details", "arguments": {}}},
                {"id": "b", "function": {"name": "list_all_airports", "arguments": {}}},
                {"id": "zzz", "function": {"name": "no_such_tool", "arguments": {}}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "..."},
        {"role": "tool", "tool_call_id": "b", "content": "..."},
        {"role": "assistant", "content": "  "},
    ]
    converted = to_tau2_messages(messages, log)
    assert [type(message).__name__ for message in converted] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
        "ToolMessage",
    ]
    assert [call.id for call in converted[1].tool_calls] == ["a", "b"]
    assert [message.id for message in converted[2:]] == ["a", "b"]


def test_toolrl_reward_spans_minus_three_to_four():
    gold = [("cancel", {"id": "X1", "reason": "plan"}), ("lookup", {"id": "X1"})]
    best, parts = toolrl_reward(gold, gold, well_formed=True)
    assert best == 4.0 and parts["toolrl_format"] == 1.0 and parts["toolrl_correct"] == 3.0
    worst, _ = toolrl_reward([("other", {"q": 1})], gold, well_formed=False)
    assert worst == -3.0
    partial, parts = toolrl_reward([("cancel", {"id": "X1", "reason": "other"})], gold, well_formed=True)
    # names 1/2, keys 1 (cancel), values 1 (id) over max 1 + 2 + 3 = 6
    assert parts["toolrl_names"] == 0.5 and parts["toolrl_keys"] == 1.0 and parts["toolrl_values"] == 1.0
    assert partial == pytest.approx(1.0 + 6 * 2.5 / 6 - 3)
    assert toolrl_reward([], [], well_formed=True)[0] == 4.0
    assert toolrl_reward([("x", {})], [], well_formed=True)[0] == -2.0
    duplicated, _ = toolrl_reward(
        [("lookup", {"id": "X1"})] * 2, [("lookup", {"id": "X1"})], well_formed=True
    )
    assert duplicated == 4.0  # a repeated identical call is not rewarded twice, nor punished by names


# --- the simulator ------------------------------------------------------------------------------


def _simulator(qwen_tokenizer, responses, **kwargs):
    engine = ScriptedEngine(responses)
    engine.record_prompts = True
    return UserSimulator(engine, qwen_tokenizer, template="qwen3", **kwargs), engine


def test_toolrl_reads_arguments_sent_as_a_json_string_as_the_object_they_encode():
    """A client may send a call's arguments as a JSON string; scored as a string, its characters were
    taken for argument names. Found by mypy."""
    gold = [("cancel", {"id": "X1", "reason": "other"})]
    as_object, _ = toolrl_reward(
        [("cancel", call_arguments({"id": "X1", "reason": "other"}))], gold, well_formed=True
    )
    as_string, _ = toolrl_reward(
        [("cancel", call_arguments('{"id": "X1", "reason": "other"}'))], gold, well_formed=True
    )
    assert as_string == as_object == 4.0
    assert call_arguments("not json") == {} and call_arguments("[1, 2]") == {} and call_arguments(None) == {}


def test_simulator_prompt_is_tau2s_guidelines_and_the_scenario(qwen_tokenizer, say):
    task = load_domain("airline").task("0")
    simulator, engine = _simulator(qwen_tokenizer, [say("I want to cancel EHGLP3.")])
    conversation = [
        {"role": "assistant", "content": AGENT_GREETING},
        {"role": "user", "content": "Hi, cancel please."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "x", "function": {"name": "t"}}]},
        {"role": "tool", "tool_call_id": "x", "content": "SECRET-TOOL-OUTPUT"},
        {"role": "assistant", "content": "What is your user id?"},
    ]
    reply = asyncio.run(simulator.reply(scenario_text(task), conversation))
    assert reply.text == "I want to cancel EHGLP3." and reply.marker is None and reply.failure is None
    prompt = qwen_tokenizer.decode(engine.prompts[0])
    assert user_guidelines().strip()[:200] in prompt
    assert "emma_kim_9957" in prompt and "<scenario>" in prompt
    assert "SECRET-TOOL-OUTPUT" not in prompt  # the customer never sees tool traffic
    assert flip_roles(conversation) == [
        {"role": "user", "content": AGENT_GREETING},
        {"role": "assistant", "content": "Hi, cancel please."},
        {"role": "user", "content": "What is your user id?"},
    ]
    assert prompt.endswith("What is your user id?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert simulator_prompt("S").endswith("<scenario>\nS\n</scenario>")


@pytest.mark.parametrize("marker", ["###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"])
def test_simulator_markers_end_the_conversation(qwen_tokenizer, say, marker):
    assert marker in stop_markers()
    simulator, _ = _simulator(qwen_tokenizer, [say(f"Thanks, bye. {marker}")])
    reply = asyncio.run(simulator.reply("scenario", []))
    assert reply.marker == marker and reply.failure is None


def test_simulator_retries_blank_replies_then_reports_a_failure(qwen_tokenizer, say):
    simulator, _ = _simulator(qwen_tokenizer, [say("   "), say("\n"), say("Hello there")], retries=2)
    reply = asyncio.run(simulator.reply("scenario", []))
    assert reply.text == "Hello there" and reply.attempts == 3 and reply.failure is None
    simulator, _ = _simulator(qwen_tokenizer, [say(""), say(" "), say("\n")], retries=2)
    reply = asyncio.run(simulator.reply("scenario", []))
    assert reply.failure == "empty_reply" and reply.attempts == 3


def test_simulator_engine_failure_is_a_reply_not_a_crash(qwen_tokenizer):
    def broken(_prompt, _index):
        raise EngineError("server went away")

    simulator = UserSimulator(ScriptedEngine(broken), qwen_tokenizer, template="qwen3")
    reply = asyncio.run(simulator.reply("scenario", []))
    assert reply.failure.startswith("engine_error: EngineError: server went away")


def test_simulator_keeps_a_reply_cut_at_max_tokens(qwen_tokenizer, say):
    simulator, _ = _simulator(
        qwen_tokenizer,
        [say("I would like to change my flight to a later one please", stop=False)],
        max_new_tokens=4,
    )
    reply = asyncio.run(simulator.reply("scenario", []))
    assert reply.finish_reason == "length" and reply.text and reply.failure is None
