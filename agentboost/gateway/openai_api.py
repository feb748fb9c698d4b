"""OpenAI Chat Completions on the wire: requests into :class:`ChatRequest`, turns into responses and chunks.

Supported: ``messages`` (system / developer, user, assistant with ``tool_calls``, tool), ``tools``,
``tool_choice`` (accepted, not enforced: the model's tokens are never constrained), ``n`` = 1,
``stream`` with ``stream_options.include_usage``, ``max_tokens`` / ``max_completion_tokens``,
``temperature``, ``top_p``, ``stop`` (strings that are one token each). Parameters that would change
what the answer means and that the gateway cannot honour (``n`` > 1, ``logit_bias``,
``response_format``, legacy ``functions``) are refused with HTTP 400.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from agentboost.gateway.message_keys import WireMemo, parse_messages
from agentboost.gateway.session import ChatRequest, GatewayError, ServedTurn
from agentboost.gateway.wire import (
    bad_request,
    number_field,
    positive_int_field,
    stop_ids,
    text_of_parts,
    tool_schema,
)
from agentboost.tokens.templates import Message
from agentboost.tokens.tokenizer import Tokenizer

_REFUSED = {
    "logit_bias": "logit_bias is not supported (the gateway never changes the model's distribution)",
    "response_format": "response_format is not supported: ask for the format in the prompt",
    "functions": "the legacy 'functions' parameter is not supported; send 'tools'",
    "function_call": "the legacy 'function_call' parameter is not supported; send 'tool_choice'",
}

_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "not_found": "not_found_error",
    "authentication": "authentication_error",
    "session_ended": "invalid_request_error",
    "engine": "api_error",
    "request_too_large": "invalid_request_error",
}


def error_body(error: GatewayError) -> dict[str, Any]:
    """The OpenAI error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = _ERROR_TYPES.get(error.kind, "invalid_request_error")
    return {"error": {"message": error.message, "type": kind, "param": None, "code": error.code}}


def parse_request(
    body: Any, tokenizer: Tokenizer, memo: WireMemo | None = None
) -> tuple[ChatRequest, bool, bool]:
    """(request, stream, include_usage) from a Chat Completions body; GatewayError when it is malformed.

    ``memo`` (the session's last request, :attr:`ChatRequest.memo`) spares re-translating its messages.
    """
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    for key, reason in _REFUSED.items():
        if body.get(key) is not None:
            raise bad_request(reason, code="unsupported_parameter")
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request(f"n={n!r} is not supported: the gateway serves one choice per request (n=1)")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise bad_request("'messages' must be a non-empty list of chat messages")
    parsed = parse_messages("openai", raw_messages, _message, memo)
    messages, keys, system = parsed.messages, parsed.keys, None
    if messages and messages[0]["role"] == "system":
        system, messages, keys = messages[0]["content"], messages[1:], keys[1:]
    tools = []
    for index, tool in enumerate(body.get("tools") or ()):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or tool.get("type", "function") != "function":
            raise bad_request(f"tools[{index}] must be {{'type': 'function', 'function': {{...}}}}")
        tools.append(
            tool_schema(function.get("name"), function.get("description"), function.get("parameters"), index)
        )
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    stop = body.get("stop")
    request = ChatRequest(
        messages=messages,
        keys=keys,
        memo=parsed,
        system=system,
        tools=tools,
        max_tokens=positive_int_field(max_tokens, "max_tokens"),
        temperature=number_field(body.get("temperature"), "temperature"),
        top_p=number_field(body.get("top_p"), "top_p"),
        stop_token_ids=stop_ids([stop] if isinstance(stop, str) else stop, tokenizer, "stop"),
    )
    stream = body.get("stream") is True
    options = body.get("stream_options") or {}
    return request, stream, bool(isinstance(options, Mapping) and options.get("include_usage"))


def _message(message: Any, index: int) -> list[Message]:
    """One wire message as chat messages (a system message, only first, keeps its role here)."""
    if not isinstance(message, Mapping):
        raise bad_request(f"messages[{index}] must be an object")
    role = message.get("role")
    if role in ("system", "developer"):
        if index:
            raise bad_request(f"messages[{index}]: a system message is only allowed first")
        return [
            {"role": "system", "content": text_of_parts(message.get("content"), f"messages[{index}].content")}
        ]
    if role == "user":
        return [{"role": "user", "content": text_of_parts(message.get("content"), f"messages[{index}]")}]
    if role == "assistant":
        return [_assistant(message, index)]
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise bad_request(f"messages[{index}]: a tool message needs a 'tool_call_id' string")
        content = text_of_parts(message.get("content"), f"messages[{index}].content")
        return [{"role": "tool", "tool_call_id": call_id, "content": content}]
    raise bad_request(f"messages[{index}]: unknown role {role!r}; use system, user, assistant or tool")


def _assistant(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    content = message.get("content")
    text = "" if content is None else text_of_parts(content, f"messages[{index}].content")
    calls = []
    for position, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise bad_request(f"messages[{index}].tool_calls[{position}] needs a function with a name")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            # invalid JSON is kept as sent: it then cannot match a call the gateway served (drift)
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        calls.append(
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    result: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        result["tool_calls"] = calls
    return result


def _finish_reason(served: ServedTurn) -> str:
    if served.turn.tool_calls:
        return "tool_calls"
    return "length" if served.turn.finish_reason == "length" else "stop"


def _wire_calls(served: ServedTurn) -> list[dict[str, Any]]:
    return [
        {
            "id": call["id"],
            "type": "function",
            "function": {
                "name": call["function"]["name"],
                "arguments": json.dumps(call["function"]["arguments"], ensure_ascii=False),
            },
        }
        for call in served.message.get("tool_calls") or ()
    ]


def _usage(served: ServedTurn) -> dict[str, int]:
    return {
        "prompt_tokens": served.prompt_tokens,
        "completion_tokens": served.completion_tokens,
        "total_tokens": served.prompt_tokens + served.completion_tokens,
    }


def response(served: ServedTurn, model: str) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": served.turn.content or None}
    if served.turn.reasoning is not None:
        message["reasoning_content"] = served.turn.reasoning
    calls = _wire_calls(served)
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": _finish_reason(served), "logprobs": None}
        ],
        "usage": _usage(served),
    }


def stream_chunks(served: ServedTurn, model: str, include_usage: bool) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` objects in OpenAI's order: role, reasoning, content, calls, finish, usage."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
    }
    base["model"] = model

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    yield chunk({"role": "assistant", "content": ""})
    if served.turn.reasoning is not None:
        yield chunk({"reasoning_content": served.turn.reasoning})
    if served.turn.content:
        yield chunk({"content": served.turn.content})
    for index, call in enumerate(_wire_calls(served)):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, _finish_reason(served))
    if include_usage:
        yield {**base, "choices": [], "usage": _usage(served)}
