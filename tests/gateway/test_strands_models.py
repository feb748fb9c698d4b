"""Stock Strands model providers through the gateway give the Strands provider path's exact ids."""

from __future__ import annotations

import pytest
from conftest import QUESTION, SYSTEM, TOOL_SCRIPT, add, multiply, run
from gateway_support import serving

from agentboost.engines.scripted import ScriptedEngine
from agentboost.tokens.trajectory import TerminationReason


def stock_model(kind: str, gateway, session: str):
    if kind == "openai":
        from strands.models.openai import OpenAIModel

        client = {"base_url": gateway.base_url(session), "api_key": "-", "max_retries": 0}
        return OpenAIModel(client_args=client, model_id="policy")
    from strands.models.anthropic import AnthropicModel

    client = {"base_url": gateway.anthropic_url(session), "api_key": "-", "max_retries": 0}
    return AnthropicModel(client_args=client, model_id="policy", max_tokens=256)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_stock_strands_agent_through_the_gateway_matches_the_provider(
    qwen_tokenizer, say, scripted_trajectory, kind
):
    """Same script, same task: the gateway's row is the provider's trajectory, id for id."""
    from strands import Agent
    from strands.agent.conversation_manager import NullConversationManager

    async def go():
        engine = ScriptedEngine([say(text) for text in TOOL_SCRIPT])
        async with serving(engine, qwen_tokenizer) as gateway:
            session = gateway.open_session("s")
            agent = Agent(
                model=stock_model(kind, gateway, "s"),
                tools=[add, multiply],
                system_prompt=SYSTEM,
                callback_handler=None,
                conversation_manager=NullConversationManager(),
            )
            result = await agent.invoke_async(QUESTION)
            return str(result), session.trajectory("t", TerminationReason.COMPLETED)

    answer, trajectory = run(go())
    assert answer.strip() == "The result is 84.\nAnswer: 84"
    assert trajectory.info["gateway"]["drift"] == [] and trajectory.forked_rows == []
    assert trajectory.token_ids == scripted_trajectory.token_ids
    assert trajectory.loss_mask == scripted_trajectory.loss_mask
    assert [m["content"] for m in trajectory.messages if m["role"] == "tool"] == ["42", "84"]
