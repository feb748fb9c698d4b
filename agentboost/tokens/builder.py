"""Incremental token building: the prompt once, generated ids verbatim, then only the new messages.

Why not re-render the whole conversation each turn? A re-rendering is not what the model produced:
the SDK normalises messages, JSON gets re-serialised, and some templates drop earlier reasoning. So
:class:`TokenBuffer` keeps the ids the engine returned and appends each new message (tool results,
user turns) by rendering only the *delta*, checked on every append:

1. The delta is rendered after an *anchor*: a user message and an assistant turn holding a marker.
   Its text is whatever the template writes after the marker: the end of the assistant turn, the
   new messages and the next generation prompt. The first time a rollout appends messages of a
   given shape (e.g. two tool results), the delta is also rendered after the rollout's real system
   prompt, tools and first user message; if the two differ, that rollout uses the real one from
   then on, so a template whose deltas depend on them is still rendered exactly.
2. Prefix-preservation: appending the new messages must not change how the anchor itself renders
   (templates that drop earlier ``<think>`` content fail here). Otherwise: TemplateError.
3. The end-of-turn text the model already generated (its stop token) is not appended twice.
4. Token boundary: the delta's tokens must be what tokenizing the whole text would give, i.e. no
   token straddles the boundary between the model's last token and the delta. Otherwise:
   TemplateError.

Cost per append is a render of a short anchor plus the new messages and a tokenization of the
delta: independent of how long the rollout already is. Templates that copy message content
verbatim (agentboost's built-ins) skip even the render: each message shape (e.g. two tool results)
is rendered once per process with placeholder contents, checked against a real render, and then
filled in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from agentboost.errors import InvalidGenerationError, TemplateError, TokenBufferError
from agentboost.tokens.messages import Role
from agentboost.tokens.parsers import THINK_CLOSE, THINK_OPEN
from agentboost.tokens.plain_text import Span, control_tokens, render_with_spans
from agentboost.tokens.templates import ChatTemplate, Message
from agentboost.tokens.tokenizer import Tokenizer
from agentboost.tokens.trajectory import Segment

_MARKER = "\u2063AGENTBOOST-TURN\u2063"
_BOUNDARY_WINDOW = 8
_SLOT = "\ue000AGENTBOOST-CONTENT\ue001"
_SKELETONS: dict[tuple[Any, ...], list[str] | None] = {}
"""(template source, variables, roles) -> the delta split around each message's content; None when
the template turned out not to copy content verbatim."""


class TokenBuffer:
    """The token sequence of one rollout: ids, loss mask, logprobs and segments, built turn by turn."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.tools = list(tools) if tools else None
        self.token_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float | None] = []
        self.segments: list[Segment] = []
        self.turn = 0
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._control = control_tokens(tokenizer)
        self._added_ids = set(getattr(tokenizer, "added_tokens_decoder", {}).keys())
        self._anchor: list[Message] = []
        self._anchor_prefix = ""
        self._fast_anchor: list[Message] = [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": _MARKER},
        ]
        self._fast_prefix = ""
        self._checked_shapes: set[tuple[str, ...]] = set()
        self._token_texts: dict[int, str] = {}
        self._faithful_only = False
        self.generation_prompt = ""
        self.starts_in_think = False

    # --- tokenizer access (the Rust backend directly: no Python wrapper overhead per call) -------

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_text(self, text: str, spans: list[Span]) -> list[int]:
        """``text``'s ids, the message text at ``spans`` kept as plain text (no control tokens)."""
        return self._control.encode(text, spans, self.encode) if spans else self.encode(text)

    def token_text(self, token_id: int) -> str:
        """The text of one id, cached (stop tokens are looked up every turn)."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.decode([token_id])
        return text

    def decode(self, ids: Sequence[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # --- building -----------------------------------------------------------------------------

    def start(self, messages: Sequence[Message]) -> list[int]:
        """Render the first prompt (system, tools, first user message) with the generation prompt."""
        if self.token_ids:
            raise TokenBufferError("TokenBuffer.start() was called twice; make one TokenBuffer per rollout")
        messages = list(messages)
        text = self.template.render(messages, self.tools, add_generation_prompt=True)
        without_prompt = self.template.render(messages, self.tools, add_generation_prompt=False)
        if not text.startswith(without_prompt):
            raise TemplateError(
                self.template.name, messages[-1], "the generation prompt changes the prompt before it"
            )
        self.generation_prompt = text[len(without_prompt) :]
        self.starts_in_think = self.generation_prompt.rfind(THINK_OPEN) > self.generation_prompt.rfind(
            THINK_CLOSE
        )
        self._anchor = [*messages, {"role": "assistant", "content": _MARKER}]
        self._anchor_prefix = self._prefix_through_marker(self._anchor, self.tools)
        self._fast_prefix = self._prefix_through_marker(self._fast_anchor, None)
        spans: list[Span] = []
        if self._control.in_messages(messages):
            _, spans = render_with_spans(
                messages,
                lambda slotted: self.template.render(slotted, self.tools, add_generation_prompt=True),
                text,
                self.template.name,
            )
        ids = self.encode_text(text, spans)
        self._extend(ids, None, role="prompt")
        return ids

    def append_generation(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float],
        *,
        finish_reason: str | None,
        parse_errors: Sequence[str] = (),
        weight_version: int | None = None,
    ) -> None:
        """Append the model's own ids verbatim: loss mask 1, with their logprobs (and the policy version
        that generated them, when the engine tagged it)."""
        if len(ids) != len(logprobs):
            raise InvalidGenerationError(
                f"{len(ids)} generated ids but {len(logprobs)} logprobs; the engine must return one per id"
            )
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(value) for value in logprobs)
        self.segments.append(
            Segment(
                "assistant",
                start,
                len(self.token_ids),
                self.turn,
                finish_reason,
                list(parse_errors),
                weight_version,
            )
        )
        self.turn += 1

    def drop_last_turn(self) -> None:
        """Take back the last generated turn (one its client never received): ids, mask, logprobs."""
        if not self.segments or self.segments[-1].role != "assistant":
            raise TokenBufferError("drop_last_turn() needs a generated assistant turn at the end")
        start = self.segments.pop().start
        del self.token_ids[start:], self.loss_mask[start:], self.logprobs[start:]
        self.turn -= 1

    def append_messages(self, messages: Sequence[Message]) -> list[int]:
        """Append tool results or user turns after a generated turn, with the next generation prompt."""
        if not self.segments or self.segments[-1].role != "assistant":
            raise TokenBufferError(
                "new messages can only follow a generated assistant turn: call append_generation() first"
            )
        messages = list(messages)
        delta = self._delta(messages)
        spans: list[Span] = []
        if self._control.in_messages(messages):
            _, spans = render_with_spans(messages, self._delta, delta, self.template.name)
        last = self.token_ids[-1]
        if self.segments[-1].finish_reason == "stop":
            stop_text = self.token_text(last)
            if stop_text and delta.startswith(stop_text):
                delta = delta[len(stop_text) :]
                spans = [(start - len(stop_text), end - len(stop_text)) for start, end in spans]
        ids = self.encode_text(delta, spans)
        if last not in self._added_ids:
            self._check_boundary(ids, delta, spans, messages[0])
        role = "tool" if all(message.get("role") == "tool" for message in messages) else "user"
        self._extend(ids, None, role=role)
        return ids

    def _delta(self, messages: list[Message]) -> str:
        """The text ``messages`` add after the model's turn, through its next generation prompt."""
        shape = tuple(message.get("role", "") for message in messages)
        delta = self._fill_skeleton(shape, messages) if self.template.content_verbatim else None
        if delta is not None:
            return delta
        if self._faithful_only:
            return self._render_delta(self._anchor, self._anchor_prefix, self.tools, messages)
        delta = self._render_delta(self._fast_anchor, self._fast_prefix, None, messages)
        if shape not in self._checked_shapes:
            self._checked_shapes.add(shape)
            faithful = self._render_delta(self._anchor, self._anchor_prefix, self.tools, messages)
            if faithful != delta:
                self._faithful_only, delta = True, faithful
        return delta

    def _fill_skeleton(self, shape: tuple[str, ...], messages: list[Message]) -> str | None:
        """The delta from a cached per-shape skeleton, or None when there is none for this template."""
        contents: list[str] = []
        for message in messages:
            content = message.get("content")
            if not isinstance(content, str) or _SLOT in content:
                return None
            contents.append(content)
        key = (self.template.source, tuple(sorted(self.template.defaults.items())), shape)
        if key not in _SKELETONS:
            slotted: list[Message] = [{"role": cast(Role, role), "content": _SLOT} for role in shape]
            parts = self._render_delta(self._fast_anchor, self._fast_prefix, None, slotted).split(_SLOT)
            real = self._render_delta(self._fast_anchor, self._fast_prefix, None, messages)
            filled = parts[0] + "".join(
                content + part for content, part in zip(contents, parts[1:], strict=False)
            )
            usable = len(parts) == len(contents) + 1 and filled == real
            _SKELETONS[key] = parts if usable else None
            return real
        skeleton = _SKELETONS[key]
        if skeleton is None:
            return None
        return skeleton[0] + "".join(
            content + part for content, part in zip(contents, skeleton[1:], strict=True)
        )

    def _prefix_through_marker(self, anchor: list[Message], tools: list[Any] | None) -> str:
        text = self.template.render(anchor, tools, add_generation_prompt=False)
        cut = text.find(_MARKER)
        if cut < 0 or text.find(_MARKER, cut + 1) >= 0:
            raise TemplateError(
                self.template.name, anchor[-1], "the template must render assistant content once"
            )
        return text[: cut + len(_MARKER)]

    def _render_delta(
        self, anchor: list[Message], prefix: str, tools: list[Any] | None, messages: list[Message]
    ) -> str:
        rendered = self.template.render([*anchor, *messages], tools, add_generation_prompt=True)
        if not rendered.startswith(prefix):
            raise TemplateError(
                self.template.name,
                messages[0],
                "rendering it changes how the earlier conversation renders (the template is not "
                "prefix-preserving, e.g. it drops earlier <think> content); use an extension-safe "
                "template such as agentboost's 'qwen3' or 'chatml'",
            )
        delta = rendered[len(prefix) :]
        if _MARKER in delta:
            raise TemplateError(
                self.template.name, messages[0], "the template repeats earlier content after it"
            )
        return delta

    def _check_boundary(self, delta_ids: list[int], delta: str, spans: list[Span], message: Message) -> None:
        """Raise unless tokenizing (tail of what we have + delta) splits exactly at the boundary."""
        tail = self.decode(self.token_ids[-_BOUNDARY_WINDOW:])
        shifted = [(start + len(tail), end + len(tail)) for start, end in spans]
        if self.encode_text(tail + delta, shifted) != self.encode(tail) + delta_ids:
            raise TemplateError(
                self.template.name,
                message,
                f"its first tokens would merge with the model's last tokens ({tail[-20:]!r} + "
                f"{delta[:20]!r}); end the template's assistant turn with a special token",
            )

    def _extend(self, ids: Sequence[int], logprob: float | None, *, role: str) -> None:
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([logprob] * len(ids))
        self.segments.append(Segment(role, start, len(self.token_ids), self.turn))
