"""Shared pieces of the gateway tests: agents written against the stock SDKs, and a served gateway."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
from conftest import QUESTION, SYSTEM, TOOL_SCRIPT, add, multiply

from agentboost.engines.scripted import ScriptedEngine
from agentboost.envs.base import Environment, RolloutResult
from agentboost.envs.task import Task
from agentboost.eval.evaluate import evaluate
from agentboost.gateway.environment import AgentContext, GatewayEnvironment
from agentboost.gateway.server import Gateway
from agentboost.rollout.results import read_results
from agentboost.tokens.templates import tool_specs_to_openai

OPENAI_TOOLS = tool_specs_to_openai([add.tool_spec, multiply.tool_spec])
"""The calculator tools as an OpenAI client declares them (what Strands' OpenAIModel sends)."""
ANTHROPIC_TOOLS = [
    {
        "name": tool["function"]["name"],
        "description": tool["function"]["description"],
        "input_schema": tool["function"]["parameters"],
    }
    for tool in OPENAI_TOOLS
]
RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in OPENAI_TOOLS]
"""The calculator tools as a Responses API client declares them."""
IMPLEMENTATIONS = {"add": lambda a, b: a + b, "multiply": lambda a, b: a * b}


async def openai_agent(
    base_url: str, api_key: str, *, stream: bool = False, max_turns: int = 8
) -> list[dict[str, Any]]:
    """A plain OpenAI-SDK tool loop, as users write it. Returns the messages it ended with."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    try:
        for _ in range(max_turns):
            if stream:
                message = await _streamed_message(client, messages)
            else:
                response = await client.chat.completions.create(
                    model="policy", messages=messages, tools=OPENAI_TOOLS
                )
                message = response.choices[0].message.model_dump(exclude_none=True)
            messages.append(message)
            if not message.get("tool_calls"):
                return messages
            for call in message["tool_calls"]:
                result = IMPLEMENTATIONS[call["function"]["name"]](
                    **json.loads(call["function"]["arguments"])
                )
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(result)})
    finally:
        await client.close()
    return messages


async def responses_agent(
    base_url: str, api_key: str, *, stream: bool = False, chained: bool = False, max_turns: int = 8
) -> list[Any]:
    """A tool loop on the Responses API (``client.responses.create``), as its docs write it: either
    the whole conversation as input each time, or only the new items after ``previous_response_id``.
    Returns every item of the conversation."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    new, previous = list(items), None
    try:
        for _ in range(max_turns):
            request = {"model": "policy", "instructions": SYSTEM, "tools": RESPONSES_TOOLS}
            request["input"] = new if chained else items
            if chained and previous is not None:
                request["previous_response_id"] = previous
            if stream:
                async with client.responses.stream(**request) as events:
                    async for _event in events:
                        pass
                    response = await events.get_final_response()
            else:
                response = await client.responses.create(**request)
            previous = response.id
            output = [item.model_dump(exclude_none=True) for item in response.output]
            items += output
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                return items
            new = [
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": str(IMPLEMENTATIONS[call.name](**json.loads(call.arguments))),
                }
                for call in calls
            ]
            items += new
    finally:
        await client.close()
    return items


async def _streamed_message(client: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    stream = await client.chat.completions.create(
        model="policy", messages=messages, tools=OPENAI_TOOLS, stream=True
    )
    content, calls = "", {}
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                entry = calls.setdefault(
                    call.index, {"id": call.id, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message


async def anthropic_agent(
    base_url: str, api_key: str, *, stream: bool = False, max_turns: int = 8
) -> list[dict[str, Any]]:
    """A plain Anthropic-SDK tool loop."""
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    try:
        for _ in range(max_turns):
            request = {
                "model": "policy",
                "max_tokens": 256,
                "system": SYSTEM,
                "messages": messages,
                "tools": ANTHROPIC_TOOLS,
            }
            if stream:
                async with client.messages.stream(**request) as events:
                    reply = await events.get_final_message()
            else:
                reply = await client.messages.create(**request)
            blocks = [block.model_dump(exclude_none=True) for block in reply.content]
            messages.append({"role": "assistant", "content": blocks})
            uses = [block for block in reply.content if block.type == "tool_use"]
            if not uses:
                return messages
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": use.id,
                            "content": str(IMPLEMENTATIONS[use.name](**use.input)),
                        }
                        for use in uses
                    ],
                }
            )
    finally:
        await client.close()
    return messages


@asynccontextmanager
async def serving(engine: Any, tokenizer: Any, **options: Any):
    gateway = Gateway(engine, tokenizer, template=options.pop("template", "qwen3"), **options)
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.aclose()


class Calculation(Environment):
    """Tasks and a reward for the scripted calculator conversation."""

    name = "calculation"

    def tasks(self, n=None, *, seed=0, split="train"):
        return [
            Task(id=f"t{index}", prompt="What is (12 + 30) * 2?", ground_truth="84")
            for index in range(n or 2)
        ]

    def reward(self, trajectory, episode):
        return float(trajectory.final_text.endswith(f"Answer: {episode.task.ground_truth}"))


async def forking_agent(context: AgentContext):
    """Rewrites its own history after the first tool call: the session forks into two rows."""
    client = openai.AsyncOpenAI(base_url=context.base_url, api_key=context.api_key, max_retries=0)
    messages = [{"role": "user", "content": context.task.text}]
    first = (
        (await client.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS))
        .choices[0]
        .message
    )
    call = first.tool_calls[0]
    messages += [{"role": "assistant", "content": "Let me add.", "tool_calls": [call.model_dump()]}]  # edited
    messages += [{"role": "tool", "tool_call_id": call.id, "content": "42"}]
    second = await client.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)
    await client.close()
    return second.choices[0].message.content


def forked_results(tokenizer: Any, path: Path, policy: str = "fork") -> list[RolloutResult]:
    """Two evaluated rollouts of :func:`forking_agent` (rewards 1 and 0), written to ``path``.

    Under ``fork`` each has two training rows; under ``reset`` the first row is dropped.
    """
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    script = [TOOL_SCRIPT[0], "Answer: 84", TOOL_SCRIPT[0], "Answer: 41"]
    engine = ScriptedEngine([[*tokenizer.encode(text, add_special_tokens=False), im_end] for text in script])
    environment = GatewayEnvironment(forking_agent, tasks_from=Calculation(), policy=policy)
    tasks = environment.tasks(2)
    asyncio.run(evaluate(environment, engine, tokenizer, tasks, out=path, concurrency=1, progress=False))
    results = list(read_results(path))
    assert [len(result.trajectory.training_rows) for result in results] == [1 + (policy == "fork")] * 2
    return results
