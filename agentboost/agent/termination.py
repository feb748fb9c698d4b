"""Why a rollout ends, decided in one place: limits enforced through Strands hooks, errors classified.

:class:`RolloutGuard` is a Strands hook provider. It watches the agent's turns and stops the agent
cleanly with ``agent.cancel(after_current_tools=True)`` when a limit is reached: the current turn's
tools still run (or, past ``max_tool_calls``, are answered with an error instead of running), then the
SDK returns without another model call and without appending any text the model did not generate. The
token buffer stays the provider's; the guard only reads it.

=====================  ===================================================================
Termination            Decided
=====================  ===================================================================
``max_turns``          after a turn with tool calls, when ``max_turns`` turns have run
``max_tool_calls``     before a turn's tools run, when they would exceed ``max_tool_calls``
``context_full``       after a turn's tool results were appended, when no token fits; or a
                       turn cut short by the context (its budget was below ``max_new_tokens``)
``max_tokens``         a turn reached ``max_new_tokens`` without a stop token
``env_stopped`` ...    after a turn's tools ran, when the environment asked (:class:`StopSignal`)
errors                 :func:`classify_error` (engine, context, template, environment errors)
=====================  ===================================================================

What each reason means downstream (failed? retryable? trainable?) is the table in
:class:`~agentboost.tokens.trajectory.TerminationReason`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from strands.hooks import AfterModelCallEvent, AfterToolsEvent, BeforeToolsEvent, HookRegistry

from agentboost.agent.limits import RolloutLimits
from agentboost.agent.provider import TokenModel, count_tool_calls
from agentboost.errors import ContextLengthError, EngineError, EnvironmentStepError, TemplateError
from agentboost.tokens.trajectory import TerminationReason

if TYPE_CHECKING:
    from agentboost.tokens.builder import TokenBuffer


class StopSignal:
    """Lets an environment end a rollout at the next message boundary (after the current turn's tools)."""

    def __init__(self) -> None:
        self.reason: TerminationReason | None = None
        self.detail: str | None = None

    def set(self, reason: TerminationReason, detail: str) -> None:
        """Ask the rollout to end with ``reason``; the first request wins."""
        if self.reason is None:
            self.reason, self.detail = reason, detail

    @property
    def is_set(self) -> bool:
        return self.reason is not None


def room(limits: RolloutLimits, buffer: TokenBuffer, context_length: int | None) -> int:
    """Tokens the sequence may still grow by: the tightest of the context budgets, less what it holds."""
    bounds = [value for value in (limits.max_total_tokens, context_length) if value]
    if limits.max_response_tokens is not None and buffer.segments:
        bounds.append(buffer.segments[0].end + limits.max_response_tokens)
    return (min(bounds) if bounds else 1 << 62) - len(buffer.token_ids)


def classify_error(error: BaseException) -> tuple[TerminationReason, str] | None:
    """The termination an exception stands for, looking inside whatever the SDK wrapped it in."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ContextLengthError):
            return TerminationReason.CONTEXT_FULL, str(current)
        if isinstance(current, EngineError):
            return TerminationReason.ENGINE_ERROR, f"{type(current).__name__}: {current}"
        if isinstance(current, TemplateError):
            return TerminationReason.TEMPLATE_ERROR, str(current)
        if isinstance(current, EnvironmentStepError):
            return TerminationReason.ENV_ERROR, str(current)
        current = current.__cause__ or current.__context__
    return None


class RolloutGuard:
    """Enforces one rollout's :class:`RolloutLimits` through Strands hooks and records why it ends.

    Register it on the rollout's Agent (``hooks=[guard]``); give the provider :meth:`turn_budget`. Read
    :attr:`termination` after the agent returned (None: nothing stopped it; the first reason wins).
    """

    def __init__(self, model: TokenModel, limits: RolloutLimits, stop: StopSignal | None = None) -> None:
        self.model = model
        self.limits = limits
        self.stop = stop if stop is not None else StopSignal()
        self.termination: TerminationReason | None = None
        self.termination_detail: str | None = None
        self.tool_calls = 0
        """Tool calls that ran (malformed calls answered with an error do not count)."""

    def register_hooks(self, registry: HookRegistry, **_: Any) -> None:
        registry.add_callback(AfterModelCallEvent, self._after_model_call)
        registry.add_callback(BeforeToolsEvent, self._before_tools)
        registry.add_callback(AfterToolsEvent, self._after_tools)

    def record(self, reason: TerminationReason, detail: str) -> None:
        """Remember why the rollout ends; the first reason recorded wins."""
        if self.termination is None:
            self.termination, self.termination_detail = reason, detail

    def turn_budget(self, buffer: TokenBuffer) -> int:
        """New tokens the next turn may generate; ContextLengthError when not even one fits."""
        left = room(self.limits, buffer, self.model.engine.context_length)
        if left < 1:
            raise ContextLengthError(
                f"{len(buffer.token_ids)} tokens leave no room in the context "
                f"(max_total_tokens={self.limits.max_total_tokens}, "
                f"max_response_tokens={self.limits.max_response_tokens}, "
                f"engine context {self.model.engine.context_length})"
            )
        return min(self.limits.max_new_tokens, left)

    # --- hooks ------------------------------------------------------------------------------------

    def _after_model_call(self, event: AfterModelCallEvent) -> None:
        turn = self.model.last_turn
        if event.exception is not None or event.stop_response is None or turn is None:
            return
        if turn.finish_reason == "length":  # the provider emitted no tool calls: the agent stops here
            clamped = turn.budget < self.limits.max_new_tokens
            self.record(
                TerminationReason.CONTEXT_FULL if clamped else TerminationReason.MAX_TOKENS,
                f"the turn reached {turn.new_tokens} new tokens without a stop token",
            )
        elif event.stop_response.stop_reason == "tool_use" and self.model.turns >= self.limits.max_turns:
            self.record(TerminationReason.MAX_TURNS, f"{self.model.turns} turns ran (max_turns)")
            event.agent.cancel(after_current_tools=True)

    def _before_tools(self, event: BeforeToolsEvent) -> None:
        calls = count_tool_calls(event.message)
        limit = self.limits.max_tool_calls
        if limit is not None and self.tool_calls + calls > limit:
            left = limit - self.tool_calls
            detail = f"the turn asked for {calls} tool calls; {left} of max_tool_calls were left"
            self.record(TerminationReason.MAX_TOOL_CALLS, detail)
            event.cancel = f"Not run: {detail}."
            event.agent.cancel(after_current_tools=True)
            return
        self.tool_calls += calls

    def _after_tools(self, event: AfterToolsEvent) -> None:
        if self.termination is not None:
            return  # already stopping after these tools
        if self.stop.is_set:  # the environment ended the rollout (a tool called episode.stop())
            self.record(self.stop.reason, self.stop.detail or "")  # type: ignore[arg-type]
            event.agent.cancel(after_current_tools=True)
            return
        # the next turn needs the tool results in the token buffer: append them now and check the room
        self.model.take_new_messages([*event.agent.messages, event.message])
        buffer = self.model.buffer
        if buffer is not None and room(self.limits, buffer, self.model.engine.context_length) < 1:
            self.record(
                TerminationReason.CONTEXT_FULL, f"{len(buffer.token_ids)} tokens leave no room in the context"
            )
            event.agent.cancel(after_current_tools=True)
