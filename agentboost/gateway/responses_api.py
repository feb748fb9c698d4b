"""OpenAI Responses on the wire: requests into :class:`ChatRequest`, turns into responses and events.

Supported: ``input`` (a string, or items: messages with text parts, ``function_call``,
``function_call_output``, ``item_reference`` to an output item the session stored; ``reasoning``
items a client sends back are ignored: the session holds the reasoning tokens), ``instructions``
(the system prompt of this request; as in OpenAI's API it is not carried over from a previous
response), function ``tools``, ``tool_choice`` and ``parallel_tool_calls`` (accepted, not
enforced), ``previous_response_id`` (the session keeps each stored response's items; a chained
request is the stored conversation plus its ``input``), ``store``, ``max_output_tokens``,
``temperature``, ``top_p``, ``stream``, ``text.format`` ``text``, ``include``
``message.output_text.logprobs`` (``top_logprobs`` 0), ``metadata`` (echoed). A ``<think>``
model's reasoning comes back as a ``reasoning`` item (its text as ``reasoning_text`` content).

Items are grouped before they are translated: an assistant message, the ``function_call`` items and
``reasoning`` items that follow it are one assistant turn, exactly as the session served it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentboost.gateway.message_keys import WireMemo, parse_messages
from agentboost.gateway.openai_api import check_body, text_format_field, token_logprobs
from agentboost.gateway.session import ChatRequest, GatewayError, ServedTurn
from agentboost.gateway.wire import (
    bad_request,
    call_arguments,
    hosted_tool,
    number_field,
    positive_int_field,
    text_of_parts,
    tool_schema,
)
from agentboost.tokens.templates import Message
from agentboost.tokens.tokenizer import Tokenizer

_REFUSED = {
    "background": "background responses are not supported: the gateway answers each request in turn",
    "conversation": "conversation objects are not supported: chain requests with previous_response_id",
    "prompt": "prompt templates are not supported: send the instructions and input",
}
_ASSISTANT_SIDE = ("function_call", "reasoning")
_TEXT_PARTS = ("input_text", "output_text", "text")
LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass
class ResponsesCall:
    """What a Responses request asks beyond the chat: how to answer, and what to store."""

    stream: bool
    store: bool
    items: list[Any]
    """The whole conversation as items (the chained response's items, then this input)."""
    previous_response_id: str | None = None
    instructions: str | None = None
    tools: list[Any] = field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    metadata: Any = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None


def parse_request(
    body: Any,
    tokenizer: Tokenizer,
    memo: WireMemo | None = None,
    stored: Mapping[str, list[Any]] | None = None,
    items: Mapping[str, Any] | None = None,
) -> tuple[ChatRequest, ResponsesCall]:
    """(request, call) from a Responses body; GatewayError when it is malformed.

    ``stored``: the session's stored responses (response id -> the items of its conversation), for
    ``previous_response_id``; ``items``: their output items by id, for ``item_reference`` inputs.
    """
    body = check_body(body, _REFUSED)
    text = body.get("text")
    text_format_field(text.get("format") if isinstance(text, Mapping) else text, "text.format")
    if body.get("truncation") not in (None, "disabled"):
        raise bad_request(
            "truncation 'auto' is not supported: the gateway never drops context; send 'disabled'"
        )
    include = body.get("include") or []
    if not isinstance(include, list):
        raise bad_request("include must be a list of strings")
    previous = body.get("previous_response_id")
    conversation = list(_stored(stored or {}, previous)) if previous is not None else []
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        conversation.append({"role": "user", "content": raw_input})
    elif isinstance(raw_input, list):
        conversation.extend(_referenced(item, items or {}, index) for index, item in enumerate(raw_input))
    else:
        raise bad_request("'input' must be a string or a list of items")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("instructions must be a string")
    parsed = parse_messages("responses", _groups(conversation), _group, memo)
    messages, keys, system = parsed.messages, parsed.keys, instructions or None
    if messages and messages[0]["role"] == "system":
        if system is not None:
            raise bad_request("send the system prompt once: as 'instructions' or as the first input item")
        system, messages, keys = messages[0]["content"], messages[1:], keys[1:]
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list):
        raise bad_request("tools must be a list")
    tools = [_tool(tool, index) for index, tool in enumerate(raw_tools)]
    max_tokens = positive_int_field(body.get("max_output_tokens"), "max_output_tokens")
    temperature = number_field(body.get("temperature"), "temperature")
    top_p = number_field(body.get("top_p"), "top_p")
    request = ChatRequest(
        messages=messages,
        keys=keys,
        memo=parsed,
        system=system,
        tools=tools,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        logprobs=LOGPROBS_INCLUDE in include,
    )
    call = ResponsesCall(
        stream=body.get("stream") is True,
        store=body.get("store") is not False,
        items=conversation,
        previous_response_id=previous,
        instructions=instructions,
        tools=raw_tools,
        tool_choice=body.get("tool_choice") or "auto",
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        metadata=body.get("metadata"),
        max_output_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
    )
    return request, call


def _referenced(item: Any, items: Mapping[str, Any], index: int) -> Any:
    """An ``item_reference`` input as the output item it names (one this session stored)."""
    if not isinstance(item, Mapping) or item.get("type") != "item_reference":
        return item
    found = items.get(item.get("id"))  # type: ignore[arg-type]
    if found is None:
        raise GatewayError(
            400,
            "invalid_request",
            f"input[{index}]: item_reference {str(item.get('id'))[:80]!r} names no output item this "
            "session stored (store=false keeps none); send the item itself",
            code="item_not_found",
        )
    return found


def _stored(stored: Mapping[str, list[Any]], previous: Any) -> list[Any]:
    if not isinstance(previous, str) or previous not in stored:
        raise GatewayError(
            400,
            "invalid_request",
            f"previous response {str(previous)[:80]!r} is not stored in this session (a response made "
            "with store=false, or by another session, cannot be chained); send the whole input instead",
            code="previous_response_not_found",
        )
    return stored[previous]


def _tool(tool: Any, index: int) -> dict[str, Any]:
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
        raise hosted_tool(index, kind, "{'type': 'function', 'name', 'parameters'}")
    return tool_schema(tool.get("name"), tool.get("description"), tool.get("parameters"), index)


def _kind(item: Any) -> str:
    """An item's kind: its ``type``, or ``message`` for a bare ``{"role", "content"}``."""
    if not isinstance(item, Mapping):
        return ""
    kind = item.get("type")
    return "message" if kind is None and "role" in item else str(kind)


def _groups(items: list[Any]) -> list[Any]:
    """Items as wire messages: an assistant message with the calls and reasoning around it is one
    list (one assistant turn); every other item stands alone."""
    groups: list[Any] = []
    turn: list[Any] | None = None
    for item in items:
        kind = _kind(item)
        assistant = kind in _ASSISTANT_SIDE or (kind == "message" and item.get("role") == "assistant")
        if not assistant:
            turn = None
            groups.append(item)
            continue
        if turn is None or (kind == "message" and any(_kind(seen) != "reasoning" for seen in turn)):
            turn = []  # a second assistant message after text or calls starts a new turn
            groups.append(turn)
        turn.append(item)
    return groups


def _group(group: Any, index: int) -> list[Message]:
    """One wire message (an item, or a list of assistant-side items) as chat messages."""
    if isinstance(group, list):
        return _assistant(group, index)
    kind = _kind(group)
    if kind == "message":
        role = group.get("role")
        content = _text(group.get("content"), f"input[{index}]")
        if role in ("system", "developer"):
            if index:
                raise bad_request(f"input[{index}]: a system or developer message is only allowed first")
            return [{"role": "system", "content": content}]
        if role == "user":
            return [{"role": "user", "content": content}]
        raise bad_request(f"input[{index}]: unknown role {role!r}; use system, developer, user or assistant")
    if kind == "function_call_output":
        call_id = group.get("call_id")
        if not isinstance(call_id, str):
            raise bad_request(f"input[{index}]: a function_call_output needs a 'call_id' string")
        return [
            {
                "role": "tool",
                "tool_call_id": call_id,
                "content": _text(group.get("output"), f"input[{index}]"),
            }
        ]
    raise bad_request(
        f"input[{index}]: items of type {kind!r} are not supported; send messages, function_call and "
        "function_call_output items",
        code="unsupported_item",
    )


def _assistant(group: list[Any], index: int) -> list[Message]:
    texts, calls = [], []
    for item in group:
        kind = _kind(item)
        if kind == "message":
            texts.append(_text(item.get("content"), f"input[{index}]"))
        elif kind == "function_call":
            name, arguments = item.get("name"), call_arguments(item.get("arguments", "{}"))
            if not isinstance(name, str) or not isinstance(item.get("call_id"), str):
                raise bad_request(f"input[{index}]: a function_call needs 'name' and 'call_id' strings")
            calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
    if not texts and not calls:
        return []  # reasoning only: the session holds its tokens
    message: Message = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _text(content: Any, where: str) -> str:
    """Text content: a string, or ``input_text`` / ``output_text`` parts."""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS:
                parts.append({"type": "text", "text": part.get("text")})
            else:
                parts.append(part)
        content = parts
    return text_of_parts(content, where)


# --- answers ------------------------------------------------------------------------------------


def _usage(served: ServedTurn, tokenizer: Tokenizer) -> dict[str, Any]:
    reasoning = served.turn.reasoning
    reasoning_tokens = len(tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
    return {
        "input_tokens": served.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": served.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": served.prompt_tokens + served.completion_tokens,
    }


def output_items(served: ServedTurn, logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The turn as output items: reasoning (if any), the message (text, or none beside calls), calls."""
    turn, items = served.turn, []
    if turn.reasoning is not None:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{uuid.uuid4().hex}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": turn.reasoning}],
                "status": "completed",
            }
        )
    if turn.content or not turn.tool_calls:
        text: dict[str, Any] = {"type": "output_text", "text": turn.content, "annotations": []}
        text["logprobs"] = logprobs or []
        status = "incomplete" if turn.finish_reason == "length" else "completed"
        items.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": status,
                "role": "assistant",
                "content": [text],
            }
        )
    for call in served.message.get("tool_calls") or ():
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{call['id'].removeprefix('call_')}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": json.dumps(call["function"]["arguments"], ensure_ascii=False),
                "status": "completed",
            }
        )
    return items


def response(
    served: ServedTurn, call: ResponsesCall, model: str, tokenizer: Tokenizer, *, logprobs: bool = False
) -> dict[str, Any]:
    """A ``response`` object; with ``logprobs``, its output text carries the turn's logprobs."""
    incomplete = served.turn.finish_reason == "length" and not served.turn.tool_calls
    created = time.time()
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(created),
        "completed_at": int(created),
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": call.instructions,
        "max_output_tokens": call.max_output_tokens,
        "metadata": call.metadata or {},
        "model": model,
        "output": output_items(served, token_logprobs(served, tokenizer) if logprobs else None),
        "parallel_tool_calls": call.parallel_tool_calls,
        "previous_response_id": call.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": call.store,
        "temperature": call.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": call.tool_choice,
        "tools": call.tools,
        "top_p": call.top_p,
        "truncation": "disabled",
        "usage": _usage(served, tokenizer),
    }


def stream_events(answer: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) in the Responses API's order: created, in_progress, per output item its
    added / part / delta / done events, then completed (or incomplete)."""
    sequence = iter(range(1_000_000))

    def event(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        return kind, {"type": kind, "sequence_number": next(sequence), **data}

    pending = {**answer, "status": "in_progress", "output": [], "usage": None, "completed_at": None}
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(answer["output"]):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event(
                "response.function_call_arguments.done", **at, arguments=item["arguments"], name=item["name"]
            )
        else:
            empty = {**item, "content": [], "status": "in_progress"}
            if item["type"] == "reasoning":
                empty["summary"] = []
            yield event("response.output_item.added", output_index=index, item=empty)
            for part_index, part in enumerate(item["content"]):
                where = {**at, "content_index": part_index}
                blank = {**part, "text": ""}
                if part["type"] == "output_text":
                    blank["logprobs"] = []
                yield event("response.content_part.added", **where, part=blank)
                if part["type"] == "output_text":
                    logprobs = part.get("logprobs") or []
                    yield event("response.output_text.delta", **where, delta=part["text"], logprobs=logprobs)
                    yield event("response.output_text.done", **where, text=part["text"], logprobs=logprobs)
                else:
                    yield event("response.reasoning_text.delta", **where, delta=part["text"])
                    yield event("response.reasoning_text.done", **where, text=part["text"])
                yield event("response.content_part.done", **where, part=part)
        yield event("response.output_item.done", output_index=index, item=item)
    done = "response.incomplete" if answer["status"] == "incomplete" else "response.completed"
    yield event(done, response=answer)


__all__ = ["LOGPROBS_INCLUDE", "ResponsesCall", "output_items", "parse_request", "response", "stream_events"]
