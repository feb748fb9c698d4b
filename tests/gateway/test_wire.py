"""Wire conformance of both APIs on a scripted engine: shapes, stream order, tool round trips, errors."""

from __future__ import annotations

import json

import aiohttp
import anthropic
import openai
import pytest
from conftest import TOOL_SCRIPT, run
from gateway_support import ANTHROPIC_TOOLS, OPENAI_TOOLS, anthropic_agent, openai_agent, serving

from agentboost.engines.scripted import ScriptedEngine


@pytest.fixture
def scripted(say):
    return lambda: ScriptedEngine([say(text) for text in TOOL_SCRIPT], cycle=True)


def test_openai_tool_round_trip_shapes(qwen_tokenizer, scripted):
    async def go():
        async with serving(scripted(), qwen_tokenizer) as gateway:
            gateway.open_session("s1")
            async with aiohttp.ClientSession() as http:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": OPENAI_TOOLS}
                async with http.post(f"{gateway.base_url('s1')}/chat/completions", json=body) as response:
                    return response.status, await response.json()

    status, data = run(go())
    assert status == 200 and data["object"] == "chat.completion"
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "I will add first."
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 12, "b": 30}
    usage = data["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def test_openai_stream_chunks_come_in_order_and_end_with_done(qwen_tokenizer, scripted):
    async def go():
        async with serving(scripted(), qwen_tokenizer) as gateway:
            gateway.open_session("s1")
            body = {
                "messages": [{"role": "user", "content": "hi"}],
                "tools": OPENAI_TOOLS,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            url = f"{gateway.base_url('s1')}/chat/completions"
            async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
                assert response.headers["Content-Type"].startswith("text/event-stream")
                return (await response.text()).split("\n\n")

    events = [event for event in run(go()) if event]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    deltas = [chunk["choices"][0]["delta"] if chunk["choices"] else None for chunk in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"content": "I will add first."}
    assert (
        deltas[2]["tool_calls"][0]["index"] == 0 and deltas[2]["tool_calls"][0]["function"]["name"] == "add"
    )
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls" and deltas[3] == {}
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True])
def test_sdk_tool_loops_complete_on_a_scripted_engine(qwen_tokenizer, scripted, stream):
    async def go():
        async with serving(scripted(), qwen_tokenizer) as gateway:
            gateway.open_session("a")
            gateway.open_session("b")
            first = await openai_agent(gateway.base_url("a"), "a", stream=stream)
            second = await anthropic_agent(gateway.anthropic_url("b"), "b", stream=stream)
            return first, second, gateway.sessions["a"], gateway.sessions["b"]

    engine_messages, anthropic_messages, session_a, _ = run(go())
    assert engine_messages[-1]["content"] == "The result is 84.\nAnswer: 84"
    assert anthropic_messages[-1]["content"] == [{"type": "text", "text": "The result is 84.\nAnswer: 84"}]
    assert session_a.turns == 3 and session_a.drift == []


def test_session_in_the_api_key_slot(qwen_tokenizer, scripted):
    async def go():
        async with serving(scripted(), qwen_tokenizer) as gateway:
            gateway.open_session("keyed")
            client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="keyed", max_retries=0)
            reply = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            await client.close()
            claude = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="nobody", max_retries=0)
            with pytest.raises(anthropic.AuthenticationError) as refused:
                await claude.messages.create(
                    model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                )
            await claude.close()
            return reply, gateway.sessions["keyed"].turns, refused.value

    reply, turns, refused = run(go())
    assert reply.choices[0].message.content.startswith("I will add first.") and turns == 1
    assert refused.status_code == 401 and refused.body["error"]["type"] == "authentication_error"


REFUSALS = [
    (
        "unknown session",
        "/s/nobody/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}]},
        404,
    ),
    ("no key", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, 401),
    ("bad json", "/s/s1/v1/chat/completions", b"{not json", 400),
    ("n > 1", "/s/s1/v1/chat/completions", {"n": 2, "messages": [{"role": "user", "content": "x"}]}, 400),
    (
        "logit_bias",
        "/s/s1/v1/chat/completions",
        {"logit_bias": {"1": 5}, "messages": [{"role": "user", "content": "x"}]},
        400,
    ),
    (
        "image part",
        "/s/s1/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
    ),
    (
        "frequency_penalty",
        "/s/s1/v1/chat/completions",
        {"frequency_penalty": 0.5, "messages": [{"role": "user", "content": "x"}]},
        400,
    ),
    (
        "top_logprobs",
        "/s/s1/v1/chat/completions",
        {"logprobs": True, "top_logprobs": 3, "messages": [{"role": "user", "content": "x"}]},
        400,
    ),
    (
        "json response_format",
        "/s/s1/v1/chat/completions",
        {"response_format": {"type": "json_object"}, "messages": [{"role": "user", "content": "x"}]},
        400,
    ),
    (
        "responses: unknown item_reference",
        "/s/s1/v1/responses",
        {"input": [{"type": "item_reference", "id": "msg_1"}]},
        400,
    ),
    ("legacy completions", "/s/s1/v1/completions", {"prompt": "x"}, 404),
    ("unknown route", "/v2/anything", {}, 404),
    ("session name with a slash", "/s/a+b/c==/v1/chat/completions", {"messages": []}, 404),
    ("responses: hosted tool", "/s/s1/v1/responses", {"input": "x", "tools": [{"type": "web_search"}]}, 400),
    ("responses: unknown chain", "/s/s1/v1/responses", {"input": "x", "previous_response_id": "resp_1"}, 400),
    (
        "responses: json format",
        "/s/s1/v1/responses",
        {"input": "x", "text": {"format": {"type": "json_object"}}},
        400,
    ),
    (
        "ends on assistant",
        "/s/s1/v1/chat/completions",
        {"messages": [{"role": "assistant", "content": "x"}]},
        400,
    ),
    (
        "anthropic unknown session",
        "/s/nobody/v1/messages",
        {"messages": [{"role": "user", "content": "x"}]},
        404,
    ),
    ("anthropic bad json", "/s/s1/v1/messages", b"[", 400),
    (
        "anthropic server tool",
        "/s/s1/v1/messages",
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        400,
    ),
    ("anthropic unknown route", "/s/s1/v1/messages/batches", {}, 404),
    (
        "anthropic image",
        "/s/s1/v1/messages",
        {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
        400,
    ),
]


@pytest.mark.parametrize(("case", "path", "body", "status"), REFUSALS, ids=[case[0] for case in REFUSALS])
def test_bad_requests_get_the_apis_error_shape(qwen_tokenizer, scripted, case, path, body, status):
    async def go():
        async with serving(scripted(), qwen_tokenizer) as gateway:
            gateway.open_session("s1")
            async with aiohttp.ClientSession() as http:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                headers = {"Content-Type": "application/json"}
                async with http.post(gateway.url + path, data=data, headers=headers) as response:
                    return response.status, await response.json(), gateway.sessions["s1"].turns

    got_status, data, turns = run(go())
    assert got_status == status
    assert turns == 0  # a refused request generates nothing
    if "/messages" in path:
        assert (
            data["type"] == "error" and data["error"]["type"].endswith("_error") and data["error"]["message"]
        )
    else:
        assert set(data["error"]) == {"message", "type", "param", "code"} and data["error"]["message"]


def test_anthropic_message_shape_and_stream_event_order(qwen_tokenizer, say):
    body = {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], "tools": ANTHROPIC_TOOLS}
    text_then_call = ScriptedEngine([say(TOOL_SCRIPT[0])], cycle=True)

    async def go():
        async with serving(text_then_call, qwen_tokenizer) as gateway:
            gateway.open_session("s1")
            gateway.open_session("s2")
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{gateway.anthropic_url('s1')}/v1/messages", json=body) as response:
                    plain = await response.json()
                async with http.post(
                    f"{gateway.anthropic_url('s2')}/v1/messages", json={**body, "stream": True}
                ) as response:
                    streamed = await response.text()
            return plain, streamed

    plain, streamed = run(go())
    assert plain["type"] == "message" and plain["stop_reason"] == "tool_use"
    assert [block["type"] for block in plain["content"]] == ["text", "tool_use"]
    assert plain["content"][1]["input"] == {"a": 12, "b": 30}
    names = [event.split("\n")[0].removeprefix("event: ") for event in streamed.split("\n\n") if event]
    assert names == [
        "message_start",
        *["content_block_start", "content_block_delta", "content_block_stop"] * 2,
        "message_delta",
        "message_stop",
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["message", "stream"])
def test_anthropic_thinking_blocks_carry_the_reasoning_and_coming_back_are_not_drift(
    qwen_tokenizer, say, stream
):
    """A <think> model's reasoning is a thinking block when the request enables thinking (the
    official SDK parses it, streamed or not); sent back, it extends the row like any served turn."""
    engine = ScriptedEngine(
        [say("<think>\nadd them\n</think>\n\n" + TOOL_SCRIPT[0]), say(TOOL_SCRIPT[2])] * 2
    )

    async def go():
        async with serving(engine, qwen_tokenizer) as gateway:
            session = gateway.open_session("s")
            client = anthropic.AsyncAnthropic(base_url=gateway.anthropic_url("s"), api_key="s", max_retries=0)

            async def ask(messages, **options):
                request = {"model": "m", "max_tokens": 2048, "messages": messages, "tools": ANTHROPIC_TOOLS}
                if not stream:
                    return await client.messages.create(**request, **options)
                async with client.messages.stream(**request, **options) as events:
                    return await events.get_final_message()

            thinking = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
            history = [{"role": "user", "content": "What is (12 + 30) * 2?"}]
            first = await ask(history, **thinking)
            call = first.content[-1]
            history += [
                {
                    "role": "assistant",
                    "content": [block.model_dump(exclude_none=True) for block in first.content],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42"}],
                },
            ]
            second = await ask(history, **thinking)
            await client.close()
            gateway.open_session("hidden")
            client = anthropic.AsyncAnthropic(
                base_url=gateway.anthropic_url("hidden"), api_key="h", max_retries=0
            )
            hidden = await ask(history[:1])  # thinking not enabled: no thinking block
            with pytest.raises(anthropic.BadRequestError, match=r"thinking\.type must be one of"):
                await ask(history[:1], thinking={"type": "sometimes"})
            await client.close()
            return session, first, second, hidden

    session, first, second, hidden = run(go())
    assert [block.type for block in first.content] == ["thinking", "text", "tool_use"]
    assert first.content[0].thinking == "add them" and first.content[0].signature == ""
    assert [block.type for block in second.content] == ["text"] and second.content[0].text.endswith(
        "Answer: 84"
    )
    assert session.drift == [] and session.turns == 2 and session.rows == []
    assert "<think>\nadd them\n</think>" in qwen_tokenizer.decode(session.row.buffer.token_ids)
    assert [block.type for block in hidden.content] == ["text", "tool_use"]
