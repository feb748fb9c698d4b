"""The chat messages that cross layers have one typed shape (agentboost.tokens.messages)."""

from __future__ import annotations

import json

from agentboost.export.formats import chat_messages
from agentboost.tokens.messages import ChatMessage, ChatToolCall, FunctionCall
from agentboost.tokens.trajectory import Trajectory


def assert_shape(message: dict) -> None:
    assert message["role"] in ("system", "user", "assistant", "tool")
    extra = set(message) - set(ChatMessage.__required_keys__ | ChatMessage.__optional_keys__)
    assert not extra, f"{message['role']} message has keys outside ChatMessage: {sorted(extra)}"
    for call in message.get("tool_calls", []):
        assert set(call) == set(ChatToolCall.__annotations__) and call["type"] == "function"
        assert set(call["function"]) == set(FunctionCall.__annotations__)


def test_a_tool_calling_trajectory_speaks_only_the_typed_shape(scripted_trajectory):
    messages = scripted_trajectory.messages
    for message in messages:
        assert_shape(message)
    roles = [message["role"] for message in messages]
    assert roles[:2] == ["system", "user"] and "tool" in roles and roles[-1] == "assistant"
    calls = [call for message in messages for call in message.get("tool_calls", [])]
    assert calls and all(isinstance(call["function"]["arguments"], dict) for call in calls)
    answered = {message["tool_call_id"] for message in messages if message["role"] == "tool"}
    assert answered == {call["id"] for call in calls}
    assert all("raw" in message for message in messages if message["role"] == "assistant")


def test_the_shape_survives_json_and_the_chat_export(scripted_trajectory):
    again = Trajectory.from_dict(json.loads(json.dumps(scripted_trajectory.to_dict())))
    assert again.messages == scripted_trajectory.messages
    for message in chat_messages(again.messages):
        assert_shape(message)
        assert "raw" not in message  # the export drops the generated text, which repeats content and calls
