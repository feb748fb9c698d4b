"""What one rollout actor of an environment needs from a cluster node: :class:`ActorResources`.

Read by ``--workers ray`` (:mod:`agentboost.rollout.ray_pool`), which places one actor per node that
has them; ignored when rollouts run in this process or in worker processes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentboost.errors import ConfigError


@dataclass(frozen=True)
class ActorResources:
    """Resources one rollout actor reserves on its node (an actor runs many rollouts at once).

    ``custom`` names resources a cluster declares itself (``ray start --resources '{"sandbox_slot":
    4}'``): an environment that needs a sandbox slot per actor asks for ``{"sandbox_slot": 1}``, and
    only nodes that offer one get an actor.
    """

    cpus: float = 1.0
    """CPU cores reserved per actor (Ray's ``num_cpus``)."""
    memory_gib: float | None = None
    """Memory reserved per actor, GiB (Ray's ``memory``; None: no reservation)."""
    custom: Mapping[str, float] = field(default_factory=dict)
    """Cluster-defined resources per actor, by name."""

    def __post_init__(self) -> None:
        def amount(name: str, value: Any, *, positive: bool) -> None:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"ActorResources.{name} must be a finite number, got {value!r}")
            if value < 0 or (positive and value == 0):
                raise ConfigError(
                    f"ActorResources.{name} must be {'> 0' if positive else '>= 0'}, got {value!r}"
                )

        amount("cpus", self.cpus, positive=False)
        if self.memory_gib is not None:
            amount("memory_gib", self.memory_gib, positive=True)
        if not isinstance(self.custom, Mapping):
            raise ConfigError(
                f"ActorResources.custom must map resource names to amounts, got {self.custom!r}"
            )
        for name, value in self.custom.items():
            if not isinstance(name, str) or not name or name in {"CPU", "GPU", "memory"}:
                raise ConfigError(
                    f"ActorResources.custom names a cluster's own resources, got {name!r} "
                    "(use cpus / memory_gib)"
                )
            amount(f"custom[{name!r}]", value, positive=True)
        object.__setattr__(self, "custom", dict(self.custom))

    def amounts(self) -> dict[str, float]:
        """Every amount by the name a Ray node reports it under (``CPU``, ``memory`` in bytes, custom)."""
        needs: dict[str, float] = {"CPU": float(self.cpus)} if self.cpus else {}
        if self.memory_gib is not None:
            needs["memory"] = self.memory_gib * 2**30
        return {**needs, **self.custom}

    def summary(self) -> str:
        """``1 CPU, 2 GiB, sandbox_slot 1``: what a node must offer, for messages."""
        parts = [f"{self.cpus:g} CPU"]
        if self.memory_gib is not None:
            parts.append(f"{self.memory_gib:g} GiB")
        parts += [f"{name} {value:g}" for name, value in self.custom.items()]
        return ", ".join(parts)
