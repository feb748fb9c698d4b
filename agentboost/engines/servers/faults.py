"""Fault injection for `agentboost serve`: make generation requests fail the ways real servers do.

Tests and demos of the clients' retries use it: HTTP 500, 429 or 400, a slow answer, a dropped
connection, malformed JSON or a truncated body, by probability or by a deterministic schedule.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aiohttp import web

from agentboost.errors import ConfigError

FAULT_KINDS = ("http_500", "http_429", "http_400", "slow", "drop", "malformed", "truncated")
"""What a :class:`FaultConfig` can inject. ``slow`` delays a correct answer by ``slow_delay_s``;
``drop`` closes the connection without answering; ``malformed`` sends a complete HTTP answer whose
JSON is invalid; ``truncated`` declares the full length and sends half the body."""


@dataclass(frozen=True)
class FaultConfig:
    """Which generation requests fail, and how.

    The n-th generation request (counted across ``/generate`` and ``/v1/completions``) gets
    ``schedule[n]`` while the schedule lasts (``None`` or ``"ok"``: no fault); after it, each request
    draws a fault from ``probabilities`` (kind -> probability, summing to at most 1) with ``seed``.
    """

    schedule: Sequence[str | None] = ()
    probabilities: Mapping[str, float] = field(default_factory=dict)
    slow_delay_s: float = 5.0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", tuple(None if k in (None, "ok") else k for k in self.schedule))
        object.__setattr__(self, "probabilities", dict(self.probabilities))
        for kind in [*self.schedule, *self.probabilities]:
            if kind is not None and kind not in FAULT_KINDS:
                raise ConfigError(f"unknown fault {kind!r}; choose from {', '.join(FAULT_KINDS)} (or 'ok')")
        if any(p < 0 for p in self.probabilities.values()) or sum(self.probabilities.values()) > 1 + 1e-9:
            raise ConfigError(
                f"fault probabilities must be >= 0 and sum to at most 1, got {self.probabilities}"
            )
        if self.slow_delay_s < 0:
            raise ConfigError(f"slow_delay_s must be >= 0, got {self.slow_delay_s}")


class FaultInjector:
    """Draws the fault of each generation request from a :class:`FaultConfig` (None: no faults)."""

    def __init__(self, config: FaultConfig | None) -> None:
        self.config = config
        self._rng = random.Random(config.seed if config else 0)
        self._count = 0

    @property
    def slow_delay_s(self) -> float:
        return self.config.slow_delay_s if self.config else 0.0

    def next_fault(self) -> str | None:
        config = self.config
        if config is None:
            return None
        index = self._count
        self._count += 1
        if index < len(config.schedule):
            return config.schedule[index]
        draw = self._rng.random()
        for kind, probability in config.probabilities.items():
            if draw < probability:
                return kind
            draw -= probability
        return None


def drop(request: web.Request) -> None:
    """Close the connection without sending anything."""
    transport = request.transport
    if transport is not None:
        transport.close()


def malformed(data: bytes) -> web.Response:
    """A complete HTTP answer whose JSON body is invalid (a trailing comma)."""
    return web.Response(body=b"{" + data[1:-1] + b",}", content_type="application/json")


async def truncated(request: web.Request, data: bytes) -> web.StreamResponse:
    """Declare the full body length, send half of it, then close the connection."""
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    response.content_length = len(data)
    await response.prepare(request)
    await response.write(data[: len(data) // 2])
    drop(request)
    return response
