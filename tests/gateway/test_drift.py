"""Drift: a request that does not extend what the session served forks, resets or is refused, and says why."""

from __future__ import annotations

import copy
import json

import aiohttp
import pytest
from conftest import QUESTION, SYSTEM, TOOL_SCRIPT, run
from gateway_support import ANTHROPIC_TOOLS, OPENAI_TOOLS, serving

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.scripted import ScriptedEngine
from agentboost.tokens.trajectory import TerminationReason

TWO_CALLS = (
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
)


async def post(http, gateway, session, messages, tools=OPENAI_TOOLS):
    body = {"model": "m", "messages": messages, "tools": tools}
    async with http.post(f"{gateway.base_url(session)}/chat/completions", json=body) as response:
        return response.status, await response.json()


def answer(history, reply, results):
    """The history after a reply and its tool results (in call order)."""
    message = reply["choices"][0]["message"]
    tools = [
        {"role": "tool", "tool_call_id": call["id"], "content": result}
        for call, result in zip(message.get("tool_calls") or (), results, strict=True)
    ]
    return [*history, {k: v for k, v in message.items() if v is not None}, *tools]


def play(qwen_tokenizer, say, script, policy, change):
    """Two turns that extend, then a third request rewritten by ``change``; returns the session."""

    async def go():
        async with serving(
            ScriptedEngine([say(text) for text in script]), qwen_tokenizer, policy=policy
        ) as gateway:
            session = gateway.open_session("s")
            async with aiohttp.ClientSession() as http:
                history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
                _, first = await post(http, gateway, "s", history)
                history = answer(
                    history, first, ["42"] * len(first["choices"][0]["message"].get("tool_calls", []))
                )
                _, second = await post(http, gateway, "s", history)
                history = answer(
                    history, second, ["84"] * len(second["choices"][0]["message"].get("tool_calls", []))
                )
                history, tools = change(copy.deepcopy(history))
                status, third = await post(http, gateway, "s", history, tools)
                return session, status, third

    return run(go())


def edit_assistant(history):
    history[2]["content"] = "I shall add first."
    return history, OPENAI_TOOLS


def drop_turn(history):
    return [*history[:2], *history[4:]], OPENAI_TOOLS


def change_system(history):
    history[0]["content"] = "You are terse."
    return history, OPENAI_TOOLS


def change_tools(history):
    return history, OPENAI_TOOLS[:1]


def reorder_results(history):
    history[3], history[4] = history[4], history[3]
    return history, OPENAI_TOOLS


CASES = [
    ("assistant_edited", 1, edit_assistant, TOOL_SCRIPT),
    ("turn_dropped", 1, drop_turn, TOOL_SCRIPT),
    ("system_changed", 0, change_system, TOOL_SCRIPT),
    ("tools_changed", 0, change_tools, TOOL_SCRIPT),
    ("tool_results_reordered", 2, reorder_results, [TWO_CALLS, *TOOL_SCRIPT[1:]]),
]


@pytest.mark.parametrize(("reason", "position", "change", "script"), CASES, ids=[case[0] for case in CASES])
def test_fork_keeps_the_served_row_and_starts_a_new_one_recording_why(
    qwen_tokenizer, say, reason, position, change, script
):
    session, status, _third = play(qwen_tokenizer, say, script, "fork", change)
    assert status == 200
    trajectory = session.trajectory("t", TerminationReason.COMPLETED)
    assert trajectory.info["gateway"]["drift"] == [
        {"reason": reason, "position": position, "row": 0, "turn": 2, "policy": "fork"}
    ]
    assert trajectory.info["gateway"]["rows"] == 2 and trajectory.metrics["drift_events"] == 1
    (first_row,) = trajectory.forked_rows
    # the served row keeps its two generated turns; the new row is the rewritten history (all
    # prompt, never trained on) plus the one turn generated after it
    assert [s.role for s in first_row.segments] == ["prompt", "assistant", "tool", "assistant"]
    assert [s.role for s in trajectory.segments] == ["prompt", "assistant"]
    generated = trajectory.token_ids[trajectory.segments[1].start :]
    assert generated == say(script[2]) and sum(trajectory.loss_mask) == len(generated)
    # saved and loaded, the rows stay
    assert trajectory.from_json(trajectory.to_json()).forked_rows[0].token_ids == first_row.token_ids


def test_reset_drops_the_served_row(qwen_tokenizer, say):
    session, status, _ = play(qwen_tokenizer, say, TOOL_SCRIPT, "reset", edit_assistant)
    trajectory = session.trajectory("t", TerminationReason.COMPLETED)
    assert status == 200 and trajectory.forked_rows == []
    assert trajectory.info["gateway"]["dropped_rows"] == 1
    assert trajectory.info["gateway"]["drift"][0]["reason"] == "assistant_edited"


def test_refuse_answers_400_and_keeps_the_session_going(qwen_tokenizer, say):
    session, status, third = play(qwen_tokenizer, say, TOOL_SCRIPT, "refuse", edit_assistant)
    assert status == 400 and third["error"]["code"] == "history_diverged"
    assert "assistant_edited at message 1" in third["error"]["message"]
    assert session.turns == 2 and session.rows == [] and session.drift[0]["policy"] == "refuse"


def test_reasoning_dropped_by_the_client_is_not_drift(qwen_tokenizer, say):
    """Clients drop reasoning_content; the session holds its tokens, so the row simply extends."""
    script = ["<think>\nadd them\n</think>\n\n" + TOOL_SCRIPT[0], *TOOL_SCRIPT[1:]]

    def strip_reasoning(history):
        for message in history:
            message.pop("reasoning_content", None)
        return history, OPENAI_TOOLS

    session, status, third = play(qwen_tokenizer, say, script, "refuse", strip_reasoning)
    assert status == 200 and session.drift == [] and session.turns == 3
    assert third["choices"][0]["message"]["content"] == "The result is 84.\nAnswer: 84"
    row = session.trajectory("t", TerminationReason.COMPLETED)
    assert "<think>\nadd them\n</think>" in qwen_tokenizer.decode(row.token_ids)


def test_malformed_calls_come_back_as_text_and_are_recorded(qwen_tokenizer, say):
    bad = '<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>'

    async def go():
        async with serving(ScriptedEngine([say(bad)]), qwen_tokenizer) as gateway:
            session = gateway.open_session("s")
            async with aiohttp.ClientSession() as http:
                _, reply = await post(http, gateway, "s", [{"role": "user", "content": "hi"}])
            return session, reply

    session, reply = run(go())
    message = reply["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"] == bad
    assert reply["choices"][0]["finish_reason"] == "stop"
    row = session.trajectory("t", TerminationReason.COMPLETED)
    assert row.segments[-1].parse_errors == ["invalid_json"] and row.metrics["parse_errors"] == 1
    assert json.loads(json.dumps(row.to_dict()))["metrics"]["tool_calls"] == 0


def test_a_repeated_request_is_recorded_as_such(qwen_tokenizer, say):
    async def go():
        async with serving(ScriptedEngine([say("one"), say("two")]), qwen_tokenizer) as gateway:
            session = gateway.open_session("s")
            async with aiohttp.ClientSession() as http:
                history = [{"role": "user", "content": "hi"}]
                await post(http, gateway, "s", history)
                _, again = await post(http, gateway, "s", history)  # e.g. the SDK retried after a timeout
            return session, again

    session, again = run(go())
    assert again["choices"][0]["message"]["content"] == "two"
    assert [event["reason"] for event in session.drift] == ["request_repeated"] and len(session.rows) == 1


LONG = 150


def long_session(qwen_tokenizer, say, api, change):
    """``LONG`` extending turns of one tool call each, then one request rewritten by ``change``.

    Returns the session and the last request's status. The gateway memoizes each session's last
    request, so an edit far back in a long history must still be judged like any other.
    """
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    engine = ScriptedEngine([say(call)], cycle=True)

    async def go():
        limits = RolloutLimits(max_turns=LONG + 2, max_new_tokens=64)
        async with serving(engine, qwen_tokenizer, limits=limits) as gateway:
            session = gateway.open_session("s")
            key = {"x-api-key": "s"} if api == "anthropic" else {"Authorization": "Bearer s"}
            url = f"{gateway.url}/v1/{'messages' if api == 'anthropic' else 'chat/completions'}"
            body: dict = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Add."}]}
            if api == "anthropic":
                body |= {"system": SYSTEM, "tools": ANTHROPIC_TOOLS}
            else:
                body["messages"].insert(0, {"role": "system", "content": SYSTEM})
                body["tools"] = OPENAI_TOOLS
            async with aiohttp.ClientSession(headers=key) as http:
                for _ in range(LONG):
                    async with http.post(url, json=body) as response:
                        assert response.status == 200, await response.text()
                        reply = await response.json()
                    body["messages"].extend(_with_results(api, reply))
                assert session.drift == [] and session.turns == LONG
                change(body["messages"])
                async with http.post(url, json=body) as response:
                    return session, response.status

    return run(go())


def _with_results(api, reply):
    """The reply as the client keeps it, and its tool results."""
    if api == "anthropic":
        uses = [block for block in reply["content"] if block["type"] == "tool_use"]
        results = [{"type": "tool_result", "tool_use_id": use["id"], "content": "3"} for use in uses]
        return [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": results}]
    message = reply["choices"][0]["message"]
    results = [{"role": "tool", "tool_call_id": call["id"], "content": "3"} for call in message["tool_calls"]]
    return [message, *results]


def reformat_early_arguments(messages):
    """What a client may do: re-serialize a call's arguments (same JSON, other spacing)."""
    call = messages[2]["tool_calls"][0]["function"]
    call["arguments"] = json.dumps(json.loads(call["arguments"]), separators=(",", ":"))


def edit_early_result(messages):
    messages[3]["content"] = "4"


def edit_early_tool_use(messages):
    messages[1]["content"][-1]["input"] = {"a": 1, "b": 5}


@pytest.mark.parametrize(
    ("api", "change", "expected"),
    [
        ("openai", reformat_early_arguments, []),
        ("openai", edit_early_result, [("message_changed", 2)]),
        ("anthropic", edit_early_tool_use, [("assistant_edited", 1)]),
    ],
    ids=["openai-respaced-arguments-extend", "openai-edited-result", "anthropic-edited-tool-use"],
)
def test_an_early_edit_after_150_turns_is_drift_and_a_respacing_is_not(
    qwen_tokenizer, say, api, change, expected
):
    session, status = long_session(qwen_tokenizer, say, api, change)
    assert status == 200
    assert [(event["reason"], event["position"]) for event in session.drift] == expected
    assert len(session.rows) == len(expected)  # fork: the 150-turn row is kept whole
    if expected:
        (kept,) = session.rows
        assert kept.buffer.turn == LONG and session.row.buffer.turn == 1
    else:
        assert session.row.buffer.turn == LONG + 1
