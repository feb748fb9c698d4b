"""Which server a remote engine's request goes to: least-loaded routing with sticky rollout bindings."""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_UNREACHABLE_COOLDOWN_S = 2.0
"""After a server refuses a connection, new work avoids it for this long (unless all are down)."""


@dataclass
class Server:
    url: str
    index: int
    in_flight: int = 0
    bound_sessions: int = 0
    unreachable_until: float = 0.0
    listening_checked: float = float("-inf")
    """When the liveness check last found the server's listener (monotonic clock)."""


@dataclass
class _Binding:
    holders: int = 0
    """Views holding this key; the binding is forgotten when the last one lets go."""
    server: Server | None = None
    """Chosen at the key's first request."""


class ServerPool:
    """Least-loaded choice among several servers, with sticky bindings for rollouts.

    Load is the number of requests in flight (ties: fewer bound rollouts, then round robin). A rollout
    key that is held (:meth:`hold`) is bound to the server chosen for its first request and stays there
    until its last holder releases it, unless that server cannot be reached, in which case it moves to
    the least-loaded reachable one. Holders are counted, so two views of one key never unbind each other.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        self.servers = [Server(url=url, index=index) for index, url in enumerate(urls)]
        self._bindings: dict[Hashable, _Binding] = {}
        self._turn = 0
        self.all_down_since: float | None = None
        """When every server became unreachable (monotonic clock); None while one answers."""

    def hold(self, key: Hashable) -> None:
        """Start (or join) the binding of ``key``; its server is chosen at its first request."""
        self._bindings.setdefault(key, _Binding()).holders += 1

    def release(self, key: Hashable) -> None:
        """One holder of ``key`` is done; the last one forgets the binding."""
        binding = self._bindings.get(key)
        if binding is None:
            return
        binding.holders -= 1
        if binding.holders <= 0:
            del self._bindings[key]
            if binding.server is not None:
                binding.server.bound_sessions -= 1

    def pick(self, key: Hashable | None = None, avoid: set[int] | frozenset[int] = frozenset()) -> Server:
        """The server for the next request of ``key`` (None or not held: unbound), skipping ``avoid``."""
        binding = self._bindings.get(key) if key is not None else None
        bound = binding.server if binding is not None else None
        if bound is not None and bound.index not in avoid:
            return bound
        now = time.monotonic()
        candidates = [s for s in self.servers if s.index not in avoid and s.unreachable_until <= now]
        if not candidates:
            candidates = [s for s in self.servers if s.index not in avoid] or self.servers
        count = len(self.servers)
        turn = self._turn
        self._turn += 1
        chosen = min(candidates, key=lambda s: (s.in_flight, s.bound_sessions, (s.index - turn) % count))
        if binding is not None and chosen is not bound:
            if bound is not None:
                bound.bound_sessions -= 1
                logger.info("rollout %s moves from %s to %s: server unreachable", key, bound.url, chosen.url)
            binding.server = chosen
            chosen.bound_sessions += 1
        return chosen

    def server_for(self, key: Hashable) -> str | None:
        """The URL ``key`` is bound to; None before its first request or once released."""
        binding = self._bindings.get(key)
        return binding.server.url if binding is not None and binding.server is not None else None

    def mark_unreachable(self, server: Server) -> None:
        now = time.monotonic()
        server.unreachable_until = now + _UNREACHABLE_COOLDOWN_S
        if self.all_down_since is None and all(s.unreachable_until > now for s in self.servers):
            self.all_down_since = now

    def mark_reachable(self, server: Server) -> None:
        """``server`` answered: the outage, if any, is over."""
        server.unreachable_until = 0.0
        self.all_down_since = None

    def down_for(self) -> float:
        """Seconds every server has been unreachable (0 while one answers)."""
        return 0.0 if self.all_down_since is None else time.monotonic() - self.all_down_since

    def down_past(self, budget_s: float) -> bool:
        """Whether every server has been unreachable for at least ``budget_s`` seconds."""
        return self.all_down_since is not None and self.down_for() >= budget_s

    def in_flight(self) -> dict[str, int]:
        return {s.url: s.in_flight for s in self.servers}
