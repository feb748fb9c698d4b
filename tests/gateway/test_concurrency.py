"""Many sessions at once, and a client that goes away mid-stream."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
from conftest import run
from gateway_support import serving

from agentboost.engines.scripted import ScriptedEngine


def test_interleaved_sessions_each_keep_their_own_exact_row(qwen_tokenizer, say):
    """40 sessions, 3 user turns each, interleaved; each answer names its session, so rows cannot mix."""

    def script(prompt, _index):
        text = qwen_tokenizer.decode(prompt)
        session = text.rsplit("I am ", 1)[1].split("<|im_end|>")[0]
        return say(f"hello {session}")

    async def chat(gateway, name):
        async with openai.AsyncOpenAI(base_url=gateway.base_url(name), api_key="-", max_retries=0) as client:
            messages = []
            for turn in range(3):
                messages.append({"role": "user", "content": f"turn {turn}. I am {name}"})
                reply = await client.chat.completions.create(model="m", messages=messages)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                await asyncio.sleep(0)
            return messages

    async def go():
        async with serving(ScriptedEngine(script), qwen_tokenizer) as gateway:
            names = [f"s{index}" for index in range(40)]
            sessions = {name: gateway.open_session(name) for name in names}
            conversations = await asyncio.gather(*(chat(gateway, name) for name in names))
            return names, sessions, conversations

    names, sessions, conversations = run(go())
    for name, messages in zip(names, conversations, strict=True):
        assert [m["content"] for m in messages if m["role"] == "assistant"] == [f"hello {name}"] * 3
        session = sessions[name]
        assert session.turns == 3 and session.drift == [] and session.rows == []
        row = session.trajectory(name, "completed")
        generated = [token for token, bit in zip(row.token_ids, row.loss_mask, strict=True) if bit]
        assert generated == say(f"hello {name}") * 3


def test_a_client_that_disconnects_mid_stream_loses_nothing(qwen_tokenizer, say):
    """The turn is in the session before the first chunk; a retry that extends it still extends it."""

    async def go():
        async with serving(
            ScriptedEngine([say("first answer"), say("second answer")]), qwen_tokenizer
        ) as gateway:
            session = gateway.open_session("s")
            url = f"{gateway.base_url('s')}/chat/completions"
            body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
            async with aiohttp.ClientSession() as http:
                response = await http.post(url, json=body)
                first_line = await response.content.readline()  # one chunk, then hang up
                response.close()
            await asyncio.sleep(0.05)
            messages = [*body["messages"], {"role": "assistant", "content": "first answer"}]
            messages.append({"role": "user", "content": "again"})
            async with openai.AsyncOpenAI(
                base_url=gateway.base_url("s"), api_key="-", max_retries=0
            ) as client:
                reply = await client.chat.completions.create(model="m", messages=messages)
            return first_line, session, reply, gateway.stats

    first_line, session, reply, stats = run(go())
    assert json.loads(first_line.decode().removeprefix("data: "))["object"] == "chat.completion.chunk"
    assert reply.choices[0].message.content == "second answer"
    assert session.turns == 2 and session.drift == [] and stats.errors == 0
