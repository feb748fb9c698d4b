"""Agent frameworks, unchanged, through the gateway: the OpenAI Agents SDK with its default model (the
Responses API) and smolagents' ToolCallingAgent (Chat Completions, a multi-token ``stop`` list, its
history re-rendered every turn). A scripted engine answers, so each row's generated ids are known.

The figures docs/gateway.md's compatibility table quotes (rows per session, drift) are asserted here.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import QUESTION, run
from exactness_support import RecordingEngine
from gateway_support import serving

from agentboost.engines.scripted import ScriptedEngine
from agentboost.tokens.trajectory import TerminationReason

CALLS = [
    '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>',
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 42, "b": 2}}\n</tool_call>',
]


def serve_agent(say, script, agent):
    """A recording engine answering ``script``, and a coroutine serving ``agent(base_url)`` with it."""
    engine = RecordingEngine(ScriptedEngine([say(text) for text in script]))

    async def go(tokenizer):
        async with serving(engine, tokenizer) as gateway:
            session = gateway.open_session("framework")
            answer = await agent(gateway.base_url(session.id))
            assert gateway.stats.errors == 0
            return answer, session.trajectory("task", TerminationReason.COMPLETED)

    return engine, go


def generated_ids(row):
    return [token for token, bit in zip(row.token_ids, row.loss_mask, strict=True) if bit]


def assert_one_exact_row(engine, trajectory, script, say):
    """The session is one row (no drift), its generated ids are the script's, and every prompt the
    engine got extends the one before: the ids as generated, never re-rendered."""
    assert trajectory.forked_rows == [] and trajectory.info["gateway"]["drift"] == []
    assert generated_ids(trajectory) == [token for text in script for token in say(text)]
    for earlier, later in zip(engine.prompts, [*engine.prompts[1:], trajectory.token_ids], strict=True):
        assert later[: len(earlier)] == earlier


@pytest.mark.parametrize("streamed", [False, True])
def test_openai_agents_sdk_default_model_is_one_exact_row(qwen_tokenizer, say, streamed):
    agents = pytest.importorskip("agents")
    import openai

    agents.set_tracing_disabled(True)

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @agents.function_tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    async def agent(base_url):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0)
        model = agents.OpenAIProvider(openai_client=client).get_model("policy")  # the default: Responses
        assert type(model).__name__ == "OpenAIResponsesModel"
        calculator = agents.Agent(
            name="calculator", instructions="You are a calculator.", tools=[add, multiply], model=model
        )
        if streamed:
            result = agents.Runner.run_streamed(calculator, QUESTION)
            async for _event in result.stream_events():
                pass
        else:
            result = await agents.Runner.run(calculator, QUESTION)
        await client.close()
        return result.final_output

    script = [*CALLS, "Answer: 84"]
    engine, go = serve_agent(say, script, agent)
    answer, trajectory = run(go(qwen_tokenizer))
    assert answer == "Answer: 84"
    assert_one_exact_row(engine, trajectory, script, say)


def test_smolagents_tool_calling_agent_stops_on_its_strings_and_forks_per_turn(qwen_tokenizer, say):
    """smolagents sends stop=["Observation:", "Calling tools:"] (several tokens each) and re-renders
    the calls it got as assistant text and the results as user text: each turn starts a new row
    (``assistant_edited``), every row exact. One turn here is cut by the stop string."""
    smolagents = pytest.importorskip("smolagents")

    @smolagents.tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b

    @smolagents.tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a * b

    async def agent(base_url):
        model = smolagents.OpenAIServerModel(model_id="policy", api_base=base_url, api_key="-")
        calculator = smolagents.ToolCallingAgent(
            tools=[add, multiply], model=model, max_steps=5, verbosity_level=0
        )
        return await asyncio.to_thread(calculator.run, QUESTION)

    final = '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "84"}}\n</tool_call>'
    # the second turn runs on past its call into an "Observation:" it invents: the stop string cuts it
    script = [CALLS[0], CALLS[1] + "\nObservation: 84 and more", final]
    engine, go = serve_agent(say, script, agent)
    answer, trajectory = run(go(qwen_tokenizer))
    assert str(answer) == "84"
    rows = [*trajectory.forked_rows, trajectory]
    assert len(rows) == 3
    assert [event["reason"] for event in trajectory.info["gateway"]["drift"]] == ["assistant_edited"] * 2
    cut = qwen_tokenizer.encode(CALLS[1] + "\nObservation:", add_special_tokens=False)
    assert [generated_ids(row) for row in rows] == [say(CALLS[0]), cut, say(final)]
    assert rows[1].segments[-1].finish_reason == "stop_string"
    for prompt, row in zip(engine.prompts, rows, strict=True):
        assert row.token_ids[: len(prompt)] == prompt and sum(row.loss_mask[: len(prompt)]) == 0


def test_langchain_chat_openai_tool_loop_is_one_exact_row(qwen_tokenizer, say):
    """LangChain's ``ChatOpenAI`` with ``bind_tools``, in the tool loop its docs show (call, run the
    tools, send ``ToolMessage`` results back), over Chat Completions."""
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    tools = {"add": add, "multiply": multiply}

    async def agent(base_url):
        model = ChatOpenAI(model="policy", base_url=base_url, api_key="-", max_retries=0)
        bound = model.bind_tools(list(tools.values()))
        messages = [HumanMessage(QUESTION)]
        for _ in range(5):
            reply = await bound.ainvoke(messages)
            messages.append(reply)
            if not reply.tool_calls:
                return reply.content
            for call in reply.tool_calls:
                result = await tools[call["name"]].ainvoke(call["args"])
                messages.append(ToolMessage(str(result), tool_call_id=call["id"]))
        raise AssertionError("the loop did not end")

    script = [*CALLS, "Answer: 84"]
    engine, go = serve_agent(say, script, agent)
    answer, trajectory = run(go(qwen_tokenizer))
    assert answer == "Answer: 84"
    assert_one_exact_row(engine, trajectory, script, say)


@pytest.mark.parametrize("wire", ["chat", "responses"])
def test_pydantic_ai_agent_is_one_exact_row(qwen_tokenizer, say, wire):
    """pydantic-ai's ``Agent`` with plain-function tools, on its OpenAI chat model (its default for
    OpenAI-compatible servers) and on its Responses model."""
    pytest.importorskip("pydantic_ai")
    import openai
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    async def agent(base_url):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="-", max_retries=0)
        model_class = OpenAIChatModel if wire == "chat" else OpenAIResponsesModel
        model = model_class("policy", provider=OpenAIProvider(openai_client=client))
        calculator = Agent(model, instructions="You are a calculator.", tools=[add, multiply])
        result = await calculator.run(QUESTION)
        await client.close()
        return result.output

    script = [*CALLS, "Answer: 84"]
    engine, go = serve_agent(say, script, agent)
    answer, trajectory = run(go(qwen_tokenizer))
    assert answer == "Answer: 84"
    assert_one_exact_row(engine, trajectory, script, say)
