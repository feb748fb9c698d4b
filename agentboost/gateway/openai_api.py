"""OpenAI Chat Completions on the wire: requests into :class:`ChatRequest`, turns into responses and chunks.

Supported: ``messages`` (system / developer, user, assistant with ``tool_calls``, tool), ``tools``,
``tool_choice`` (accepted, not enforced: the model's tokens are never constrained), ``n`` = 1,
``stream`` with ``stream_options.include_usage``, ``max_tokens`` / ``max_completion_tokens``,
``temperature``, ``top_p``, ``seed``, ``stop`` (a string or a list), ``logprobs`` (the sampled ids'
logprobs; ``top_logprobs`` 0 only), ``response_format`` ``text``, penalties of 0. Parameters that
would change what the answer means and that the gateway cannot honour (``n`` > 1, ``logit_bias``,
other ``response_format`` types, non-zero penalties, legacy ``functions``) are refused with HTTP 400.
The parameter checks both OpenAI APIs share are :func:`sampling_fields`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from agentboost.gateway.message_keys import WireMemo, parse_messages
from agentboost.gateway.session import ChatRequest, GatewayError, ServedTurn
from agentboost.gateway.wire import (
    bad_request,
    call_arguments,
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


def check_body(body: Any, refused: Mapping[str, str]) -> Mapping[str, Any]:
    """What both OpenAI APIs refuse alike: a body that is not an object, the ``refused`` parameters,
    penalties other than 0 (the engines sample without them), ``top_logprobs`` other than 0."""
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    for key, reason in refused.items():
        if body.get(key) is not None:
            raise bad_request(reason, code="unsupported_parameter")
    for name in ("frequency_penalty", "presence_penalty"):
        value = body.get(name)
        if value is not None and value != 0:
            raise bad_request(
                f"{name}={value!r} is not supported: the engines sample without penalties "
                "(send 0 or omit it)",
                code="unsupported_parameter",
            )
    top_logprobs_field(body.get("top_logprobs"))
    return body


def text_format_field(form: Any, name: str) -> None:
    """``response_format`` / ``text.format``: only ``{"type": "text"}`` (the default) is served."""
    if form is not None and (not isinstance(form, Mapping) or form.get("type") != "text"):
        raise bad_request(
            f"{name} other than {{'type': 'text'}} is not supported: the model's tokens are never "
            "constrained; ask for the format in the prompt",
            code="unsupported_parameter",
        )


def seed_field(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"seed must be an integer, got {value!r}")
    return value


def top_logprobs_field(value: Any) -> None:
    """``top_logprobs``: the engines return only the sampled id's logprob, so only 0 is served."""
    if value is not None and value != 0:
        raise bad_request(
            f"top_logprobs={value!r} is not supported: the engine returns only each sampled token's "
            "logprob (send 0 or omit it)",
            code="unsupported_parameter",
        )


def parse_request(
    body: Any, tokenizer: Tokenizer, memo: WireMemo | None = None
) -> tuple[ChatRequest, bool, bool]:
    """(request, stream, include_usage) from a Chat Completions body; GatewayError when it is malformed.

    ``memo`` (the session's last request, :attr:`ChatRequest.memo`) spares re-translating its messages.
    ``request.logprobs`` says whether the answer carries the sampled ids' logprobs.
    """
    body = check_body(body, _REFUSED)
    text_format_field(body.get("response_format"), "response_format")
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
    stop_token_ids, stop_strings = stop_ids(body.get("stop"), tokenizer, "stop")
    request = ChatRequest(
        messages=messages,
        keys=keys,
        memo=parsed,
        system=system,
        tools=tools,
        max_tokens=positive_int_field(max_tokens, "max_tokens"),
        temperature=number_field(body.get("temperature"), "temperature"),
        top_p=number_field(body.get("top_p"), "top_p"),
        stop_token_ids=stop_token_ids,
        stop_strings=stop_strings,
        seed=seed_field(body.get("seed")),
        logprobs=body.get("logprobs") is True,
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
        arguments = call_arguments(function.get("arguments", "{}"))
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


def token_logprobs(served: ServedTurn, tokenizer: Tokenizer) -> list[dict[str, Any]]:
    """Every id the turn generated (reasoning and tool-call markup included) with its logprob."""
    entries = []
    for token_id, logprob in zip(served.turn.token_ids, served.turn.logprobs, strict=True):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        entries.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
    return entries


def _logprobs(served: ServedTurn, tokenizer: Tokenizer | None) -> dict[str, Any] | None:
    if tokenizer is None:
        return None
    return {"content": token_logprobs(served, tokenizer), "refusal": None}


def response(served: ServedTurn, model: str, tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """A ``chat.completion`` object (with the turn's logprobs when a ``tokenizer`` is given)."""
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
            {
                "index": 0,
                "message": message,
                "finish_reason": _finish_reason(served),
                "logprobs": _logprobs(served, tokenizer),
            }
        ],
        "usage": _usage(served),
    }


def stream_chunks(
    served: ServedTurn, model: str, include_usage: bool, tokenizer: Tokenizer | None = None
) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` objects in OpenAI's order: role, reasoning, content, calls, finish, usage
    (the turn's logprobs ride on the finish chunk when a ``tokenizer`` is given)."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
    }
    base["model"] = model

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return {**base, "choices": [choice]}

    yield chunk({"role": "assistant", "content": ""})
    if served.turn.reasoning is not None:
        yield chunk({"reasoning_content": served.turn.reasoning})
    if served.turn.content:
        yield chunk({"content": served.turn.content})
    for index, call in enumerate(_wire_calls(served)):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield chunk({}, _finish_reason(served), _logprobs(served, tokenizer))
    if include_usage:
        yield {**base, "choices": [], "usage": _usage(served)}
