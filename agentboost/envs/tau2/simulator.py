"""The simulated customer: tau2's user-simulation guidelines and a task's scenario, on an agentboost engine.

The simulator sees the conversation with the roles flipped, as tau2's own simulator does: the agent's
text messages are its "user" turns, its own earlier replies are its "assistant" turns; tool calls
and tool results are the agent's business and never shown to it. Its prompt is tau2's frame
(``tau2.user.user_simulator.SYSTEM_PROMPT``) filled with tau2's guidelines and the scenario.

Every way it can misbehave has one outcome, recorded on the reply:

========================  ==================================================================
the reply holds a marker  ``###STOP###`` / ``###TRANSFER###`` / ``###OUT-OF-SCOPE###``: the
                          conversation ends (the user's last word), ``marker`` names it
empty or blank reply      regenerated up to ``retries`` times with another seed; then
                          ``failure="empty_reply"``
the engine raises         ``failure="engine_error: ..."`` (no retry here: engines retry their
                          own transport errors)
reply cut at max tokens   kept as it is (a long-winded customer is still a customer)
========================  ==================================================================

A failed simulator ends the conversation and the rollout's reward is marked unscored, never
blamed on the agent. The cap on user turns lives in the environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentboost.agent.episode import stop_token_ids
from agentboost.engines.base import Engine, SamplingParams, check_max_new_tokens
from agentboost.envs.tau2.package import stop_markers, user_guidelines, user_system_prompt_frame
from agentboost.errors import AgentBoostError
from agentboost.tokens.messages import ChatMessage
from agentboost.tokens.parsers import split_reasoning
from agentboost.tokens.plain_text import encode_messages
from agentboost.tokens.templates import ChatTemplate, template_for
from agentboost.tokens.tokenizer import Tokenizer

AGENT_GREETING = "Hi! How can I help you today?"
"""The agent's first message in every tau2 conversation (tau2's orchestrator opens with it)."""


@dataclass
class SimulatorReply:
    """One simulator turn: its text and, for inspection only, its tokens (never trained on)."""

    text: str
    marker: str | None = None
    failure: str | None = None
    prompt_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    attempts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def simulator_prompt(scenario: str) -> str:
    """The simulator's system prompt: tau2's frame, tau2's guidelines, the task's scenario."""
    return user_system_prompt_frame().format(
        global_user_sim_guidelines=user_guidelines(), instructions=scenario
    )


def flip_roles(conversation: Sequence[Mapping[str, Any]]) -> list[ChatMessage]:
    """The agent's conversation as the simulator sees it: agent text -> user, customer text -> assistant."""
    flipped: list[ChatMessage] = []
    for message in conversation:
        content = message.get("content") or ""
        if not isinstance(content, str) or not content.strip():
            continue
        if message.get("role") == "assistant":
            flipped.append({"role": "user", "content": content})
        elif message.get("role") == "user":
            flipped.append({"role": "assistant", "content": content})
    return flipped


class UserSimulator:
    """Generates the customer's next message with any agentboost engine (shared with the agent or not)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        *,
        template: ChatTemplate | str | None = None,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        retries: int = 2,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.template = template if isinstance(template, ChatTemplate) else template_for(tokenizer, template)
        if self.template.name == "qwen3":
            self.template = self.template.with_defaults(thinking="off")
        base = sampling or SamplingParams(temperature=1.0)
        self.max_new_tokens = check_max_new_tokens(max_new_tokens)
        """The most tokens one customer reply may have."""
        self.sampling = dataclasses.replace(
            base, stop_token_ids=tuple(dict.fromkeys([*base.stop_token_ids, *stop_token_ids(tokenizer)]))
        )
        self.retries = retries

    def render(self, scenario: str, conversation: Sequence[Mapping[str, Any]]) -> list[int]:
        messages: list[ChatMessage] = [
            {"role": "system", "content": simulator_prompt(scenario)},
            *flip_roles(conversation),
        ]
        # the agent's words are the policy's: they never become the customer model's control tokens
        return encode_messages(self.tokenizer, self.template, messages)

    async def reply(
        self, scenario: str, conversation: Sequence[Mapping[str, Any]], *, seed: int | None = None
    ) -> SimulatorReply:
        """The customer's next message. Never raises: failures come back as ``reply.failure``."""
        try:
            prompt_ids = self.render(scenario, conversation)
        except AgentBoostError as error:
            return SimulatorReply("", failure=f"template_error: {error}")
        attempts = 0
        while True:
            attempts += 1
            sampling = self.sampling
            if seed is not None:
                sampling = dataclasses.replace(sampling, seed=seed + 7919 * (attempts - 1))
            elif attempts > 1 and sampling.seed is not None:
                sampling = dataclasses.replace(sampling, seed=sampling.seed + attempts)
            try:
                generation = await self.engine.generate(
                    prompt_ids, sampling, max_new_tokens=self.max_new_tokens
                )
            except Exception as error:  # the engine's own typed errors, or anything a remote server does
                return SimulatorReply(
                    "", failure=f"engine_error: {type(error).__name__}: {error}", attempts=attempts
                )
            ids = list(generation.token_ids)
            if ids and generation.finish_reason == "stop" and ids[-1] in sampling.stop_token_ids:
                ids_text = ids[:-1]
            else:
                ids_text = ids
            raw = self.tokenizer.decode(
                ids_text, skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
            _, visible, _ = split_reasoning(raw, starts_in_think=False)
            text = visible.strip()
            marker = next((m for m in stop_markers() if m in text), None)
            reply = SimulatorReply(
                text,
                marker=marker,
                prompt_tokens=len(prompt_ids),
                token_ids=list(generation.token_ids),
                finish_reason=generation.finish_reason,
                attempts=attempts,
            )
            if text:
                return reply
            if attempts > self.retries:
                reply.failure = "empty_reply"
                return reply
