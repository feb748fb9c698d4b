"""Message text is encoded as text: only a chat template's markup makes control tokens.

A tokenizer turns the strings of its added tokens (``<|im_start|>``, ``<|im_end|>``, ``<tool_call>``,
``<think>``...) into their ids wherever they appear. Tool results, user turns, simulated customers
and gateway clients are untrusted text: a tool result holding ``<|im_end|>\\n<|im_start|>assistant\\n``
would otherwise plant a fake assistant turn in what the policy sees. So the text of every message
(``content`` and ``reasoning_content``) is encoded with those strings split into ordinary tokens,
and only the markup the template writes around it gets the control ids.

How: the messages are rendered once with a placeholder in place of each text, which tells where
every text lands in the real rendering (the two must agree, else the template changed the text and
the request is refused with :class:`~agentboost.errors.TemplateError`). The markup is cut at its
control strings; the pieces between are encoded by a copy of the tokenizer without added tokens.
Text that holds no control string (nearly all of it) skips all this and is encoded exactly as
before, so the ids of ordinary conversations do not change.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentboost.errors import TemplateError
from agentboost.tokens.messages import ChatMessage

Span = tuple[int, int]
"""Where one message's text lies in a rendering: ``text[start:end]``."""

TEXT_FIELDS = ("content", "reasoning_content")
"""The message fields whose text is untrusted (never becomes control tokens); so are the string
values of an assistant message's tool-call arguments (a client may have written them)."""

_SLOT = re.compile("\ue000AGENTBOOST-TEXT-(\\d+)\ue001")
_LOCK = threading.Lock()
_CACHE: weakref.WeakKeyDictionary[Any, ControlTokens] = weakref.WeakKeyDictionary()


class ControlTokens:
    """A tokenizer's added tokens, and how to encode text that must keep them as plain text."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self.ids: dict[str, int] = {
            str(getattr(token, "content", token)): int(token_id) for token_id, token in added.items()
        }
        strings = sorted(self.ids, key=len, reverse=True)  # longest first: leftmost-longest, as tokenizers
        self.pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
        self._plain: Any = None

    def found_in(self, text: Any) -> bool:
        """Whether ``text`` holds a control string."""
        return self.pattern is not None and isinstance(text, str) and self.pattern.search(text) is not None

    def in_messages(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the text of any message (its tool-call arguments included) holds a control string."""
        if self.pattern is None:
            return False
        for message in messages:
            if any(self.found_in(message.get(field)) for field in TEXT_FIELDS):
                return True
            for call in message.get("tool_calls") or ():
                arguments = call.get("function", {}).get("arguments")
                text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
                if self.found_in(text):
                    return True
        return False

    def encode(self, text: str, spans: Sequence[Span], encode: Callable[[str], list[int]]) -> list[int]:
        """``text``'s ids where the control strings inside ``spans`` (message text) stay text.

        ``encode`` is the ordinary encoding; it is used as is when no span holds a control string.
        """
        if self.pattern is None or not spans:
            return encode(text)
        matches = list(self.pattern.finditer(text))
        markup = [match for match in matches if not _overlaps(match.start(), match.end(), spans)]
        if len(markup) == len(matches):
            return encode(text)
        ids: list[int] = []
        start = 0
        for match in markup:
            ids += self.encode_plain(text[start : match.start()])
            ids.append(self.ids[match.group()])
            start = match.end()
        ids += self.encode_plain(text[start:])
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """``text``'s ids with no added token recognised (the strings are split like any text)."""
        if not text:
            return []
        plain = self._plain_backend()
        if plain is not None:
            return list(plain.encode(text, add_special_tokens=False).ids)
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        except TypeError as error:
            raise TemplateError(
                "tokenizer",
                text[:40],
                "this tokenizer cannot encode control-token strings as text (no fast backend and no "
                "split_special_tokens); remove them from the message",
            ) from error

    def _plain_backend(self) -> Any:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        with _LOCK:
            if self._plain is None:
                from tokenizers import Tokenizer as RustTokenizer

                data = json.loads(backend.to_str())
                data["added_tokens"] = []
                self._plain = RustTokenizer.from_str(json.dumps(data))
        return self._plain


def control_tokens(tokenizer: Any) -> ControlTokens:
    """The (cached) :class:`ControlTokens` of ``tokenizer``."""
    with _LOCK:
        try:
            found = _CACHE.get(tokenizer)
        except TypeError:  # not weak-referenceable: build one each time
            return ControlTokens(tokenizer)
        if found is None:
            found = _CACHE[tokenizer] = ControlTokens(tokenizer)
        return found


def render_with_spans(
    messages: Sequence[ChatMessage],
    render: Callable[[list[ChatMessage]], str],
    expected: str,
    template_name: str,
) -> tuple[str, list[Span]]:
    """Where each message's text lands in ``expected`` (= ``render(messages)``).

    Renders the messages once more with a placeholder for each text and fills the texts back in;
    when that is not ``expected`` the template rewrites message text, and where a text lies cannot be
    told: TemplateError (only asked for messages that hold control strings).
    """
    texts: list[str] = []

    def slot(text: str) -> str:
        texts.append(text)
        return f"\ue000AGENTBOOST-TEXT-{len(texts) - 1}\ue001"

    def slot_values(value: Any) -> Any:
        """Argument values as slots; a slot lands in the template's JSON as the value's JSON text."""
        if isinstance(value, str) and value:
            return slot(json.dumps(value, ensure_ascii=False)[1:-1])
        if isinstance(value, list):
            return [slot_values(item) for item in value]
        if isinstance(value, dict):
            return {key: slot_values(item) for key, item in value.items()}
        return value

    slotted: list[ChatMessage] = []
    for message in messages:
        copy: dict[str, Any] = dict(message)
        for field in TEXT_FIELDS:
            value = message.get(field)
            if isinstance(value, str) and value:
                copy[field] = slot(value)
        if message.get("tool_calls"):
            calls = []
            for call in message.get("tool_calls") or ():
                function = dict(call.get("function", {}))
                arguments = function.get("arguments")
                function["arguments"] = (
                    slot(arguments) if isinstance(arguments, str) else slot_values(arguments)
                )
                calls.append({**call, "function": function})
            copy["tool_calls"] = calls
        slotted.append(copy)  # type: ignore[arg-type]
    skeleton = render(slotted)
    parts: list[str] = []
    spans: list[Span] = []
    length = start = 0
    for match in _SLOT.finditer(skeleton):
        markup = skeleton[start : match.start()]
        parts.append(markup)
        length += len(markup)
        text = texts[int(match.group(1))]
        parts.append(text)
        spans.append((length, length + len(text)))
        length += len(text)
        start = match.end()
    parts.append(skeleton[start:])
    filled = "".join(parts)
    if filled != expected:
        raise TemplateError(
            template_name,
            messages[-1] if messages else None,
            "the template rewrites message text, so text holding control-token strings (e.g. "
            "<|im_end|>) cannot be kept as plain text; use a built-in template ('qwen3', 'chatml') or "
            "remove those strings",
        )
    return filled, spans


def _overlaps(start: int, end: int, spans: Sequence[Span]) -> bool:
    return any(start < span_end and end > span_start for span_start, span_end in spans)


def encode_messages(
    tokenizer: Any,
    template: Any,
    messages: Sequence[ChatMessage],
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """A whole conversation rendered by ``template`` (a :class:`~agentboost.tokens.templates.ChatTemplate`)
    and encoded, every message's text kept as plain text. For prompts built in one piece (a simulated
    customer's); rollouts build theirs with :class:`~agentboost.tokens.builder.TokenBuffer`."""

    def render(chat: list[ChatMessage]) -> str:
        return template.render(chat, add_generation_prompt=add_generation_prompt)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    text = render(list(messages))
    control = control_tokens(tokenizer)
    if not control.in_messages(messages):
        return encode(text)
    _, spans = render_with_spans(messages, render, text, template.name)
    return control.encode(text, spans, encode)
