"""Real SDK clients through the gateway on a real tiny Qwen3 that really calls tools: exact tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import QUESTION, SYSTEM, add, multiply, run
from exactness_support import RecordingEngine
from gateway_support import anthropic_agent, openai_agent, responses_agent, serving
from transformers import AutoModelForCausalLM

from agentboost.agent.episode import run_agent
from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded.engine import LocalEngine
from agentboost.tokens.trajectory import TerminationReason

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def model(memorized_qwen3):
    return AutoModelForCausalLM.from_pretrained(memorized_qwen3, dtype=torch.float32).eval()


def through_gateway(model, tokenizer, agent, **agent_options):
    engine = RecordingEngine(LocalEngine(model))

    async def go():
        async with serving(
            engine, tokenizer, sampling=GREEDY, limits=RolloutLimits(max_new_tokens=64)
        ) as gateway:
            session = gateway.open_session("agent-1")
            anthropic = agent is anthropic_agent
            url = gateway.anthropic_url(session.id) if anthropic else gateway.base_url(session.id)
            messages = await agent(url, "agent-1", **agent_options)
            trajectory = session.trajectory("task", TerminationReason.COMPLETED)
        await engine.aclose()
        return messages, trajectory

    messages, trajectory = run(go())
    return engine, messages, trajectory


def teacher_forced(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def check_exact(model, engine, trajectory):
    """Prompts grow by extension, the mask is 1 exactly on generated ids, logprobs match teacher forcing."""
    ids, mask = trajectory.token_ids, trajectory.loss_mask
    assert trajectory.forked_rows == [] and trajectory.info["gateway"]["drift"] == []  # one row
    for earlier, later in zip(engine.prompts, [*engine.prompts[1:], ids], strict=True):
        assert later[: len(earlier)] == earlier
    generated = []
    for prompt in engine.prompts:
        segment = next(s for s in trajectory.segments if s.role == "assistant" and s.start == len(prompt))
        generated.extend(range(segment.start, segment.end))
    assert [i for i, bit in enumerate(mask) if bit] == generated
    reference = teacher_forced(model, ids)
    assert max(abs(trajectory.logprobs[i] - float(reference[i - 1])) for i in generated) <= 1e-4


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_agent_gets_the_provider_paths_exact_tokens(
    model, qwen_tokenizer, scripted_trajectory, stream
):
    engine, messages, trajectory = through_gateway(model, qwen_tokenizer, openai_agent, stream=stream)
    # the tiny model really called both tools and read their results
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["42", "84"]
    assert trajectory.metrics["tool_calls"] == 2 and trajectory.metrics["turns"] == 3
    assert trajectory.token_ids == scripted_trajectory.token_ids  # the ids the Strands provider produces
    check_exact(model, engine, trajectory)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk_agent_gets_the_same_exact_tokens(model, qwen_tokenizer, scripted_trajectory, stream):
    engine, messages, trajectory = through_gateway(model, qwen_tokenizer, anthropic_agent, stream=stream)
    results = [
        block["content"]
        for m in messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for block in m["content"]
    ]
    assert results == ["42", "84"]
    assert trajectory.token_ids == scripted_trajectory.token_ids
    check_exact(model, engine, trajectory)


@pytest.mark.parametrize(("stream", "chained"), [(False, False), (True, False), (False, True), (True, True)])
def test_responses_api_agent_gets_the_same_exact_tokens(
    model, qwen_tokenizer, scripted_trajectory, stream, chained
):
    """``responses.create`` plain and streamed, the whole input each time or chained by
    previous_response_id: the tiny model calls both tools, and the session is the provider's one row."""
    engine, items, trajectory = through_gateway(
        model, qwen_tokenizer, responses_agent, stream=stream, chained=chained
    )
    assert [item["output"] for item in items if item.get("type") == "function_call_output"] == ["42", "84"]
    assert items[-1]["type"] == "message" and items[-1]["content"][0]["text"].endswith("Answer: 84")
    assert trajectory.token_ids == scripted_trajectory.token_ids
    check_exact(model, engine, trajectory)


def test_strands_openai_model_through_the_gateway_matches_the_strands_provider(model, qwen_tokenizer):
    """Side by side: the same task through agentboost's provider and through a stock OpenAIModel."""
    from strands import Agent
    from strands.agent.conversation_manager import NullConversationManager
    from strands.models.openai import OpenAIModel

    provider = run(
        run_agent(
            LocalEngine(model),
            qwen_tokenizer,
            QUESTION,
            system_prompt=SYSTEM,
            tools=[add, multiply],
            template="qwen3",
            sampling=GREEDY,
            limits=RolloutLimits(max_new_tokens=64),
        )
    )

    async def strands_agent(base_url, api_key):
        agent = Agent(
            model=OpenAIModel(
                client_args={"base_url": base_url, "api_key": api_key, "max_retries": 0}, model_id="policy"
            ),
            tools=[add, multiply],
            system_prompt=SYSTEM,
            callback_handler=None,
            conversation_manager=NullConversationManager(),
        )
        result = await agent.invoke_async(QUESTION)
        return [str(result)]

    engine, _messages, trajectory = through_gateway(model, qwen_tokenizer, strands_agent)
    assert provider.metrics["tool_calls"] == trajectory.metrics["tool_calls"] == 2
    assert trajectory.token_ids == provider.token_ids
    assert trajectory.loss_mask == provider.loss_mask
    check_exact(model, engine, trajectory)
