"""Every parameter handled on purpose, through the stock SDKs: seed, logprobs, penalties of 0,
response_format text, multi-token stop strings, count_tokens; and the Responses API's own shapes
(reasoning items, stream event order, store=false)."""

from __future__ import annotations

import anthropic
import openai
import pytest
from conftest import TOOL_SCRIPT, run
from gateway_support import ANTHROPIC_TOOLS, RESPONSES_TOOLS, serving

from agentboost.engines.scripted import ScriptedEngine
from agentboost.tokens.trajectory import TerminationReason


class SeedRecorder(ScriptedEngine):
    """A scripted engine that keeps the seed of every request it was sent."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seeds = []

    async def generate(self, prompt_ids, sampling, *, max_new_tokens):
        self.seeds.append(sampling.seed)
        return await super().generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)


def test_chat_seed_logprobs_penalties_and_text_format_are_served(qwen_tokenizer, say):
    engine = SeedRecorder([say(TOOL_SCRIPT[2])], cycle=True)

    async def go():
        async with serving(engine, qwen_tokenizer) as gateway:
            session = gateway.open_session("s1")
            client = openai.AsyncOpenAI(base_url=gateway.base_url("s1"), api_key="-", max_retries=0)
            messages = [{"role": "user", "content": "hi"}]
            reply = await client.chat.completions.create(
                model="m",
                messages=messages,
                seed=7,
                logprobs=True,
                top_logprobs=0,
                frequency_penalty=0,
                presence_penalty=0,
                response_format={"type": "text"},
            )
            plain = await client.chat.completions.create(
                model="m", messages=[*messages, reply.choices[0].message.model_dump(), *messages]
            )
            await client.close()
            return reply, plain, session.trajectory("t", TerminationReason.COMPLETED)

    reply, plain, trajectory = run(go())
    assert engine.seeds == [7, None]  # the client's seed, as sent; none when it sends none
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens == len(say(TOOL_SCRIPT[2]))
    first = trajectory.segments[1]  # the first generated turn
    assert [entry.logprob for entry in entries] == trajectory.logprobs[first.start : first.end]
    assert "".join(entry.token for entry in entries) == TOOL_SCRIPT[2] + "<|im_end|>"
    assert plain.choices[0].logprobs is None  # only when asked for


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_multi_token_stop_string_ends_the_turn_and_the_row_stays_exact(qwen_tokenizer, say, api):
    """The turn keeps its ids through the one that completed the stop string; the client gets the
    text before it; the next request extends the row (the template closes the turn, mask 0)."""
    engine = ScriptedEngine([say("The result is 84.\nObservation: done"), say("ok")])
    stop = "Observation:"

    async def go():
        async with serving(engine, qwen_tokenizer) as gateway:
            session = gateway.open_session("s1")
            if api == "openai":
                client = openai.AsyncOpenAI(base_url=gateway.base_url("s1"), api_key="-", max_retries=0)
                messages = [{"role": "user", "content": "hi"}]
                first = await client.chat.completions.create(model="m", messages=messages, stop=[stop, "END"])
                text, reason = first.choices[0].message.content, first.choices[0].finish_reason
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
                await client.chat.completions.create(model="m", messages=messages, stop=[stop])
            else:
                client = anthropic.AsyncAnthropic(
                    base_url=gateway.anthropic_url("s1"), api_key="-", max_retries=0
                )
                messages = [{"role": "user", "content": "hi"}]
                first = await client.messages.create(
                    model="m", max_tokens=64, messages=messages, stop_sequences=[stop]
                )
                text, reason = first.content[0].text, (first.stop_reason, first.stop_sequence)
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
                await client.messages.create(model="m", max_tokens=64, messages=messages)
            await client.close()
            return text, reason, session.trajectory("t", TerminationReason.COMPLETED)

    text, reason, trajectory = run(go())
    assert text == "The result is 84.\n"
    assert reason == ("stop" if api == "openai" else ("stop_sequence", stop))
    assert trajectory.forked_rows == [] and trajectory.info["gateway"]["drift"] == []
    turn = trajectory.segments[1]
    kept = trajectory.token_ids[turn.start : turn.end]
    assert turn.finish_reason == "stop_string"
    assert qwen_tokenizer.decode(kept).endswith(stop) and not qwen_tokenizer.decode(kept[:-1]).endswith(stop)
    assert kept == say("The result is 84.\nObservation: done")[: len(kept)]
    assert trajectory.loss_mask[turn.end] == 0  # the template's closing tokens are the client's


def test_count_tokens_matches_the_prompt_the_gateway_renders(qwen_tokenizer, say):
    async def go():
        async with serving(ScriptedEngine([say("ok")]), qwen_tokenizer) as gateway:
            gateway.open_session("s1")
            client = anthropic.AsyncAnthropic(
                base_url=gateway.anthropic_url("s1"), api_key="-", max_retries=0
            )
            request = {
                "model": "m",
                "system": "Be brief.",
                "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                "tools": ANTHROPIC_TOOLS,
            }
            counted = await client.messages.count_tokens(**request)
            served = await client.messages.create(max_tokens=8, **request)
            await client.close()
            return counted.input_tokens, served.usage.input_tokens, len(gateway.sessions)

    counted, served, sessions = run(go())
    assert counted == served > 100  # the tools' schemas are in the prompt
    assert sessions == 1  # counting opened no session


def test_responses_reasoning_items_stream_order_logprobs_and_store(qwen_tokenizer, say):
    engine = ScriptedEngine([say("<think>\nAdd first.\n</think>\n\n" + TOOL_SCRIPT[0])], cycle=True)

    async def go():
        async with serving(engine, qwen_tokenizer) as gateway:
            gateway.open_session("s1")
            client = openai.AsyncOpenAI(base_url=gateway.base_url("s1"), api_key="-", max_retries=0)
            request = {"model": "m", "input": "hi", "tools": RESPONSES_TOOLS}
            plain = await client.responses.create(
                **request, include=["message.output_text.logprobs"], store=False
            )
            stream = await client.responses.create(**request, stream=True)
            events = [event async for event in stream]
            with pytest.raises(openai.BadRequestError) as unstored:
                await client.responses.create(model="m", input="more", previous_response_id=plain.id)
            await client.close()
            return plain, events, unstored.value

    plain, events, unstored = run(go())
    reasoning, message, call = plain.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Add first."
    assert message.content[0].text == "I will add first."
    assert len(message.content[0].logprobs) == plain.usage.output_tokens
    assert call.type == "function_call" and call.name == "add" and call.call_id.startswith("call_")
    assert plain.usage.output_tokens_details.reasoning_tokens > 0
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        *["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta"],
        *["response.reasoning_text.done", "response.content_part.done", "response.output_item.done"],
        *["response.output_item.added", "response.content_part.added", "response.output_text.delta"],
        *["response.output_text.done", "response.content_part.done", "response.output_item.done"],
        *["response.output_item.added", "response.function_call_arguments.delta"],
        *["response.function_call_arguments.done", "response.output_item.done"],
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert [item.type for item in events[-1].response.output] == ["reasoning", "message", "function_call"]
    assert unstored.body["code"] == "previous_response_not_found"  # store=false kept nothing
