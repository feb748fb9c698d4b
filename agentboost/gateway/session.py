"""One gateway session: an agent's conversation, the token rows it produced, and where it drifted.

A session keeps agentboost's :class:`~agentboost.tokens.builder.TokenBuffer` (one per training row)
and the messages that row has *served*: the prompt it started from, every assistant turn exactly as
the gateway returned it, and the tool results and user turns appended since. A request whose
messages start with exactly those and add only tool results or user turns *extends* the row: only
the new messages are tokenized, the model's earlier ids stay as generated. Any other request has
*drifted*; the session's :class:`DriftPolicy` decides what happens, and the drift is recorded
(reason, message position, row, turn) in the trajectory's ``info["gateway"]["drift"]``.

Requests are plain data (:class:`ChatRequest`): the OpenAI and Anthropic front ends
(:mod:`agentboost.gateway.openai_api`, :mod:`agentboost.gateway.anthropic_api`) translate their wire
formats into it, so both APIs share one session logic.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from agentboost.agent.limits import RolloutLimits
from agentboost.agent.termination import room
from agentboost.agent.turn import GeneratedTurn, generate_turn, turn_seed
from agentboost.engines.base import Engine, RolloutKey, SamplingParams
from agentboost.errors import ConfigError, ContextLengthError, EngineError, GatewayError, TemplateError
from agentboost.gateway.message_keys import MessageKey, WireMemo, message_key
from agentboost.tokens.builder import TokenBuffer
from agentboost.tokens.parsers import ToolCallParser
from agentboost.tokens.templates import ChatTemplate, Message
from agentboost.tokens.tokenizer import Tokenizer
from agentboost.tokens.trajectory import TerminationReason, Trajectory


class DriftPolicy(str, Enum):
    """What a session does with a request that does not extend what it served."""

    FORK = "fork"
    """Keep the current row for training and start a new row from the request (several rows)."""
    RESET = "reset"
    """Drop the current row (not trained on) and start a new row from the request."""
    REFUSE = "refuse"
    """Answer the request with an error (HTTP 400, code ``history_diverged``); the row is unchanged."""


@dataclass
class ChatRequest:
    """One chat request in the gateway's own terms, whichever API it came through.

    ``messages`` are OpenAI-style chat messages without the system prompt: ``user`` and ``tool``
    messages with text ``content``; ``assistant`` messages with text ``content`` and ``tool_calls``
    whose ``function.arguments`` are parsed objects (a string when the client sent invalid JSON).
    """

    messages: list[Message]
    keys: list[MessageKey] | None = None
    """Each message's :func:`message_key` (the front ends fill it from their memo; else computed)."""
    memo: WireMemo | None = None
    """The front end's :class:`~agentboost.gateway.wire.WireMemo` of this request, kept by the session."""
    system: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    """OpenAI function schemas: ``{"type": "function", "function": {name, description, parameters}}``."""
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    """Stop strings of several tokens: the turn ends once its text holds one (see ``cut_at_stop_string``)."""
    seed: int | None = None
    """The client's seed (used as sent when the session takes the client's sampling)."""
    logprobs: bool = False
    """Whether the answer should carry the sampled ids' logprobs (the front end reads it)."""

    def __post_init__(self) -> None:
        if self.keys is None:
            self.keys = [message_key(message) for message in self.messages]


@dataclass
class ServedTurn:
    """What one request got: the turn, its assistant message (tool calls with their ids), token counts."""

    turn: GeneratedTurn
    message: Message
    prompt_tokens: int
    row: _Row | None = None
    """The row the turn was appended to (to take it back if the client never receives it)."""
    end: int = 0
    """The row's length right after the turn."""
    undelivered: bool = False
    """Set when its client went away before receiving it (:meth:`GatewaySession.withdraw`)."""

    @property
    def completion_tokens(self) -> int:
        return len(self.turn.token_ids)


@dataclass
class _Row:
    """One training row: its buffer, the chat view, and the message keys it has served."""

    buffer: TokenBuffer
    messages: list[Message]
    served: list[MessageKey]
    tool_names: dict[str, str] = field(default_factory=dict)
    """Tool-call id -> tool name, for the tool messages that answer them."""
    tool_calls: int = 0
    """Well-formed tool calls this row generated."""


def _tool_schemas(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {tool["function"]["name"]: tool["function"].get("parameters") or {} for tool in tools}


class GatewaySession:
    """The token state of one agent session. Safe against concurrent requests (they run one at a time)."""

    def __init__(
        self,
        session_id: str,
        *,
        engine: Engine,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        parser: ToolCallParser,
        stop_token_ids: Sequence[int],
        sampling: SamplingParams,
        limits: RolloutLimits,
        policy: DriftPolicy = DriftPolicy.FORK,
        client_sampling: bool = True,
        rollout: RolloutKey | None = None,
    ) -> None:
        self.id = session_id
        self.rollout = rollout or RolloutKey(session_id)
        bind = getattr(engine, "bind", None)
        self._engine_root = engine
        self.engine = bind(self.rollout) if bind is not None else engine
        self.tokenizer = tokenizer
        self.template = template
        self.parser = parser
        self.stop_token_ids = tuple(dict.fromkeys([*stop_token_ids, *sampling.stop_token_ids]))
        self.sampling = sampling
        self.limits = limits
        self.policy = DriftPolicy(policy)
        self.client_sampling = client_sampling
        """Whether a request's temperature / top_p replace the session's (off for training rollouts)."""
        self.rows: list[_Row] = []
        """Finished rows kept for training (forks), oldest first; the current row is :attr:`row`."""
        self.row: _Row | None = None
        self.system: str | None = None
        self.tools: list[dict[str, Any]] = []
        self.drift: list[dict[str, Any]] = []
        self.generated: set[MessageKey] = set()
        """The keys of every assistant message this session generated (on any row)."""
        self.dropped_rows = 0
        self.turns = 0
        self.tool_calls = 0
        self.engine_s = 0.0
        self.engine_counts: dict[str, float] = {}
        self.last_request: ChatRequest | None = None
        self.wire_memo: WireMemo | None = None
        """The last request's wire messages and their translation, reused by the next request's parse."""
        self.responses: dict[str, list[Any]] = {}
        """Responses API: each stored response's conversation as items, for ``previous_response_id``."""
        self.response_items: dict[str, Any] = {}
        """Responses API: each stored response's output items by id, for ``item_reference`` inputs."""
        self.termination: TerminationReason | None = None
        self.termination_detail: str | None = None
        self.ended = asyncio.Event()
        """Set when a limit or an error ended the session: its agent should be stopped."""
        self.started = time.perf_counter()
        self.last_active = time.monotonic()
        """When a request last arrived or was answered (idle sessions are finished by the command)."""
        self.undelivered: list[dict[str, Any]] = []
        """Turns generated for a client that went away before receiving them (see :meth:`withdraw`)."""
        self._lock = asyncio.Lock()

    # --- requests -------------------------------------------------------------------------------

    async def complete(self, request: ChatRequest) -> ServedTurn:
        """Generate the next assistant turn for ``request``. Raises :class:`GatewayError`."""
        self.last_active = time.monotonic()
        async with self._lock:
            self.wire_memo = request.memo
            if self.termination is not None:
                raise GatewayError(
                    400,
                    "session_ended",
                    f"session {self.id!r} has ended ({self.termination.value}: {self.termination_detail}); "
                    "start a new session",
                    code="session_ended",
                )
            if not request.messages or request.messages[-1]["role"] == "assistant":
                raise GatewayError(
                    400,
                    "invalid_request",
                    "the last message must be a user message or tool results: the model answers next",
                )
            row = await self._row_for(request)
            self.last_request = request
            try:
                return await self._generate(row, request)
            finally:
                self.last_active = time.monotonic()

    def withdraw(self, served: ServedTurn) -> None:
        """Take back a turn whose client went away before receiving it: it is not trained on.

        The row drops the turn's ids when nothing was appended after it (the usual case: the client
        retries the same request, which then extends the row again); otherwise the turn stays and is
        marked. Either way it is listed in ``info["gateway"]["undelivered"]``.
        """
        if served.undelivered:
            return
        served.undelivered = True
        row = served.row
        withdrawn = row is not None and row is self.row and len(row.buffer.token_ids) == served.end
        self.undelivered.append({"row": len(self.rows), "turn": self.turns - 1, "withdrawn": withdrawn})
        if withdrawn and row is not None:
            row.buffer.drop_last_turn()
            row.messages.pop()
            row.served.pop()
            row.tool_calls -= len(served.turn.tool_calls)

    @property
    def busy(self) -> bool:
        """Whether a request of this session is being served."""
        return self._lock.locked()

    @property
    def served_turns(self) -> int:
        """Model turns the session's rows hold (0: every request was refused, or none was delivered)."""
        return sum(row.buffer.turn for row in [*self.rows, *([self.row] if self.row else [])])

    async def _row_for(self, request: ChatRequest) -> _Row:
        keys: list[MessageKey] = request.keys  # type: ignore[assignment]
        if self.row is None:
            inserted = _inserted(request.messages, keys, 0, set(), self.generated)
            if inserted is not None:  # nothing served yet to keep or drop: recorded, or refused
                self._record_drift(*inserted)
            return await self._start_row(request, keys)
        row = self.row
        drift = self._find_drift(row, request, keys)
        if drift is None:
            new = [self._chat_message(row, message) for message in request.messages[len(row.served) :]]
            try:
                if new:  # none when the client retries a request whose turn it never received
                    await _tokenize(row.buffer.append_messages, new)
            except TemplateError as error:
                self._end(TerminationReason.TEMPLATE_ERROR, str(error))
                raise GatewayError(400, "invalid_request", str(error), code="template_error") from error
            row.messages.extend(new)
            row.served.extend(keys[len(row.served) :])
            return row
        self._record_drift(*drift)
        if self.policy is DriftPolicy.FORK:
            self.rows.append(row)
        else:
            self.dropped_rows += 1
        return await self._start_row(request, keys)

    def _record_drift(self, reason: str, position: int) -> None:
        """Record a drift event; under ``refuse``, answer the request with ``history_diverged``."""
        self.drift.append(
            {
                "reason": reason,
                "position": position,
                "row": len(self.rows),
                "turn": self.turns,
                "policy": self.policy.value,
            }
        )
        if self.policy is DriftPolicy.REFUSE:
            raise GatewayError(
                400,
                "invalid_request",
                f"the messages do not extend what session {self.id!r} served ({reason} at message "
                f"{position}); send the history as the gateway returned it, or start a new session",
                code="history_diverged",
            )

    def _find_drift(self, row: _Row, request: ChatRequest, keys: list[MessageKey]) -> tuple[str, int] | None:
        """None when ``request`` extends ``row``; else (reason, first differing message position)."""
        if (request.system or None) != (self.system or None):
            return "system_changed", 0
        if request.tools != self.tools:
            return "tools_changed", 0
        served = row.served
        common = min(len(keys), len(served))
        if keys[:common] != served[:common]:  # one comparison in C; the usual case is equal
            return _changed_message(keys, served)
        if len(keys) == len(served) - 1:
            return "request_repeated", len(keys)  # a retry of the last request: it was answered already
        if len(keys) < len(served):
            return "turn_dropped", len(keys)
        inserted = _inserted(request.messages, keys, len(served), set(row.tool_names), set())
        if inserted is not None:
            return inserted
        if row.buffer.segments[-1].role != "assistant" and len(keys) > len(served):
            return "turn_not_generated", len(served)  # the previous request failed before its turn
        return None

    async def _start_row(self, request: ChatRequest, keys: list[MessageKey]) -> _Row:
        self.system, self.tools = request.system, list(request.tools)
        tool_names = {
            call["id"]: call["function"]["name"]
            for message in request.messages
            if message["role"] == "assistant"
            for call in message.get("tool_calls") or ()
        }
        chat: list[Message] = (
            [{"role": "system", "content": request.system, "source": "client"}] if request.system else []
        )
        row = _Row(TokenBuffer(self.tokenizer, self.template, tools=self.tools or None), chat, [], tool_names)
        chat.extend(self._chat_message(row, message) for message in request.messages)
        try:
            await _tokenize(row.buffer.start, chat)
        except TemplateError as error:
            raise GatewayError(400, "invalid_request", str(error), code="template_error") from error
        row.served = list(keys)
        self.row = row
        return row

    def _chat_message(self, row: _Row, message: Message) -> Message:
        """A client's message for the chat view, marked with its source: an assistant message is the
        policy's only when it is one the session generated; everything else the client sent is the
        client's (its tool results included: the gateway never sees the tools run)."""
        source = (
            "policy"
            if message["role"] == "assistant" and message_key(message) in self.generated
            else "client"
        )
        if message["role"] == "tool":
            return {**message, "name": row.tool_names.get(message.get("tool_call_id", "")), "source": source}
        return {**message, "source": source}

    async def _generate(self, row: _Row, request: ChatRequest) -> ServedTurn:
        left = room(self.limits, row.buffer, self.engine.context_length)
        if left < 1:
            detail = f"{len(row.buffer.token_ids)} tokens leave no room in the context"
            self._end(TerminationReason.CONTEXT_FULL, detail)
            raise GatewayError(400, "invalid_request", detail, code="context_length_exceeded")
        budget = min(self.limits.max_new_tokens, left)
        client_cap = request.max_tokens is not None and request.max_tokens < budget
        if client_cap:
            budget = request.max_tokens  # type: ignore[assignment]
        sampling = self.sampling
        seed = turn_seed(sampling.seed, self.turns)
        if self.client_sampling:
            changes = {"temperature": request.temperature, "top_p": request.top_p}
            sampling = replace(sampling, **{k: v for k, v in changes.items() if v is not None})
            seed = request.seed if request.seed is not None else seed
        prompt_tokens = len(row.buffer.token_ids)
        try:
            turn = await generate_turn(
                self.engine,
                row.buffer,
                self.parser,
                _tool_schemas(self.tools),
                sampling,
                budget=budget,
                stop_token_ids=(*self.stop_token_ids, *request.stop_token_ids),
                seed=seed,
                stop_strings=request.stop_strings,
            )
        except ContextLengthError as error:
            self._end(TerminationReason.CONTEXT_FULL, str(error))
            raise GatewayError(400, "invalid_request", str(error), code="context_length_exceeded") from error
        except EngineError as error:
            self._end(TerminationReason.ENGINE_ERROR, f"{type(error).__name__}: {error}")
            raise GatewayError(502, "engine", f"the engine failed: {error}") from error
        self.turns += 1
        self.engine_s += turn.elapsed_s
        for key, value in turn.engine_metrics.items():
            self.engine_counts[key] = self.engine_counts.get(key, 0) + value
        call_ids = [f"call_{uuid.uuid4().hex[:24]}" for _ in turn.tool_calls]
        message = turn.assistant_message(call_ids)
        row.tool_names.update(
            {call_id: call.name for call_id, call in zip(call_ids, turn.tool_calls, strict=True)}
        )
        row.messages.append(message)
        row.tool_calls += len(turn.tool_calls)
        row.served.append(message_key(message))
        self.generated.add(row.served[-1])
        self._apply_limits(turn, client_cap)
        return ServedTurn(turn, message, prompt_tokens, row, len(row.buffer.token_ids))

    def _apply_limits(self, turn: GeneratedTurn, client_cap: bool) -> None:
        """End the session when this turn reached one of the rollout's limits (as the provider path does)."""
        if turn.finish_reason == "length" and not client_cap:
            clamped = turn.budget < self.limits.max_new_tokens
            reason = TerminationReason.CONTEXT_FULL if clamped else TerminationReason.MAX_TOKENS
            self._end(reason, f"the turn reached {len(turn.token_ids)} new tokens without a stop token")
            return
        limit = self.limits.max_tool_calls
        if limit is not None and self.tool_calls + len(turn.tool_calls) > limit:
            left = limit - self.tool_calls
            detail = (
                f"the turn asked for {len(turn.tool_calls)} tool calls; {left} of max_tool_calls were left"
            )
            self._end(TerminationReason.MAX_TOOL_CALLS, detail)
            return
        self.tool_calls += len(turn.tool_calls)
        if self.turns >= self.limits.max_turns:
            self._end(TerminationReason.MAX_TURNS, f"{self.turns} turns ran (max_turns)")

    def _end(self, reason: TerminationReason, detail: str) -> None:
        if self.termination is None:
            self.termination, self.termination_detail = reason, detail
            self.ended.set()

    def close(self) -> None:
        """Forget the engine binding (the session's rows stay readable)."""
        unbind = getattr(self._engine_root, "unbind", None)
        if unbind is not None:
            unbind(self.rollout)

    # --- results --------------------------------------------------------------------------------

    @property
    def messages(self) -> list[Message]:
        """The chat view of the current row (the conversation as the agent last sent it, and the answer)."""
        return self.row.messages if self.row is not None else []

    def trajectory(
        self,
        task_id: str,
        termination: TerminationReason,
        detail: str | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> Trajectory:
        """The session as a Trajectory: the current row, with earlier forked rows in ``forked_rows``."""
        gateway_info = {
            "session": self.id,
            "policy": self.policy.value,
            "rows": len(self.rows) + (self.row is not None),
            "dropped_rows": self.dropped_rows,
            "drift": list(self.drift),
            "undelivered": list(self.undelivered),
        }
        full_info = {"template": self.template.name, **(info or {}), "gateway": gateway_info}
        rows = [*self.rows, self.row] if self.row is not None else []
        built = [self._row_trajectory(row, task_id, termination, detail, full_info) for row in rows]
        if not built:
            return Trajectory(task_id, [], [], [], [], [], termination, detail, self._metrics([]), full_info)
        main = built[-1]
        main.forked_rows = built[:-1]
        main.metrics = self._metrics(rows)
        return main

    def _row_trajectory(
        self,
        row: _Row,
        task_id: str,
        termination: TerminationReason,
        detail: str | None,
        info: Mapping[str, Any],
    ) -> Trajectory:
        buffer = row.buffer
        return Trajectory(
            task_id=task_id,
            messages=list(row.messages),
            token_ids=list(buffer.token_ids),
            loss_mask=list(buffer.loss_mask),
            logprobs=list(buffer.logprobs),
            segments=list(buffer.segments),
            termination=termination,
            termination_detail=detail,
            metrics=self._metrics([row]),
            info={**info, "tools": list(buffer.tools or ())},  # what the client declared (SFT export)
        )

    def _metrics(self, rows: Sequence[_Row]) -> dict[str, Any]:
        segments = [segment for row in rows for segment in row.buffer.segments]
        return {
            "turns": sum(row.buffer.turn for row in rows),
            "tool_calls": sum(row.tool_calls for row in rows),
            "parse_errors": sum(len(segment.parse_errors) for segment in segments),
            "generated_tokens": sum(sum(row.buffer.loss_mask) for row in rows),
            "prompt_tokens": sum(row.buffer.segments[0].end for row in rows if row.buffer.segments),
            "total_tokens": sum(len(row.buffer.token_ids) for row in rows),
            "latency_s": time.perf_counter() - self.started,
            "engine_s": self.engine_s,
            "drift_events": len(self.drift),
            **self.engine_counts,
        }


def prompt_token_count(tokenizer: Tokenizer, template: ChatTemplate, request: ChatRequest) -> int:
    """How many tokens ``request`` renders to as a first prompt, generation prompt included
    (what Anthropic's ``count_tokens`` answers; a session's held reasoning tokens are not counted)."""
    names = {
        call["id"]: call["function"]["name"]
        for message in request.messages
        if message["role"] == "assistant"
        for call in message.get("tool_calls") or ()
    }
    chat: list[Message] = [{"role": "system", "content": request.system}] if request.system else []
    for message in request.messages:
        if message["role"] == "tool":
            message = {**message, "name": names.get(message.get("tool_call_id", ""))}
        chat.append(message)
    buffer = TokenBuffer(tokenizer, template, tools=request.tools or None)
    try:
        return len(buffer.start(chat))
    except TemplateError as error:
        raise GatewayError(400, "invalid_request", str(error), code="template_error") from error


def _changed_message(keys: Sequence[MessageKey], served: Sequence[MessageKey]) -> tuple[str, int]:
    """Why the sent ``keys`` differ from the ``served`` ones, and the first position where they do."""
    for position, (sent, kept) in enumerate(zip(keys, served, strict=False)):
        if sent == kept:
            continue
        for skipped in range(1, len(served) - position):  # messages left out, the rest kept
            if keys[position : len(served) - skipped] == served[position + skipped :]:
                return "turn_dropped", position
        if sent[0] == kept[0] == "assistant":
            return "assistant_edited", position
        if sent[0] == kept[0] == "tool":
            sent_block = _tool_block(keys, position)
            kept_block = _tool_block(served, position)
            if sorted(sent_block, key=repr) == sorted(kept_block, key=repr):
                return "tool_results_reordered", position
        return "message_changed", position
    raise AssertionError("_changed_message needs keys that differ from served within their common length")


OFF_LOOP_CHARS = 32_768
"""Messages with more text than this are tokenized in a worker thread, so a big prompt does not hold
up the other sessions (smaller ones take well under a millisecond: a thread hop would cost more)."""


async def _tokenize(append: Any, messages: list[Message]) -> Any:
    """``append(messages)`` (a buffer's ``start`` or ``append_messages``), off the event loop when big."""
    size = sum(len(message.get("content") or "") for message in messages)
    if size > OFF_LOOP_CHARS:
        return await asyncio.to_thread(append, messages)
    return append(messages)


def _inserted(
    messages: Sequence[Message],
    keys: Sequence[MessageKey],
    start: int,
    calls: set[str],
    generated: set[MessageKey],
) -> tuple[str, int] | None:
    """The first message from ``start`` on that the client inserted, as (reason, position): an
    assistant message the session never generated, or a tool result for a call no earlier assistant
    message made (``calls``: the call ids already made)."""
    for position in range(start, len(keys)):
        message = messages[position]
        if message["role"] == "assistant":
            if keys[position] not in generated:
                return "assistant_not_served", position
            calls.update(call.get("id") or "" for call in message.get("tool_calls") or ())
        elif message["role"] == "tool" and message.get("tool_call_id") not in calls:
            return "tool_result_not_requested", position
    return None


def _tool_block(keys: Sequence[MessageKey], position: int) -> list[MessageKey]:
    """The run of tool messages around ``position`` (the results of one assistant turn)."""
    start = position
    while start > 0 and keys[start - 1][0] == "tool":
        start -= 1
    end = position
    while end < len(keys) and keys[end][0] == "tool":
        end += 1
    return list(keys[start:end])


def check_policy(value: str) -> DriftPolicy:
    try:
        return DriftPolicy(value)
    except ValueError:
        raise ConfigError(f"unknown drift policy {value!r}; use fork, reset or refuse") from None
