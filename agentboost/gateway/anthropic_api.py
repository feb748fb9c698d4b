"""Anthropic Messages on the wire: requests into :class:`ChatRequest`, turns into messages and events.

Supported: ``system`` (text or text blocks), ``messages`` with ``text``, ``tool_use`` and
``tool_result`` blocks (``thinking`` blocks the client sends back are ignored: the session holds the
reasoning tokens), ``tools``, ``tool_choice`` (accepted, not enforced), ``max_tokens``,
``temperature``, ``top_p``, ``stop_sequences``, ``stream``, ``thinking`` (the
reasoning a ``<think>`` model wrote comes back as a ``thinking`` block; its budget is not
enforced). A user message's tool results become tool messages, in the order sent, before its text.
Server tools (typed tools such as ``web_search_20250305``) are refused: the gateway runs none.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from agentboost.gateway.message_keys import WireMemo, parse_messages
from agentboost.gateway.session import ChatRequest, GatewayError, ServedTurn
from agentboost.gateway.wire import (
    bad_request,
    hosted_tool,
    number_field,
    positive_int_field,
    stop_ids,
    text_of_parts,
    tool_schema,
)
from agentboost.tokens.templates import Message
from agentboost.tokens.tokenizer import Tokenizer

_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "not_found": "not_found_error",
    "authentication": "authentication_error",
    "session_ended": "invalid_request_error",
    "engine": "api_error",
    "request_too_large": "request_too_large",
}


_THINKING_TYPES = ("enabled", "adaptive", "disabled")


def error_body(error: GatewayError) -> dict[str, Any]:
    """The Anthropic error shape: ``{"type": "error", "error": {"type", "message"}}``."""
    return {
        "type": "error",
        "error": {"type": _ERROR_TYPES.get(error.kind, "api_error"), "message": error.message},
    }


def parse_request(
    body: Any, tokenizer: Tokenizer, memo: WireMemo | None = None
) -> tuple[ChatRequest, bool, bool]:
    """(request, stream, thinking) from a Messages body; GatewayError when it is malformed.

    ``thinking``: whether the answer shows the model's reasoning as a ``thinking`` block (the
    request's ``thinking`` is ``enabled`` or ``adaptive``, and its ``display`` is not ``omitted``).

    ``memo`` (the session's last request, :attr:`ChatRequest.memo`) spares re-translating its messages.
    """
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise bad_request("'messages' must be a non-empty list of messages")
    system = body.get("system")
    system_text = None if system is None else text_of_parts(_text_blocks(system), "system")
    parsed = parse_messages("anthropic", raw_messages, _message, memo)
    tools = [_tool(tool, index) for index, tool in enumerate(body.get("tools") or ())]
    stop_token_ids, stop_strings = stop_ids(body.get("stop_sequences"), tokenizer, "stop_sequences")
    request = ChatRequest(
        messages=parsed.messages,
        keys=parsed.keys,
        memo=parsed,
        system=system_text or None,
        tools=tools,
        max_tokens=positive_int_field(body.get("max_tokens"), "max_tokens"),
        temperature=number_field(body.get("temperature"), "temperature"),
        top_p=number_field(body.get("top_p"), "top_p"),
        stop_token_ids=stop_token_ids,
        stop_strings=stop_strings,
    )
    return request, body.get("stream") is True, _thinking(body.get("thinking"))


def _tool(tool: Any, index: int) -> dict[str, Any]:
    """A client tool; a server tool (a typed one such as ``web_search_20250305``) is refused: the
    gateway has no server to run it, and offering it to the model as a function would be a lie."""
    if not isinstance(tool, Mapping):
        return tool_schema(None, None, None, index)
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise hosted_tool(index, kind, "a client tool (name, description, input_schema)")
    return tool_schema(tool.get("name"), tool.get("description"), tool.get("input_schema"), index)


def _thinking(config: Any) -> bool:
    """Whether ``thinking`` asks to see the reasoning. Its budget is not enforced: the model's own
    ``<think>`` span is what it is, within max_tokens."""
    if config is None:
        return False
    if not isinstance(config, Mapping) or config.get("type") not in _THINKING_TYPES:
        raise bad_request(f"thinking.type must be one of {', '.join(_THINKING_TYPES)}")
    return config["type"] != "disabled" and config.get("display") != "omitted"


def _message(message: Any, index: int) -> list[Message]:
    """One wire message as chat messages: a user message's tool results come first, then its text."""
    if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
        raise bad_request(f"messages[{index}] must be an object with role 'user' or 'assistant'")
    blocks = _blocks(message.get("content"), index)
    if message["role"] == "assistant":
        return [_assistant(blocks, index)]
    messages: list[Message] = []
    texts = []
    for block in blocks:
        if block.get("type") == "tool_result":
            content = block.get("content", "")
            text = text_of_parts(_text_blocks(content), f"messages[{index}] tool_result content")
            messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif block.get("type") == "text":
            texts.append(block)
        else:
            raise bad_request(
                f"messages[{index}]: user blocks of type {block.get('type')!r} are not supported"
            )
    if texts:
        messages.append({"role": "user", "content": text_of_parts(texts, f"messages[{index}]")})
    return messages


def _text_blocks(content: Any) -> Any:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _blocks(content: Any, index: int) -> list[Mapping[str, Any]]:
    blocks = _text_blocks(content)
    if not isinstance(blocks, list) or not all(isinstance(block, Mapping) for block in blocks):
        raise bad_request(f"messages[{index}].content must be text or a list of content blocks")
    return blocks


def _assistant(blocks: list[Mapping[str, Any]], index: int) -> dict[str, Any]:
    texts, calls = [], []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(block)
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str):
                raise bad_request(f"messages[{index}]: a tool_use block needs a name")
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block["name"], "arguments": block.get("input", {})},
                }
            )
        elif kind not in ("thinking", "redacted_thinking"):
            raise bad_request(f"messages[{index}]: assistant blocks of type {kind!r} are not supported")
    message: dict[str, Any] = {"role": "assistant", "content": text_of_parts(texts, f"messages[{index}]")}
    if calls:
        message["tool_calls"] = calls
    return message


def _stop_reason(served: ServedTurn) -> str:
    if served.turn.tool_calls:
        return "tool_use"
    if served.turn.stop_string is not None:
        return "stop_sequence"
    return "max_tokens" if served.turn.finish_reason == "length" else "end_turn"


def _content(served: ServedTurn, thinking: bool) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if thinking and served.turn.reasoning is not None:
        # the signature is opaque to clients, which send it back; the session holds the tokens anyway
        blocks.append({"type": "thinking", "thinking": served.turn.reasoning, "signature": ""})
    if served.turn.content or not served.turn.tool_calls:
        blocks.append({"type": "text", "text": served.turn.content})
    for call in served.message.get("tool_calls") or ():
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": call["function"]["arguments"],
            }
        )
    return blocks


def response(served: ServedTurn, model: str, thinking: bool = False) -> dict[str, Any]:
    """A ``message`` object (a ``thinking`` block first when asked for and the model reasoned)."""
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _content(served, thinking),
        "stop_reason": _stop_reason(served),
        "stop_sequence": served.turn.stop_string,
        "usage": {"input_tokens": served.prompt_tokens, "output_tokens": served.completion_tokens},
    }


def stream_events(
    served: ServedTurn, model: str, thinking: bool = False
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) in Anthropic's order: message_start, each block's start/delta(s)/stop,
    message_delta (stop reason, usage), message_stop."""
    import json

    message = response(served, model, thinking)
    start = {**message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 0}}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(message["content"]):
        if block["type"] == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        elif block["type"] == "text":
            empty, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}]
        else:
            empty = {**block, "input": {}}
            partial = json.dumps(block["input"], ensure_ascii=False)
            deltas = [{"type": "input_json_delta", "partial_json": partial}]
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": empty}
        for delta in deltas:
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
            "usage": {"output_tokens": served.completion_tokens},
        },
    )
    yield "message_stop", {"type": "message_stop"}


__all__ = ["GatewayError", "error_body", "parse_request", "response", "stream_events"]
