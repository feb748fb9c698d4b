"""The engine protocol: token ids in, token ids and their log-probabilities out.

An engine knows nothing of chat, tools or Strands. Every engine (embedded, SGLang, vLLM, scripted)
returns the same :class:`Generation`, so trajectories are exact whichever one served them.

Log-probability convention (the trainer must use the same one):
    ``logprobs[i] = log_softmax(logits_i / T)[token_ids[i]]`` where ``logits_i`` are the model's raw
    logits at that step and ``T`` is the sampling temperature, taken *before* top-k / top-p
    truncation. With ``temperature == 0`` (greedy) ``T`` counts as 1: the log-probability under the
    untempered model. This is the distribution the sampler draws from when no truncation is set, so a
    trainer that computes ``log_softmax(logits / T)`` over the same ids reproduces these numbers.

Rollouts and bindings: a rollout generates through ``engine.bind(RolloutKey(task_id, sample))`` and
calls ``engine.unbind(key)`` when it ends (:func:`bound` does both). Engines with several servers keep
each rollout on one server (its prefix cache then holds the rollout's growing prompt); engines with one
backend return themselves. The key names the rollout, not the task: the GRPO samples of one task are
different rollouts and are routed independently.

The trainer's engine meets :class:`TrainableEngine` as well: it serves the weights being trained
(``sync_weights``, called by the trainer once, before each step's rollouts), gives memory back before an
update (``release_memory``) and reports its prefix cache (``prefix_cache_stats``). Protocols are
checked when an engine is built (:func:`check_engine`): a wrapper that forgets a method is refused there,
by name, instead of failing (or silently losing its routing) in the middle of a run.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from agentboost.errors import ConfigError, EngineContractError, InvalidGenerationError

if TYPE_CHECKING:
    from agentboost.engines.embedded.prefix_cache import PrefixCacheStats

FinishReason = Literal["stop", "length"]
"""``stop``: a stop token was generated (it is the last id). ``length``: ``max_new_tokens`` ran out."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one generation: the distribution and the stop ids, not the length.

    The token budget is an argument of :meth:`Engine.generate` (``max_new_tokens``), because its one
    owner is the caller: a rollout's turns get ``RolloutLimits.max_new_tokens`` clamped to the room its
    context leaves, a served request its body's ``max_tokens``.
    """

    temperature: float = 1.0
    """0 means greedy decoding; otherwise logits are divided by it before sampling."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables it."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation ends after any of these ids; the stop id is returned as the last token."""
    seed: int | None = None
    """Seeds this request's sampler, so a request gives the same tokens however it is batched."""

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral):
            raise ConfigError(f"top_k must be an integer, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_max_new_tokens(max_new_tokens: int) -> int:
    """``max_new_tokens`` if it is an integer >= 1; every engine checks its budget with this."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise ConfigError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    return int(max_new_tokens)


@dataclass
class Generation:
    """What an engine produced for one request."""

    token_ids: list[int]
    """Generated ids, the stop id included when ``finish_reason == "stop"``."""
    logprobs: list[float]
    """One log-probability per generated id (see the module docstring for the distribution)."""
    finish_reason: FinishReason
    prompt_tokens: int
    """Length of the prompt the engine saw."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Engine-specific timings, e.g. ``queue_s``, ``prefill_s``, ``decode_s``."""

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise InvalidGenerationError(
                f"engine returned {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs; "
                "an engine must return one log-probability per generated id (check the server's "
                "logprob settings)"
            )


@dataclass(frozen=True)
class RolloutKey:
    """Names one rollout: a task and which of its samples (GRPO group member, pass@k try) this is."""

    task_id: str
    sample: int = 0

    def __str__(self) -> str:
        return f"{self.task_id}#{self.sample}"


@runtime_checkable
class Engine(Protocol):
    """Anything that turns prompt ids into a :class:`Generation`. Must be safe to await concurrently."""

    @property
    def context_length(self) -> int | None:
        """The most tokens (prompt + generated) one sequence may hold, or None if unknown."""
        ...

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        """Generate at most ``max_new_tokens`` ids (stop id included) after ``prompt_ids``.

        Raises :class:`~agentboost.errors.EngineError`; a budget below 1 is a
        :class:`~agentboost.errors.ConfigError` (see :func:`check_max_new_tokens`).
        """
        ...

    def bind(self, rollout: RolloutKey) -> Engine:
        """The engine ``rollout`` generates through until :meth:`unbind`; for one-backend engines, self."""
        ...

    def unbind(self, rollout: RolloutKey) -> None:
        """``rollout`` ended: forget what :meth:`bind` kept for it. Never closes the engine."""
        ...

    async def aclose(self) -> None:
        """Release threads, connections and memory. Idempotent."""
        ...


@runtime_checkable
class TrainableEngine(Engine, Protocol):
    """The trainer's engine: an :class:`Engine` whose weights are the ones being trained.

    The trainer (:class:`~agentboost.train.trainer.Trainer`) calls, per step: :meth:`sync_weights` once
    when its weights changed since the engine last loaded them (before the step's rollouts and before a
    held-out evaluation), :meth:`prefix_cache_stats` around the rollouts, :meth:`release_memory` before
    the update; :meth:`Engine.aclose` once at the end, in the event loop the rollouts ran in. Met by
    :class:`~agentboost.engines.embedded.engine.LocalEngine` (it shares the model object) and
    :class:`~agentboost.engines.remote.weight_sync.SyncedVLLMEngine` (it pushes the weights to vLLM servers).
    """

    def sync_weights(self) -> int:
        """Serve the trainer's current weights from now on; returns the weight version now served
        (1 after the first sync, +1 per sync). Raises
        :class:`~agentboost.engines.remote.weight_sync.WeightSyncError` (with its cause) when the engine
        cannot take them: the trainer's step fails with it, once."""
        ...

    def release_memory(self) -> None:
        """Give back what the engine rebuilds on demand (cached prefixes, packed weights) before an
        update needs the memory. Never closes the engine."""
        ...

    def prefix_cache_stats(self) -> PrefixCacheStats:
        """A snapshot of the prefix cache's counters (all zero when the cache is elsewhere, e.g. vLLM's)."""
        ...


class OneBackend:
    """Mixin for engines with a single backend: :meth:`bind` returns the engine itself (nothing to keep
    per rollout), :meth:`unbind` forgets nothing, :meth:`aclose` has nothing to release. Override
    what the engine does hold."""

    def bind(self, rollout: RolloutKey) -> Any:
        return self

    def unbind(self, rollout: RolloutKey) -> None:
        return None

    async def aclose(self) -> None:
        return None


class RolloutView:
    """One rollout's view of an engine that wraps another (``owner``): the wrapped engine's own view
    (a remote engine's server kept for the rollout), each generation through
    ``owner.generate_through(view, ...)``, where the wrapper adds what it adds (a weight version, a
    check). Binding and unbinding go to the owner; closing releases this view only."""

    def __init__(self, owner: Any, view: Engine) -> None:
        self.owner = owner
        self.view = view

    @property
    def context_length(self) -> int | None:
        return self.owner.context_length  # type: ignore[no-any-return]

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        return await self.owner.generate_through(self.view, prompt_ids, sampling, max_new_tokens)  # type: ignore[no-any-return]

    def bind(self, rollout: RolloutKey) -> Any:
        return self.owner.bind(rollout)

    def unbind(self, rollout: RolloutKey) -> None:
        self.owner.unbind(rollout)

    async def aclose(self) -> None:
        """Release this rollout's binding only (the engine stays open)."""
        await self.view.aclose()


def protocol_members(protocol: type) -> tuple[str, ...]:
    """The public methods and properties ``protocol`` and the protocols it extends declare, sorted."""
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass is object or not getattr(klass, "_is_protocol", False) or klass is Protocol:
            continue
        names.update(name for name in vars(klass) if not name.startswith("_"))
    return tuple(sorted(names))


E = TypeVar("E")


def check_engine(engine: E, protocol: type = Engine) -> E:
    """``engine`` if it has every method and property of ``protocol`` (:class:`Engine` by default,
    :class:`TrainableEngine` for the trainer); else :class:`~agentboost.errors.EngineContractError`
    naming what it lacks. Called where engines are built (the engine factory, the trainer) and by
    :func:`bound`, so a wrapper that forgets a method fails at once, by name."""
    kind = type(engine)
    if (kind, protocol) in _CHECKED:
        return engine
    missing = []
    for name in protocol_members(protocol):
        declared = getattr(protocol, name)
        found = getattr(engine, name, _MISSING)
        if found is _MISSING or (not isinstance(declared, property) and not callable(found)):
            missing.append(name)
    if missing:
        raise EngineContractError(
            f"{kind.__qualname__} does not meet the {protocol.__name__} protocol "
            f"(agentboost/engines/base.py): it lacks {', '.join(missing)}. An engine that wraps another "
            "must forward every method; engines with one backend can inherit "
            "agentboost.engines.base.OneBackend for bind, unbind and aclose.",
            missing=tuple(missing),
        )
    _CHECKED.add((kind, protocol))
    return engine


_MISSING = object()
_CHECKED: set[tuple[type, type]] = set()
"""(engine class, protocol) pairs found complete: :func:`bound` checks once per class, not per rollout.
(An engine that gains a method per instance is checked by instance the first time only.)"""


@contextmanager
def bound(engine: Engine, rollout: RolloutKey) -> Iterator[Engine]:
    """``engine.bind(rollout)`` for the duration of a ``with`` block, unbound when the block ends.

    The engine must meet :class:`Engine` (:func:`check_engine`): an engine without ``bind`` is refused
    with :class:`~agentboost.errors.EngineContractError`, never served unbound (that hid a wrapper that
    lost its servers' per-rollout routing).
    """
    view = check_engine(engine).bind(rollout)
    try:
        yield view
    finally:
        engine.unbind(rollout)
