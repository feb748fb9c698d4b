"""A Strands model provider that is token-in/token-out over any agentboost engine.

The SDK deep-copies and normalises the message history before every model call, so the messages
it passes cannot be re-rendered into the tokens the model produced. :class:`TokenModel` therefore
keeps its own :class:`~agentboost.tokens.builder.TokenBuffer` for the rollout: it reads from the
SDK's messages only what is new since its last turn (tool results, user turns), and hands the
engine the exact ids. One TokenModel serves one rollout.

Its one job is that translation: Strands messages in, tokens to the engine, tokens back as Strands
stream events (and a chat view of the rollout). How many tokens a turn may generate comes from
``turn_budget``; when to stop, and why, is :mod:`agentboost.agent.termination`'s (a Strands hook
provider), which reads :attr:`TokenModel.last_turn`.

Malformed tool calls are not repaired. They reach Strands as calls to an internal tool whose only
job is to fail, so the model reads an error tool result that says what was wrong and the loop
continues; the internal tool is never shown to the model.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strands import tool
from strands.models.model import Model

from agentboost.agent.limits import RolloutLimits
from agentboost.agent.turn import generate_turn, turn_seed
from agentboost.engines.base import Engine, FinishReason, SamplingParams
from agentboost.errors import ConfigError, InvalidToolCall
from agentboost.tokens.builder import TokenBuffer
from agentboost.tokens.parsers import ParseError, ToolCall, ToolCallParser
from agentboost.tokens.templates import ChatTemplate, Message, tool_specs_to_openai
from agentboost.tokens.tokenizer import Tokenizer

INVALID_CALL_TOOL = "agentboost_invalid_tool_call"


@tool(name=INVALID_CALL_TOOL)
def invalid_tool_call(error: str) -> str:
    """Internal: answers a malformed tool call with an error the model can read.

    Args:
        error: What was wrong with the call.
    """
    raise InvalidToolCall(error)


@dataclass(frozen=True)
class TurnRecord:
    """What the last model turn was, for the hooks that decide whether the rollout goes on."""

    new_tokens: int
    finish_reason: FinishReason
    budget: int
    """The most new tokens the turn was allowed (``turn_budget``)."""
    tool_calls: int
    """Well-formed tool calls the turn asked for (malformed ones are answered with an error)."""


def count_tool_calls(message: Mapping[str, Any]) -> int:
    """Well-formed tool calls in an assistant message (the internal invalid-call tool excluded)."""
    return sum(
        1
        for block in message.get("content", ())
        if "toolUse" in block and block["toolUse"].get("name") != INVALID_CALL_TOOL
    )


@dataclass
class _PendingCall:
    tool_use_id: str
    name: str
    error: str | None = None
    """Set for malformed calls: the error text the model will read."""


def _text_of(content: Sequence[Mapping[str, Any]], role: str) -> str:
    parts = []
    for block in content:
        if "text" in block:
            parts.append(block["text"])
        elif "json" in block:
            parts.append(json.dumps(block["json"], ensure_ascii=False))
        else:
            kinds = sorted(block)
            raise ConfigError(f"{role} content blocks of kind {kinds} are not supported; send text or json")
    return "\n".join(parts)


class TokenModel(Model):
    """Token-exact Strands provider for one rollout. Read :attr:`buffer`, :attr:`messages` after it ran."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        parser: ToolCallParser,
        *,
        sampling: SamplingParams,
        stop_token_ids: Sequence[int],
        turn_budget: Callable[[TokenBuffer], int] | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.template = template
        self.parser = parser
        self.sampling = sampling
        self.turn_budget = turn_budget or (lambda _buffer: RolloutLimits.max_new_tokens)
        """How many new tokens the next turn may have, given the buffer (the rollout's limits decide)."""
        self.stop_token_ids = tuple(dict.fromkeys([*stop_token_ids, *sampling.stop_token_ids]))
        self.buffer: TokenBuffer | None = None
        self.messages: list[Message] = []
        """The chat view of the rollout, for people and rewards."""
        self.last_turn: TurnRecord | None = None
        self.engine_s = 0.0
        self.engine_counts: dict[str, float] = {}
        """Sums of the engine's per-request counts (e.g. prompt_cached_tokens, prompt_computed_tokens)."""
        """Seconds spent awaiting the engine."""
        self._tool_schemas: dict[str, Any] = {}
        self._consumed = 0
        self._pending: list[_PendingCall] = []
        self._seed = sampling.seed

    @property
    def turns(self) -> int:
        """Model turns generated so far."""
        return self.buffer.turn if self.buffer is not None else 0

    # --- Strands Model interface ----------------------------------------------------------------

    def update_config(self, **model_config: Any) -> None:
        if "sampling" in model_config:
            self.sampling = model_config["sampling"]

    def get_config(self) -> dict[str, Any]:
        return {"sampling": self.sampling, "template": self.template.name}

    async def structured_output(
        self, output_model: Any, prompt: Any, system_prompt: str | None = None, **kwargs: Any
    ):
        raise NotImplementedError("TokenModel does not support structured output; use tools instead")
        yield  # pragma: no cover

    async def stream(  # type: ignore[override]
        self,
        messages: Sequence[Mapping[str, Any]],
        tool_specs: Sequence[Mapping[str, Any]] | None = None,
        system_prompt: str | None = None,
        *,
        tool_choice: Any = None,
        **kwargs: Any,
    ) -> AsyncGenerator[dict[str, Any], None]:
        self.take_new_messages(messages, tool_specs, system_prompt)
        buffer = self.buffer
        assert buffer is not None
        budget = self.turn_budget(buffer)
        turn = await generate_turn(
            self.engine,
            buffer,
            self.parser,
            self._tool_schemas,
            self.sampling,
            budget=budget,
            stop_token_ids=self.stop_token_ids,
            seed=turn_seed(self._seed, self.turns),
        )
        self.engine_s += turn.elapsed_s
        for key, value in turn.engine_metrics.items():
            self.engine_counts[key] = self.engine_counts.get(key, 0) + value
        calls = turn.tool_calls
        self._pending = [_PendingCall(f"call_{uuid.uuid4().hex[:12]}", call.name) for call in calls]
        self._pending += [
            _PendingCall(f"call_{uuid.uuid4().hex[:12]}", INVALID_CALL_TOOL, self._error_text(error))
            for error in turn.errors
        ]
        self.last_turn = TurnRecord(len(turn.token_ids), turn.finish_reason, budget, len(calls))
        assistant = turn.assistant_message([pending.tool_use_id for pending in self._pending[: len(calls)]])
        self.messages.append(assistant)

        for event in self._events(
            turn.reasoning, turn.content, calls, len(buffer.token_ids), len(turn.token_ids), turn.elapsed_s
        ):
            yield event

    # --- internals --------------------------------------------------------------------------------

    @staticmethod
    def _error_text(error: ParseError) -> str:
        return f"Error: {error.message}"

    def _start(
        self,
        messages: Sequence[Mapping[str, Any]],
        tool_specs: Sequence[Mapping[str, Any]],
        system_prompt: str | None,
    ) -> None:
        specs = [spec for spec in tool_specs if spec["name"] != INVALID_CALL_TOOL]
        tools = tool_specs_to_openai(specs)
        self._tool_schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
        chat: list[Message] = []
        if system_prompt:
            chat.append({"role": "system", "content": system_prompt, "source": "environment"})
        for message in messages:
            if message["role"] not in ("user", "assistant"):
                raise ConfigError(
                    f"a starting conversation holds user and assistant text, not {message['role']!r}"
                )
            text = _text_of(message["content"], message["role"])
            chat.append({"role": message["role"], "content": text, "source": "environment"})
        self.buffer = TokenBuffer(self.tokenizer, self.template, tools=tools)
        self.buffer.start(chat)
        self.messages = chat
        self._consumed = len(messages)

    def take_new_messages(
        self,
        messages: Sequence[Mapping[str, Any]],
        tool_specs: Sequence[Mapping[str, Any]] | None = None,
        system_prompt: str | None = None,
    ) -> None:
        """Tokenize what arrived since our last turn (the first prompt, tool results, user turns).

        Idempotent: messages already taken are skipped, so a hook may take a turn's tool results as
        soon as they exist (to check the room they leave) and the next model call finds nothing new.
        """
        if self.buffer is None:
            self._start(messages, tool_specs or (), system_prompt)
            return
        if len(messages) <= self._consumed:
            return
        new = self._collect_new(messages)
        if new:
            self.buffer.append_messages(new)
            self.messages.extend(new)

    def finish(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """At the end of a rollout: add the last turn's tool results to the chat view only.

        No model turn follows them, so they get no tokens: the sequence ends on the model's turn.
        """
        if self.buffer is not None:
            self.messages.extend(self._collect_new(messages))

    def _collect_new(self, messages: Sequence[Mapping[str, Any]]) -> list[Message]:
        """Chat messages that arrived since our last turn: tool results (in our call order), user text."""
        new: list[Message] = []
        for message in messages[self._consumed :]:
            if message["role"] == "assistant":
                continue  # our own turn: its tokens are already in the buffer, verbatim
            results = {}
            text_blocks = []
            for block in message["content"]:
                if "toolResult" in block:
                    results[block["toolResult"]["toolUseId"]] = block["toolResult"]
                else:
                    text_blocks.append(block)
            for pending in self._pending:
                if pending.tool_use_id not in results:
                    continue
                result = results.pop(pending.tool_use_id)
                failed = pending.error is not None or result.get("status") == "error"
                content = pending.error if pending.error is not None else _text_of(result["content"], "tool")
                tool_message: Message = {
                    "role": "tool",
                    "tool_call_id": pending.tool_use_id,
                    "name": None if pending.error is not None else pending.name,
                    "content": content,
                    "source": "environment",
                }
                if failed:
                    tool_message["error"] = True
                new.append(tool_message)
            if results:
                raise ConfigError(f"tool results for unknown calls {sorted(results)}")
            if text_blocks:
                new.append(
                    {"role": "user", "content": _text_of(text_blocks, "user"), "source": "environment"}
                )
        self._consumed = len(messages)
        self._pending = []
        return new

    def _events(
        self,
        reasoning: str | None,
        content: str,
        calls: Sequence[ToolCall],
        context_tokens: int,
        new_tokens: int,
        elapsed: float,
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = [{"messageStart": {"role": "assistant"}}]
        if reasoning:
            events.append({"contentBlockDelta": {"delta": {"reasoningContent": {"text": reasoning}}}})
            events.append({"contentBlockStop": {}})
        if content or not self._pending:
            events.append({"contentBlockDelta": {"delta": {"text": content}}})
            events.append({"contentBlockStop": {}})
        # valid calls first, in generation order, then one internal call per malformed call
        for index, pending in enumerate(self._pending):
            payload = calls[index].arguments if index < len(calls) else {"error": pending.error}
            events.append(
                {
                    "contentBlockStart": {
                        "start": {"toolUse": {"toolUseId": pending.tool_use_id, "name": pending.name}}
                    }
                }
            )
            events.append(
                {
                    "contentBlockDelta": {
                        "delta": {"toolUse": {"input": json.dumps(payload, ensure_ascii=False)}}
                    }
                }
            )
            events.append({"contentBlockStop": {}})
        events.append({"messageStop": {"stopReason": "tool_use" if self._pending else "end_turn"}})
        events.append(
            {
                "metadata": {
                    "usage": {
                        "inputTokens": context_tokens - new_tokens,
                        "outputTokens": new_tokens,
                        "totalTokens": context_tokens,
                    },
                    "metrics": {"latencyMs": int(elapsed * 1000)},
                }
            }
        )
        return events
