"""What makes two chat messages the same for extension, and the per-session memo of a request's keys.

A session compares the messages a request sends with the ones it served by their *keys*
(:func:`message_key`); :class:`WireMemo` keeps the last request's wire messages, their translation
and their keys, so the next request parses only what differs or was appended. This module sits
below both the wire formats and the session: neither imports the other for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentboost.tokens.messages import ChatMessage

MessageKey = tuple[Any, ...]


def _arguments_key(arguments: Any) -> str:
    return (
        arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    )


def message_key(message: Mapping[str, Any]) -> MessageKey:
    """What makes two chat messages the same for extension: roles, texts, call ids, names, arguments.

    Reasoning is not part of it: clients drop it, and the session holds its tokens anyway.
    """
    role = message["role"]
    if role == "assistant":
        calls = tuple(
            (call.get("id"), call["function"]["name"], _arguments_key(call["function"].get("arguments")))
            for call in message.get("tool_calls") or ()
        )
        return (role, message.get("content") or "", calls)
    if role == "tool":
        return (role, message.get("tool_call_id"), message["content"])
    return (role, message["content"])


@dataclass
class WireMemo:
    """A session's last request as sent (``raw`` wire messages) and what they became.

    ``raw[i]`` translated to ``messages[ends[i - 1]:ends[i]]`` (with their extension ``keys``).
    Translation is a pure function of a message and its position, so a message equal to the one at
    the same position in the last request, with everything before it equal too, translates the same:
    the next request reuses that prefix and parses only what differs or was appended. Drift is still
    judged on the keys of every message, exactly as if all were parsed afresh.
    """

    api: str
    raw: list[Any]
    messages: list[ChatMessage]
    keys: list[MessageKey]
    ends: list[int]


def parse_messages(
    api: str,
    raw: list[Any],
    parse_one: Callable[[Any, int], list[ChatMessage]],
    memo: WireMemo | None,
) -> WireMemo:
    """Translate ``raw`` wire messages with ``parse_one(message, index)``, reusing ``memo``'s prefix."""
    reused = 0
    if memo is not None and memo.api == api:
        known = min(len(memo.raw), len(raw))
        if raw[:known] == memo.raw[:known]:  # the usual case: one comparison in C
            reused = known
        else:
            while raw[reused] == memo.raw[reused]:
                reused += 1
    kept = memo.ends[reused - 1] if memo is not None and reused else 0
    messages = memo.messages[:kept] if memo is not None else []
    keys = memo.keys[:kept] if memo is not None else []
    ends = memo.ends[:reused] if memo is not None else []
    for index in range(reused, len(raw)):
        for message in parse_one(raw[index], index):
            messages.append(message)
            keys.append(message_key(message))
        ends.append(len(messages))
    return WireMemo(api, raw, messages, keys, ends)
