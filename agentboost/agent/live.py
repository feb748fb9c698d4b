"""What the rollouts in flight are doing right now: turns and tokens finished, turns awaiting the engine.

The runner puts one :class:`LiveCounts` in the context its rollouts run in (:func:`counting`); every
model turn reports to it (:func:`current` in :func:`~agentboost.agent.turn.generate_turn`), so a long
multi-turn rollout shows progress before it ends, and a run that stalls can say what it waits for.
Rollouts run without it (worker processes, a bare ``run_episode``) report nothing and cost nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class LiveCounts:
    """Counts over every rollout run in this context, retried attempts included."""

    turns: int = 0
    """Model turns that came back from the engine."""
    tokens: int = 0
    """Tokens those turns generated."""
    generating: int = 0
    """Turns sent to the engine and not answered yet."""
    last_turn_at: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when the last turn came back (or when counting began)."""
    on_turn: Callable[[], None] | None = None
    """Called after each turn that came back (the runner refreshes its progress bar)."""

    def turn_started(self) -> None:
        self.generating += 1

    def turn_ended(self, tokens: int | None) -> None:
        """A turn came back with ``tokens`` new tokens, or failed (None)."""
        self.generating -= 1
        if tokens is None:
            return
        self.turns += 1
        self.tokens += tokens
        self.last_turn_at = time.monotonic()
        if self.on_turn is not None:
            self.on_turn()


_CURRENT: ContextVar[LiveCounts | None] = ContextVar("agentboost_live_counts", default=None)


def current() -> LiveCounts | None:
    """The counts the running rollout reports to, if its runner keeps any."""
    return _CURRENT.get()


@contextmanager
def counting(counts: LiveCounts) -> Iterator[LiveCounts]:
    """Rollouts started (asyncio tasks created) inside this block report to ``counts``."""
    token = _CURRENT.set(counts)
    try:
        yield counts
    finally:
        _CURRENT.reset(token)
