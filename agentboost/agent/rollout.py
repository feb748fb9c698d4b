"""Run one Strands agent on one prompt and return its :class:`~agentboost.tokens.trajectory.Trajectory`.

Safe defaults for RL: a fresh Agent per rollout, no printing, no history trimming, no hidden
retries. The SDK's event loop recurses once per model turn (it dies near 320 turns at Python's
default recursion limit), so the agent runs in chunks of ``_TURNS_PER_INVOCATION`` turns: the SDK's
own ``limits={"turns": ...}`` stops it cleanly after a turn's tools ran, and the next invocation
continues from the same history.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from strands import Agent
from strands.agent.conversation_manager import NullConversationManager

from agentboost.agent.provider import RolloutLimits, RolloutStop, TokenModel, invalid_tool_call
from agentboost.engines.base import Engine, SamplingParams
from agentboost.errors import ContextLengthError, EngineError, TemplateError
from agentboost.tokens.parsers import get_parser
from agentboost.tokens.templates import ChatTemplate, template_for
from agentboost.tokens.trajectory import TerminationReason, Trajectory

_TURNS_PER_INVOCATION = 100


class _QuietRolloutStops(logging.Filter):
    """A limit ending a rollout is not an SDK failure: keep the SDK from logging it as one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "RolloutStop" not in record.getMessage()


logging.getLogger("strands.event_loop.event_loop").addFilter(_QuietRolloutStops())


def stop_token_ids(tokenizer: Any) -> list[int]:
    """End-of-turn ids for a ChatML-style tokenizer: ``<|im_end|>`` and the EOS token."""
    ids = []
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if im_end is not None and im_end != tokenizer.unk_token_id:
        ids.append(im_end)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _classify(error: BaseException) -> tuple[TerminationReason, str] | None:
    """Find our own exception inside whatever the SDK wrapped it in."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RolloutStop):
            return current.reason, current.detail
        if isinstance(current, ContextLengthError):
            return TerminationReason.CONTEXT_FULL, str(current)
        if isinstance(current, EngineError):
            return TerminationReason.ENGINE_ERROR, f"{type(current).__name__}: {current}"
        if isinstance(current, TemplateError):
            return TerminationReason.TEMPLATE_ERROR, str(current)
        current = current.__cause__ or current.__context__
    return None


async def run_agent(
    engine: Engine,
    tokenizer: Any,
    prompt: str,
    *,
    system_prompt: str | None = None,
    tools: Sequence[Any] = (),
    template: ChatTemplate | str | None = None,
    parser: str = "hermes",
    sampling: SamplingParams | None = None,
    limits: RolloutLimits | None = None,
    task_id: str = "",
    info: dict[str, Any] | None = None,
) -> Trajectory:
    """Run a fresh Strands agent on ``prompt`` and return its trajectory. Never raises for rollout failures.

    Every way a rollout can end (a limit, a timeout, an engine or template error, a crash inside the
    agent) is recorded as the trajectory's termination reason, keeping everything generated so far.
    """
    sampling = sampling or SamplingParams()
    limits = limits or RolloutLimits()
    bind = getattr(engine, "bind", None)
    if callable(bind):  # remote engines: keep every turn of this rollout on one server (prefix cache)
        engine = bind(task_id or uuid.uuid4().hex)
    chat_template = template if isinstance(template, ChatTemplate) else template_for(tokenizer, template)
    model = TokenModel(
        engine,
        tokenizer,
        chat_template,
        get_parser(parser),
        sampling=sampling,
        limits=limits,
        stop_token_ids=stop_token_ids(tokenizer),
    )
    agent = Agent(
        model=model,
        tools=[*tools, invalid_tool_call],
        system_prompt=system_prompt,
        callback_handler=None,
        conversation_manager=NullConversationManager(),
        retry_strategy=None,
    )

    async def drive() -> None:
        next_prompt: str | None = prompt
        while True:
            remaining = limits.max_turns - model.turns
            if remaining <= 0:
                model.record_termination(TerminationReason.MAX_TURNS, f"{model.turns} turns ran (max_turns)")
                return
            turns = min(_TURNS_PER_INVOCATION, remaining)
            result = await agent.invoke_async(next_prompt, limits={"turns": turns})
            next_prompt = None
            if result.stop_reason != "limit_turns":
                return

    started = time.perf_counter()
    reason, detail = TerminationReason.COMPLETED, None
    try:
        if limits.timeout_s is None:
            await drive()
        else:
            await asyncio.wait_for(drive(), timeout=limits.timeout_s)
    except asyncio.TimeoutError:
        reason, detail = TerminationReason.TIMEOUT, f"the rollout ran past {limits.timeout_s} s"
    except Exception as error:
        reason, detail = _classify(error) or (
            TerminationReason.AGENT_ERROR,
            f"{type(error).__name__}: {error}",
        )
    finally:
        if callable(bind):
            await engine.aclose()  # a bound view only forgets its binding
    if reason in (TerminationReason.COMPLETED, TerminationReason.TIMEOUT) or model.termination is not None:
        model.finish(agent.messages)
    if model.termination is not None and reason is TerminationReason.COMPLETED:
        reason, detail = model.termination, model.termination_detail
    elapsed = time.perf_counter() - started

    buffer = model.buffer
    token_ids = buffer.token_ids if buffer else []
    loss_mask = buffer.loss_mask if buffer else []
    generated = sum(loss_mask)
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
            "tool_calls": model.tool_calls,
            "parse_errors": model.parse_errors,
            "generated_tokens": generated,
            "prompt_tokens": buffer.segments[0].end if buffer and buffer.segments else 0,
            "total_tokens": len(token_ids),
            "latency_s": elapsed,
            "engine_s": model.engine_s,
        },
        info={"template": chat_template.name, "parser": parser, **(info or {})},
    )
