"""When a rollout stops: :class:`RolloutLimits`, and the one function that resolves them.

Limits come from three places, most specific last: agentboost's defaults, the environment's
``limits``, and the caller's overrides (CLI flags, a training config, veRL's budgets). Every entry
point resolves them with :func:`resolve_limits`, so an explicit value is never replaced by a
default, and a value left unset (``None``) never replaces one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentboost.errors import ConfigError


@dataclass(frozen=True)
class RolloutLimits:
    """When a rollout stops. Every limit ends it at a message boundary with its own termination reason."""

    max_turns: int = 32
    """Model turns (generations). The last turn's tool calls still run."""
    max_tool_calls: int | None = None
    """Tool calls executed over the rollout; a turn that would exceed it runs none of its calls."""
    max_total_tokens: int | None = None
    """Context budget: prompt + everything appended. None: the engine's context length."""
    max_response_tokens: int | None = None
    """Budget for everything after the first prompt (generated and appended tokens), e.g. veRL's
    response_length. Reaching it ends the rollout with ``context_full``."""
    max_new_tokens: int = 1024
    """Generated tokens per turn. The one owner of the per-turn budget: every model call of a rollout
    passes it (clamped to the room the context leaves) as ``Engine.generate``'s ``max_new_tokens``."""
    timeout_s: float | None = None
    """Wall-clock budget for the whole rollout."""

    def __post_init__(self) -> None:
        for name in (
            "max_turns",
            "max_tool_calls",
            "max_total_tokens",
            "max_response_tokens",
            "max_new_tokens",
        ):
            value = getattr(self, name)
            if value is None and name in ("max_turns", "max_new_tokens"):
                raise ConfigError(f"RolloutLimits.{name} cannot be None; give a positive integer")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"RolloutLimits.{name} must be an integer >= 1, got {value!r}")
        if self.timeout_s is not None and (isinstance(self.timeout_s, bool) or not self.timeout_s > 0):
            raise ConfigError(f"RolloutLimits.timeout_s must be > 0 seconds, got {self.timeout_s!r}")

    def summary(self) -> str:
        """The limits a run uses, in one line (printed at its start, so defaults are visible)."""
        parts = [f"{self.max_turns} turns", f"{self.max_new_tokens} new tokens per turn"]
        if self.max_tool_calls is not None:
            parts.append(f"{self.max_tool_calls} tool calls")
        if self.max_total_tokens is not None:
            parts.append(f"{self.max_total_tokens} tokens in all")
        parts.append(f"timeout {self.timeout_s:g} s" if self.timeout_s is not None else "no timeout")
        return ", ".join(parts)


LIMIT_FIELDS = tuple(field.name for field in dataclasses.fields(RolloutLimits))


def resolve_limits(
    environment: RolloutLimits | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    caps: Mapping[str, int | float | None] | None = None,
) -> RolloutLimits:
    """The limits a rollout runs under.

    Start from ``environment`` (the environment's own limits, or agentboost's defaults), replace each
    field whose override is not ``None`` (an explicit value always wins, zero included: zero is
    rejected by :class:`RolloutLimits`, never swapped for a default), then lower each field to its
    cap when one is given (budgets a host imposes, e.g. veRL's response length: the smaller wins).
    """
    limits = environment if environment is not None else RolloutLimits()
    changes: dict[str, Any] = {}
    for name, value in (overrides or {}).items():
        if name not in LIMIT_FIELDS:
            raise ConfigError(f"unknown rollout limit {name!r}; the limits are {', '.join(LIMIT_FIELDS)}")
        if value is not None:
            changes[name] = value
    limits = dataclasses.replace(limits, **changes) if changes else limits
    capped: dict[str, Any] = {}
    for name, cap in (caps or {}).items():
        if name not in LIMIT_FIELDS:
            raise ConfigError(f"unknown rollout limit {name!r}; the limits are {', '.join(LIMIT_FIELDS)}")
        if cap is None:
            continue
        current = getattr(limits, name)
        capped[name] = cap if current is None else min(current, cap)
    return dataclasses.replace(limits, **capped) if capped else limits
