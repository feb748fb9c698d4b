"""A gateway that holds: clients that vanish, big prompts beside small ones, bodies over the limit.

Real HTTP on loopback (aiohttp and the anthropic SDK); a scripted engine, gated where a test needs a
turn to be in flight.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import aiohttp
import anthropic
import pytest
from conftest import run
from gateway_support import serving

from agentboost.engines.scripted import ScriptedEngine
from agentboost.tokens.builder import TokenBuffer
from agentboost.tokens.trajectory import TerminationReason

ANSWER = "The result is 84.\nAnswer: 84"


class GatedEngine(ScriptedEngine):
    """A scripted engine whose turns wait for the test to let them finish."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def generate(self, *args, **kwargs):
        self.started.set()
        await self.release.wait()
        return await super().generate(*args, **kwargs)


async def until(condition, what):
    for _ in range(600):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_turn_its_client_never_received_is_not_trained(qwen_tokenizer, say, caplog, stream):
    """Three clients go away while their turn is generated, then one retries and gets it: one row,
    one trained turn (before, 3 disconnects and a retry gave 4 rows, 3 never seen by the agent)."""
    caplog.set_level(logging.ERROR)
    body = {"model": "m", "messages": [{"role": "user", "content": "What is 42 * 2?"}], "stream": stream}

    async def go():
        engine = GatedEngine([say(ANSWER)], cycle=True)
        async with serving(engine, qwen_tokenizer) as gateway:
            session = gateway.open_session("s")
            url = f"{gateway.base_url('s')}/chat/completions"
            async with aiohttp.ClientSession() as http:
                for gone in range(1, 4):
                    engine.started.clear()
                    engine.release.clear()
                    request = asyncio.ensure_future(http.post(url, json=body))
                    await engine.started.wait()
                    request.cancel()  # the client goes away: its connection closes
                    await asyncio.gather(request, return_exceptions=True)
                    await asyncio.sleep(0.05)
                    engine.release.set()
                    await until(lambda gone=gone: gateway.stats.disconnects == gone, "the disconnect")
                engine.release.set()
                async with http.post(url, json=body) as response:
                    assert response.status == 200
                    text = await response.text()
            return session.trajectory("t", TerminationReason.COMPLETED), text

    trajectory, text = run(go())
    assert "Answer: 84" in text
    assert len(trajectory.training_rows) == 1 and trajectory.metrics["turns"] == 1
    assert trajectory.info["gateway"]["drift"] == []
    assert [entry["withdrawn"] for entry in trajectory.info["gateway"]["undelivered"]] == [True] * 3
    assert sum(trajectory.loss_mask) == len(say(ANSWER))
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant"]
    assert not [record for record in caplog.records if record.exc_info], "a traceback was logged"


def test_a_big_prompt_is_tokenized_off_the_event_loop(qwen_tokenizer, say, monkeypatch):
    """While one session's 100 KB prompt is being tokenized, another session is served to the end."""
    small_done = threading.Event()
    waited = []
    start = TokenBuffer.start

    def gated_start(self, messages):
        if sum(len(m.get("content") or "") for m in messages) > 50_000:
            waited.append(small_done.wait(timeout=60))  # never set if this blocked the event loop
        return start(self, messages)

    monkeypatch.setattr(TokenBuffer, "start", gated_start)

    async def go():
        async with serving(ScriptedEngine([say(ANSWER)], cycle=True), qwen_tokenizer) as gateway:
            gateway.open_session("big")
            gateway.open_session("small")
            async with aiohttp.ClientSession() as http:

                async def ask(session, text):
                    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
                    async with http.post(f"{gateway.base_url(session)}/chat/completions", json=body) as reply:
                        return reply.status

                big = asyncio.ensure_future(ask("big", "word " * 20_000))
                await asyncio.sleep(0.2)
                small = await ask("small", "hi")
                small_done.set()
                return small, await big

    assert run(go()) == (200, 200)
    assert waited == [True]


def test_a_body_over_the_limit_is_413_in_the_anthropic_shape(qwen_tokenizer, say):
    async def go():
        engine = ScriptedEngine([say(ANSWER)], cycle=True)
        async with serving(engine, qwen_tokenizer, max_request_bytes=4096) as gateway:
            gateway.open_session("s")
            client = anthropic.AsyncAnthropic(base_url=gateway.anthropic_url("s"), api_key="-", max_retries=0)
            fits = await client.messages.create(
                model="m", max_tokens=32, messages=[{"role": "user", "content": "hi"}]
            )
            with pytest.raises(anthropic.APIStatusError) as large:
                await client.messages.create(
                    model="m", max_tokens=32, messages=[{"role": "user", "content": "x" * 8000}]
                )
            await client.close()
            return fits, large.value

    fits, large = run(go())
    assert fits.content[0].text == ANSWER
    assert large.status_code == 413 and large.body["error"]["type"] == "request_too_large"
