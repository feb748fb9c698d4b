"""What both wire formats share: text content, tool schemas, numeric fields and stop strings (the
per-session memo of a request's messages is :mod:`agentboost.gateway.message_keys`)."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from typing import Any

from agentboost.gateway.session import GatewayError
from agentboost.tokens.tokenizer import Tokenizer


def bad_request(message: str, *, code: str | None = None) -> GatewayError:
    return GatewayError(400, "invalid_request", message, code=code)


def text_of_parts(content: Any, where: str) -> str:
    """Message content as text: a string, or text parts (joined with newlines, as the provider does)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise bad_request(f"{where}: content parts of type {kind!r} are not supported; send text")
        return "\n".join(texts)
    raise bad_request(f"{where} must be text or a list of text parts")


def hosted_tool(index: int, kind: Any, declare_as: str) -> GatewayError:
    """The refusal of a hosted (server) tool: the gateway runs no tools, and offering one to the
    model as an empty function would be a lie."""
    return bad_request(
        f"tools[{index}] is a hosted tool of type {kind!r}: the gateway runs no tools itself; declare "
        f"it as {declare_as} and run it in the agent",
        code="unsupported_tool",
    )


def tool_schema(name: Any, description: Any, parameters: Any, index: int) -> dict[str, Any]:
    """One tool as the template and the parsers see it (the OpenAI function schema)."""
    if not isinstance(name, str) or not name:
        raise bad_request(f"tools[{index}] needs a non-empty 'name'")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise bad_request(f"tools[{index}]: the parameters must be a JSON schema object")
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description if isinstance(description, str) else "",
            "parameters": dict(parameters)
            if parameters is not None
            else {"type": "object", "properties": {}},
        },
    }


def call_arguments(arguments: Any) -> Any:
    """A tool call's arguments as sent back: parsed when they are a JSON string. Invalid JSON is kept
    as sent: it then cannot match a call the gateway served (drift)."""
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(arguments)
    return arguments


def positive_int_field(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"{name} must be an integer >= 1, got {value!r}")
    return value


def number_field(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise bad_request(f"{name} must be a finite number >= 0, got {value!r}")
    if name == "top_p" and not 0 < value <= 1:
        raise bad_request(f"top_p must be in (0, 1], got {value!r}")
    return float(value)


MAX_STOP_STRINGS = 16
"""The most stop strings one request may send (OpenAI allows 4; smolagents sends 2)."""


def stop_ids(stop: Any, tokenizer: Tokenizer, name: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Stop strings as (single-token stop ids, stop strings of several tokens).

    A one-token string stops the engine on that id (kept as the turn's last id); a longer one ends
    the turn where its text completes (:func:`~agentboost.agent.turn.cut_at_stop_string`).
    """
    if stop is None:
        return (), ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(item, str) and item for item in stop):
        raise bad_request(f"{name} must be a string or a list of non-empty strings")
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"{name} holds {len(stop)} strings; send at most {MAX_STOP_STRINGS}")
    ids, strings = [], []
    for text in stop:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == 1:
            ids.append(int(encoded[0]))
        else:
            strings.append(text)
    return tuple(ids), tuple(strings)
