"""Run one Strands agent on one prompt and return its :class:`~agentboost.tokens.trajectory.Trajectory`.

Safe defaults for RL: a fresh Agent per rollout, no printing, no history trimming, no hidden
retries. The SDK's event loop recurses once per model turn (it dies near 320 turns at Python's
default recursion limit), so the agent runs in chunks of ``_TURNS_PER_INVOCATION`` turns: the SDK's
own ``limits={"turns": ...}`` stops it cleanly after a turn's tools ran, and the next invocation
continues from the same history.

Three parts meet here, each with one job: :class:`~agentboost.agent.provider.TokenModel` translates
between the token buffer and Strands events, :class:`~agentboost.agent.termination.RolloutGuard` (a
Strands hook provider) enforces the limits and records why the rollout ends, and the engine's
:meth:`~agentboost.engines.base.Engine.bind` keeps the rollout's turns on one server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strands import Agent
from strands.agent.conversation_manager import NullConversationManager
from strands.types.content import Messages

from agentboost.agent.limits import RolloutLimits
from agentboost.agent.provider import TokenModel, invalid_tool_call
from agentboost.agent.sync_tools import use_daemon_threads
from agentboost.agent.termination import RolloutGuard, StopSignal, classify_error
from agentboost.engines.base import Engine, RolloutKey, SamplingParams, bound
from agentboost.errors import ConfigError, EngineError, EnvironmentStepError
from agentboost.tokens.messages import ChatMessage
from agentboost.tokens.parsers import get_parser
from agentboost.tokens.templates import ChatTemplate, template_for
from agentboost.tokens.tokenizer import Tokenizer
from agentboost.tokens.trajectory import TerminationReason, Trajectory

_TURNS_PER_INVOCATION = 100


@dataclass(frozen=True)
class UserTurn:
    """The next user message of a multi-turn conversation (e.g. from a simulated customer)."""

    content: str
    ends_conversation: bool = False
    """The user's last word: kept in the chat view, but no model turn follows, so it gets no tokens;
    the rollout ends with ``user_ended``."""
    detail: str | None = None
    """Why the conversation ended (recorded as the termination detail), e.g. ``###STOP###``."""


NextUserMessage = Callable[[list[ChatMessage]], Awaitable[UserTurn | str | None]]


def stop_token_ids(tokenizer: Tokenizer) -> list[int]:
    """End-of-turn ids for a ChatML-style tokenizer: ``<|im_end|>`` and the EOS token."""
    ids = []
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if im_end is not None and im_end != tokenizer.unk_token_id:
        ids.append(im_end)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


async def run_agent(
    engine: Engine,
    tokenizer: Tokenizer,
    prompt: str | Sequence[Mapping[str, Any]],
    *,
    system_prompt: str | None = None,
    tools: Sequence[Any] = (),
    hooks: Sequence[Any] = (),
    template: ChatTemplate | str | None = None,
    parser: str = "hermes",
    sampling: SamplingParams | None = None,
    limits: RolloutLimits | None = None,
    task_id: str = "",
    sample: int = 0,
    info: dict[str, Any] | None = None,
    next_user_message: NextUserMessage | None = None,
    stop: StopSignal | None = None,
    tool_metadata: dict[str, dict[str, Any]] | None = None,
    strands_messages: Messages | None = None,
) -> Trajectory:
    """Run a fresh Strands agent on ``prompt`` and return its trajectory. Never raises for rollout failures.

    ``prompt`` is the user's text or a starting conversation (system / user / assistant messages
    ending with a user message; all of it prompt tokens). ``sampling`` sets temperature, top-p,
    top-k and the seed; the per-turn token budget is ``limits.max_new_tokens`` (its one owner).
    ``next_user_message`` makes the rollout multi-turn: it is awaited with the conversation so far
    each time the model ends a turn without tool calls, and returns the next user message (appended
    token-exactly with loss mask 0) or None to end. ``stop`` lets the caller end the rollout at the
    next message boundary; ``tool_metadata`` (tool-use id -> facts) is attached to the matching tool
    messages; ``strands_messages`` receives the SDK's own message list at the end.

    Every way a rollout can end (a limit, a timeout, the user or environment ending it, an engine,
    template or environment error, a crash inside the agent) is recorded as the trajectory's
    termination reason, keeping everything generated so far.
    """
    use_daemon_threads()  # a synchronous tool that hangs must not outlive the rollout's timeout
    sampling = sampling or SamplingParams()
    limits = limits or RolloutLimits()
    stop = stop or StopSignal()
    conversation = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if not conversation or conversation[-1].get("role") != "user":
        raise ConfigError("a rollout's prompt must be text or a conversation ending with a user message")
    if conversation[0].get("role") == "system":
        system_prompt = conversation.pop(0)["content"]
    history = [
        {"role": message["role"], "content": [{"text": message["content"]}]} for message in conversation[:-1]
    ]
    with bound(engine, RolloutKey(task_id, sample)) as engine:  # one server per rollout (prefix cache)
        chat_template = template if isinstance(template, ChatTemplate) else template_for(tokenizer, template)
        model = TokenModel(
            engine,
            tokenizer,
            chat_template,
            get_parser(parser),
            sampling=sampling,
            stop_token_ids=stop_token_ids(tokenizer),
        )
        guard = RolloutGuard(model, limits, stop)
        model.turn_budget = guard.turn_budget
        agent = Agent(
            model=model,
            messages=history,  # type: ignore[arg-type]  # roles: a prompt's turns are user and assistant
            tools=[*tools, invalid_tool_call],
            hooks=[guard, *hooks],
            system_prompt=system_prompt,
            callback_handler=None,
            conversation_manager=NullConversationManager(),
            retry_strategy=None,
        )

        async def drive() -> None:
            next_prompt: str | None = conversation[-1]["content"]
            while True:
                remaining = limits.max_turns - model.turns
                if remaining <= 0:
                    guard.record(TerminationReason.MAX_TURNS, f"{model.turns} turns ran (max_turns)")
                    return
                turns = min(_TURNS_PER_INVOCATION, remaining)
                result = await agent.invoke_async(next_prompt, limits={"turns": turns})
                next_prompt = None
                if result.stop_reason == "limit_turns":
                    continue
                if result.stop_reason != "end_turn" or guard.termination is not None or stop.is_set:
                    return
                if next_user_message is None:
                    return
                if limits.max_turns - model.turns <= 0:
                    guard.record(TerminationReason.MAX_TURNS, f"{model.turns} turns ran (max_turns)")
                    return
                try:
                    turn = await next_user_message(list(model.messages))
                except EngineError:
                    raise
                except Exception as error:
                    raise EnvironmentStepError(
                        f"next_user_message raised {type(error).__name__}: {error}"
                    ) from error
                if turn is None:
                    return
                if isinstance(turn, str):
                    turn = UserTurn(turn)
                if not isinstance(turn, UserTurn) or not isinstance(turn.content, str):
                    raise EnvironmentStepError(
                        f"next_user_message must return text, a UserTurn or None, got {turn!r:.200}"
                    )
                if turn.ends_conversation:
                    model.messages.append({"role": "user", "content": turn.content, "source": "environment"})
                    stop.set(TerminationReason.USER_ENDED, turn.detail or "the user ended the conversation")
                    return
                next_prompt = turn.content

        started = time.perf_counter()
        reason, detail = TerminationReason.COMPLETED, None
        try:
            if limits.timeout_s is None:
                await drive()
            else:
                await asyncio.wait_for(drive(), timeout=limits.timeout_s)
        except asyncio.TimeoutError:
            reason, detail = TerminationReason.TIMEOUT, f"the rollout ran past {limits.timeout_s} s"
            if model.turns == 0:  # not one generation came back: the engine's failure, not the policy's
                reason, detail = TerminationReason.ENGINE_TIMEOUT, engine_timeout_detail(limits.timeout_s)
        except Exception as error:
            reason, detail = classify_error(error) or (
                TerminationReason.AGENT_ERROR,
                f"{type(error).__name__}: {error}",
            )
        stopped = guard.termination is not None
        if reason in (TerminationReason.COMPLETED, TerminationReason.TIMEOUT) or stopped:
            model.finish(agent.messages)
        if guard.termination is not None and reason is TerminationReason.COMPLETED:
            reason, detail = guard.termination, guard.termination_detail
        elif stop.reason is not None and reason is TerminationReason.COMPLETED:
            reason, detail = stop.reason, stop.detail
        elapsed = time.perf_counter() - started
        if tool_metadata:
            for message in model.messages:
                if message.get("role") == "tool" and message.get("tool_call_id") in tool_metadata:
                    message["metadata"] = tool_metadata[message["tool_call_id"]]
        if strands_messages is not None:
            strands_messages.extend(agent.messages)

        buffer = model.buffer
        token_ids = buffer.token_ids if buffer else []
        loss_mask = buffer.loss_mask if buffer else []
        generated = sum(loss_mask)
        segments = buffer.segments if buffer else []
        return Trajectory(
            task_id=task_id,
            messages=model.messages,
            token_ids=token_ids,
            loss_mask=loss_mask,
            logprobs=buffer.logprobs if buffer else [],
            segments=buffer.segments if buffer else [],
            termination=reason,
            termination_detail=detail,
            metrics={
                "turns": model.turns,
                "tool_calls": guard.tool_calls,
                "parse_errors": sum(len(segment.parse_errors) for segment in segments),
                "generated_tokens": generated,
                "prompt_tokens": buffer.segments[0].end if buffer and buffer.segments else 0,
                "total_tokens": len(token_ids),
                "latency_s": elapsed,
                "engine_s": model.engine_s,
                **model.engine_counts,
            },
            info={
                "template": chat_template.name,
                "parser": parser,
                "sampling": sampling_record(sampling),
                **(info or {}),
            },
        )


def engine_timeout_detail(timeout_s: float | None) -> str:
    """Why a rollout ended ``engine_timeout``, with the fix (the gateway's rollouts say the same)."""
    return (
        f"the rollout ran past {timeout_s} s before the engine answered once (an overloaded machine or "
        "engine, or a timeout too short for it: raise --timeout or lower --concurrency)"
    )


def sampling_record(sampling: SamplingParams) -> dict[str, Any]:
    """How a rollout sampled, as its trajectory's ``info["sampling"]`` records it: temperature, top-p,
    top-k and the rollout's seed (the per-turn token budget is the limits' ``max_new_tokens``)."""
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "seed": sampling.seed,
    }
