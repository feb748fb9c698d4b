"""Chat messages as they cross layers: the agent's chat view, the gateway, environments, export.

One home for the shapes (TypedDicts: plain dicts at run time, JSON as they are). They are OpenAI's chat
messages with agentboost's additions: ``raw`` (the generated text, stop token included) on assistant
turns, ``error`` / ``metadata`` on tool results, and ``source`` on every message (who wrote it: the
policy, the environment, or a gateway client; what a reward may trust). A
:class:`~agentboost.tokens.trajectory.Trajectory` keeps its conversation in this form; the token ids,
not these messages, are what training reads.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

Role = Literal["system", "user", "assistant", "tool"]
Source = Literal["policy", "environment", "client"]
"""Who wrote a message: ``policy`` (the model being trained generated it: its tokens are the
trajectory's), ``environment`` (agentboost's environment: system and task prompts, its tools' results,
a simulated user) or ``client`` (a gateway client sent it: any text, including assistant turns and tool
results the policy never produced)."""


class FunctionCall(TypedDict):
    """The function a tool call names, and its arguments (an object; a JSON string as some clients send)."""

    name: str
    arguments: dict[str, Any] | str


class ChatToolCall(TypedDict):
    """One tool call of an assistant message, in OpenAI's shape."""

    id: str | None
    type: Literal["function"]
    function: FunctionCall


class _HasRole(TypedDict):
    role: Role


class ChatMessage(_HasRole, total=False):
    """One chat message. ``role`` is always there; the rest depends on it."""

    content: str
    """The visible text (for assistants: reasoning and valid tool calls removed)."""
    reasoning_content: str
    """An assistant's think block, when it had one."""
    tool_calls: list[ChatToolCall]
    """An assistant's valid tool calls, in order."""
    raw: str
    """An assistant turn's generated text, verbatim (stop token included)."""
    tool_call_id: str
    """A tool result: the call it answers."""
    name: str | None
    """A tool result: the tool's name (None for a malformed call answered with an error)."""
    error: bool
    """A tool result: the tool failed, or the call was malformed."""
    metadata: dict[str, Any]
    """A tool result: facts the environment attached to it (``Episode.annotate_tool``)."""
    source: Source
    """Who wrote the message (:data:`Source`). Rewards that must not be forged read only ``policy`` and
    ``environment`` messages (docs/gateway.md)."""


__all__ = ["ChatMessage", "ChatToolCall", "FunctionCall", "Role", "Source"]
