"""One model turn over a token buffer: generate, split reasoning, parse tool calls, append the ids.

The Strands provider (:mod:`agentboost.agent.provider`) and the HTTP gateway (:mod:`agentboost.gateway`)
both run their turns through :func:`generate_turn`, so a turn is the same tokens, the same parse and
the same recorded errors whichever front end asked for it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from agentboost.agent.live import current as current_live
from agentboost.engines.base import Engine, FinishReason, SamplingParams
from agentboost.tokens.builder import TokenBuffer
from agentboost.tokens.parsers import ParseError, ToolCall, ToolCallParser, ToolSchemas, split_reasoning
from agentboost.tokens.templates import Message

SUMMED_ENGINE_METRICS = ("prompt_cached_tokens", "prompt_computed_tokens")
"""Engine counts a rollout adds up over its turns and reports in its trajectory metrics."""


@dataclass
class GeneratedTurn:
    """What one model turn produced; its ids are already appended to the buffer (loss mask 1)."""

    token_ids: list[int]
    finish_reason: FinishReason
    budget: int
    """The most new tokens the turn was allowed."""
    raw: str
    """The decoded turn, stop token included."""
    reasoning: str | None
    content: str
    """Visible text: the turn minus reasoning and minus valid tool calls (malformed calls stay in it)."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """The sampled ids' logprobs, one per id of ``token_ids``."""
    stop_string: str | None = None
    """The client's stop string that ended the turn (its ids are kept through the one completing it)."""
    errors: list[ParseError] = field(default_factory=list)
    """Malformed calls the model can be told about (``unclosed_think`` is recorded but not listed)."""
    elapsed_s: float = 0.0
    engine_metrics: dict[str, float] = field(default_factory=dict)

    def assistant_message(self, call_ids: Sequence[str]) -> Message:
        """The chat-view assistant message, its valid tool calls named by ``call_ids`` (in order)."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call_id, call in zip(call_ids, self.tool_calls, strict=True)
            ]
        message["raw"] = self.raw
        message["source"] = "policy"
        return message


async def generate_turn(
    engine: Engine,
    buffer: TokenBuffer,
    parser: ToolCallParser,
    tool_schemas: ToolSchemas,
    sampling: SamplingParams,
    *,
    budget: int,
    stop_token_ids: Sequence[int],
    seed: int | None,
    stop_strings: Sequence[str] = (),
) -> GeneratedTurn:
    """Generate the next assistant turn from ``buffer``'s ids and append it verbatim.

    A turn cut short by ``budget`` (finish ``length``) is not read for tool calls. With
    ``stop_strings``, the turn ends at the first id whose decoded text completes one of them: the ids
    through that one are kept (mask 1, exact), later ones dropped, and the visible text ends before
    the stop string (see :func:`cut_at_stop_string`).
    """
    request = replace(sampling, stop_token_ids=tuple(stop_token_ids), seed=seed)
    started = time.perf_counter()
    live = current_live()  # the runner's progress counts, when it keeps them
    if live is not None:
        live.turn_started()
    answered: int | None = None
    try:
        generation = await engine.generate(buffer.token_ids, request, max_new_tokens=budget)
        answered = len(generation.token_ids)
    finally:
        if live is not None:
            live.turn_ended(answered)
    elapsed = time.perf_counter() - started
    ids, logprobs, finish_reason = generation.token_ids, generation.logprobs, generation.finish_reason
    stop_string = None
    if stop_strings:
        cut = cut_at_stop_string(buffer, ids, stop_strings)
        if cut is not None:
            kept, stop_string, text = cut
            ids, logprobs, finish_reason = ids[:kept], logprobs[:kept], "stop"
    finished = (
        stop_string is None and finish_reason == "stop" and bool(ids) and ids[-1] in request.stop_token_ids
    )
    raw = buffer.decode(ids)
    if stop_string is None:
        text = raw[: len(raw) - len(buffer.token_text(ids[-1]))] if finished else raw
    reasoning, visible, unclosed = split_reasoning(text, starts_in_think=buffer.starts_in_think)
    content, calls, errors = visible, [], []
    if finish_reason != "length":
        parsed = parser.parse(visible, tool_schemas)
        content, calls, errors = parsed.content, parsed.tool_calls, parsed.errors
    recorded = [error.kind for error in errors]
    if unclosed:
        recorded.append("unclosed_think")
    version = generation.metrics.get("weight_version")
    buffer.append_generation(
        ids,
        logprobs,
        # a turn ended by a stop string has no stop token: the template closes it (mask 0)
        finish_reason="stop_string" if stop_string is not None else finish_reason,
        parse_errors=recorded,
        weight_version=None if version is None else int(version),
    )
    metrics = {key: generation.metrics[key] for key in SUMMED_ENGINE_METRICS if key in generation.metrics}
    return GeneratedTurn(
        token_ids=list(ids),
        finish_reason=finish_reason,
        budget=budget,
        raw=raw,
        reasoning=reasoning,
        content=content,
        tool_calls=calls,
        logprobs=[float(value) for value in logprobs],
        stop_string=stop_string,
        errors=errors,
        elapsed_s=elapsed,
        engine_metrics=metrics,
    )


def cut_at_stop_string(
    buffer: TokenBuffer, ids: Sequence[int], stop_strings: Sequence[str]
) -> tuple[int, str, str] | None:
    """Where the first of ``stop_strings`` completes in ``ids``' text: (ids kept, the stop string, the
    text before it), or None when none occurs.

    The kept ids run through the one whose text completes the stop string (it may carry a few
    characters past it: they stay in the row's ids, not in the text the client gets back).
    """
    text = buffer.decode(ids)
    found = [(text.find(stop), stop) for stop in stop_strings if stop in text]
    if not found:
        return None
    at, stop = min(found)
    end = at + len(stop)
    low, high = 1, len(ids)  # the shortest prefix whose text holds the stop string
    while low < high:
        middle = (low + high) // 2
        if buffer.decode(ids[:middle]).startswith(text[:end]):
            high = middle
        else:
            low = middle + 1
    return low, stop, text[:at]


def turn_seed(seed: int | None, turn: int) -> int | None:
    """Each turn of a seeded rollout gets its own seed, so turns do not repeat one another's draws."""
    return None if seed is None else seed + turn
