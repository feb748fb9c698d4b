"""The Trajectory: one rollout's tokens, loss mask, log-probabilities and readable conversation.

It is the one currency between layers: rewards, export, inspection, training batches and veRL
outputs all read it; nothing downstream re-derives tokens from text.

JSON form (``format: "agentboost.trajectory"``, ``version: 1``), one object per rollout::

    task_id        str
    messages       the chat view a person reads: OpenAI-style messages (system, user, assistant with
                   content / reasoning_content / tool_calls / raw, tool with tool_call_id / name /
                   content / error / metadata (facts the tool recorded about the call))
    token_ids      every token of the final sequence, prompt included
    loss_mask      1 where the policy generated the token, else 0 (same length as token_ids)
    logprobs       the engine's log-probability where loss_mask is 1, null elsewhere
    segments       contiguous spans [start, end) of token_ids: role (prompt | assistant | tool |
                   user | template), turn index, finish_reason and parse_errors for assistant spans,
                   and weight_version (the policy version that generated the span) when the trainer
                   tagged it
    termination    {"reason": one of TerminationReason, "detail": str | null}
    metrics        turns, tool_calls, parse_errors, generated_tokens, prompt_tokens, total_tokens,
                   latency_s, engine_s
    info           template, parser, sampling (temperature, top_p, top_k, seed), environment facts
    forked_rows    only when not empty: earlier training rows of the same rollout (a gateway session
                   whose agent rewrote its history, see docs/gateway.md), each a trajectory object

The reward is not part of a trajectory: :class:`~agentboost.outcomes.RolloutResult` owns it.

Floats round-trip exactly (Python writes the shortest repr), so save -> load is lossless.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from agentboost.errors import ConfigError, TrajectoryError
from agentboost.tokens.messages import ChatMessage

TRAJECTORY_FORMAT = "agentboost.trajectory"
TRAJECTORY_VERSION = 1


class TerminationReason(str, Enum):
    """Why a rollout ended. Every rollout ends with exactly one; :data:`TERMINATIONS` says what it means."""

    COMPLETED = "completed"
    """The model answered without calling a tool (and the environment had no further user message)."""
    MAX_TURNS = "max_turns"
    """``max_turns`` model turns ran; the last turn's tools ran too."""
    MAX_TOOL_CALLS = "max_tool_calls"
    """A turn asked for more tool calls than were left; none of that turn's calls ran."""
    CONTEXT_FULL = "context_full"
    """No room was left in the context (``max_total_tokens``, the response budget or the engine's window)."""
    MAX_TOKENS = "max_tokens"
    """A turn hit ``max_new_tokens`` before a stop token; its output is kept, its calls do not run."""
    TIMEOUT = "timeout"
    """The wall-clock ``timeout_s`` ran out after the policy generated; everything completed before it
    is kept and scored."""
    ENGINE_TIMEOUT = "engine_timeout"
    """The wall-clock ``timeout_s`` ran out before the engine answered once: an overloaded engine or
    machine (or a timeout too short for it), not the policy. Not scored; resume runs it again."""
    USER_ENDED = "user_ended"
    """The environment's user (e.g. a simulated customer) said their last word and ended the conversation."""
    ENV_STOPPED = "env_stopped"
    """The environment ended the rollout after a turn's tools ran (e.g. a transfer to a human agent)."""
    ENGINE_ERROR = "engine_error"
    """The engine failed (after its own retries)."""
    TEMPLATE_ERROR = "template_error"
    """A message could not be appended without breaking token exactness."""
    AGENT_ERROR = "agent_error"
    """Anything else raised inside the agent (a bug, or a tool that crashed the loop). After a model
    turn the policy may have provoked it (tool arguments that crash a gateway agent): by default the
    failure rule then scores it with the environment's failure reward instead of masking it."""
    ENV_ERROR = "env_error"
    """The environment failed: its reset, tools, hooks, next user message or cleanup raised."""
    WORKER_CRASHED = "worker_crashed"
    """The worker process running the rollout died (e.g. killed for memory) on every attempt."""

    @property
    def failed(self) -> bool:
        """The rollout broke: no reward is computed. It is reported as a failure and masked out of
        training, unless its environment's failure rule blames the policy (an agent crash after a
        model turn), which scores it with the environment's failure reward instead."""
        return TERMINATIONS[self].failed

    @property
    def retryable(self) -> bool:
        """The runner runs it again at once: a transient engine or process failure. (Resume runs every
        failed rollout again, retryable or not.)"""
        return TERMINATIONS[self].retryable

    @property
    def truncated(self) -> bool:
        """A limit cut the rollout short: the model did not finish on its own."""
        return TERMINATIONS[self].truncated

    @property
    def trainable(self) -> bool:
        """A normal ending: its tokens, mask and logprobs are complete up to it and are trained on with
        its reward. (A failed ending is trained on only when the failure rule blames the policy.)"""
        return TERMINATIONS[self].trainable


@dataclass(frozen=True)
class Termination:
    """What a termination reason means to the runner, the trainers and reports."""

    failed: bool
    retryable: bool
    truncated: bool
    trainable: bool


TERMINATIONS: dict[TerminationReason, Termination] = {
    # reason                                  failed retryable truncated trainable
    TerminationReason.COMPLETED: Termination(False, False, False, True),
    TerminationReason.MAX_TURNS: Termination(False, False, True, True),
    TerminationReason.MAX_TOOL_CALLS: Termination(False, False, True, True),
    TerminationReason.CONTEXT_FULL: Termination(False, False, True, True),
    TerminationReason.MAX_TOKENS: Termination(False, False, True, True),
    TerminationReason.TIMEOUT: Termination(False, False, True, True),
    TerminationReason.ENGINE_TIMEOUT: Termination(True, False, False, False),
    TerminationReason.USER_ENDED: Termination(False, False, False, True),
    TerminationReason.ENV_STOPPED: Termination(False, False, False, True),
    TerminationReason.ENGINE_ERROR: Termination(True, True, False, False),
    TerminationReason.TEMPLATE_ERROR: Termination(True, False, False, False),
    TerminationReason.AGENT_ERROR: Termination(True, False, False, False),
    TerminationReason.ENV_ERROR: Termination(True, False, False, False),
    TerminationReason.WORKER_CRASHED: Termination(True, True, False, False),
}
"""The one table that says, for every termination reason, whether the rollout failed, may be retried,
was cut short by a limit, and may be trained on. Runner, trainers, the veRL loop and reports read it."""


@dataclass
class Segment:
    role: str
    start: int
    end: int
    turn: int
    finish_reason: str | None = None
    parse_errors: list[str] = field(default_factory=list)
    weight_version: int | None = None
    """An assistant segment's policy version: the trainer's update count of the weights that generated
    every one of its tokens (a generation never straddles a weight update); None when not tagged."""

    def to_dict(self) -> dict[str, Any]:
        """The segment as stored (``weight_version`` only when tagged: older files stay as they were)."""
        data = asdict(self)
        if self.weight_version is None:
            del data["weight_version"]
        return data


@dataclass
class Trajectory:
    task_id: str
    messages: list[ChatMessage]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float | None]
    segments: list[Segment]
    termination: TerminationReason
    termination_detail: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    forked_rows: list[Trajectory] = field(default_factory=list)
    """Earlier training rows of this rollout, oldest first (a gateway session that forked); each is
    trained with the rollout's reward and advantage. Empty for every other rollout."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise TrajectoryError(
                f"trajectory {self.task_id!r}: {n} token ids, {len(self.loss_mask)} mask entries and "
                f"{len(self.logprobs)} logprobs; all three must have the same length"
            )
        self.termination = TerminationReason(self.termination)

    @classmethod
    def empty(
        cls,
        task_id: str,
        termination: TerminationReason,
        detail: str | None = None,
        *,
        messages: Iterable[ChatMessage] = (),
        info: dict[str, Any] | None = None,
    ) -> Trajectory:
        """A trajectory without tokens: a rollout that never reached the engine (a failed reset, a
        crashed worker) or one scored from its messages alone (``agentboost mcp serve``)."""
        return cls(
            task_id=task_id,
            messages=list(messages),
            token_ids=[],
            loss_mask=[],
            logprobs=[],
            segments=[],
            termination=termination,
            termination_detail=detail,
            info=dict(info or {}),
        )

    @property
    def prompt_length(self) -> int:
        """Tokens before the first generated token (the initial prompt)."""
        for segment in self.segments:
            if segment.role == "assistant":
                return segment.start
        return len(self.token_ids)

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    def token_versions(self) -> list[int | None]:
        """Per token: the policy version that generated it (its assistant segment's), None for tokens
        the policy did not generate or that were not tagged."""
        versions: list[int | None] = [None] * len(self.token_ids)
        for segment in self.segments:
            if segment.role == "assistant" and segment.weight_version is not None:
                versions[segment.start : segment.end] = [segment.weight_version] * (
                    segment.end - segment.start
                )
        return versions

    @property
    def weight_versions(self) -> list[int]:
        """The distinct policy versions of the generated tokens, oldest first ([] when untagged)."""
        return sorted(
            {
                s.weight_version
                for s in self.segments
                if s.role == "assistant" and s.weight_version is not None
            }
        )

    @property
    def final_text(self) -> str:
        """The visible content of the last assistant turn the policy generated ('' if there is none).

        Assistant messages a gateway client inserted or a task prompt held (``source`` ``client`` or
        ``environment``) are not the policy's answer; a message without ``source`` (written before
        it existed) counts as the policy's."""
        for message in reversed(self.messages):
            if message.get("role") == "assistant" and message.get("source", "policy") == "policy":
                return message.get("content") or ""
        return ""

    @property
    def training_rows(self) -> list[Trajectory]:
        """The sequences a trainer trains on for this rollout: the forked rows, then this one."""
        return [*self.forked_rows, self]

    def to_dict(self) -> dict[str, Any]:
        data = {
            "format": TRAJECTORY_FORMAT,
            "version": TRAJECTORY_VERSION,
            "task_id": self.task_id,
            "termination": {"reason": self.termination.value, "detail": self.termination_detail},
            "metrics": self.metrics,
            "info": self.info,
            "messages": self.messages,
            "segments": [segment.to_dict() for segment in self.segments],
            "token_ids": self.token_ids,
            "loss_mask": self.loss_mask,
            "logprobs": self.logprobs,
        }
        if self.forked_rows:
            data["forked_rows"] = [row.to_dict() for row in self.forked_rows]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        if data.get("format") != TRAJECTORY_FORMAT:
            raise ConfigError(f"not an agentboost trajectory (format={data.get('format')!r})")
        if data.get("version") != TRAJECTORY_VERSION:
            raise ConfigError(
                f"trajectory version {data.get('version')!r} is not supported (this agentboost reads "
                f"version {TRAJECTORY_VERSION}); upgrade agentboost"
            )
        return cls(
            task_id=data["task_id"],
            messages=data["messages"],
            token_ids=data["token_ids"],
            loss_mask=data["loss_mask"],
            logprobs=data["logprobs"],
            segments=[Segment(**segment) for segment in data["segments"]],
            termination=TerminationReason(data["termination"]["reason"]),
            termination_detail=data["termination"].get("detail"),
            metrics=data.get("metrics", {}),
            info=data.get("info", {}),
            forked_rows=[cls.from_dict(row) for row in data.get("forked_rows", ())],
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=True)

    @classmethod
    def from_json(cls, text: str) -> Trajectory:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trajectory:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


def write_jsonl(
    path: str | os.PathLike[str], trajectories: Iterable[Trajectory], *, append: bool = False
) -> int:
    """Write one trajectory per line; returns how many were written."""
    count = 0
    with open(path, "a" if append else "w", encoding="utf-8") as handle:
        for trajectory in trajectories:
            handle.write(trajectory.to_json() + "\n")
            count += 1
    return count


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """Read trajectories written by :func:`write_jsonl`. A torn last line raises ConfigError naming it."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_json(line)
            except json.JSONDecodeError as error:
                raise ConfigError(f"{path}:{number} is not a complete JSON line ({error.msg})") from error
