"""An engine that replays scripted token ids (zero latency, or a scripted one): for tests, benchmarks
and demos."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from agentboost.engines.base import Generation, RolloutKey, SamplingParams, check_max_new_tokens
from agentboost.errors import EngineError

if TYPE_CHECKING:
    from agentboost.engines.embedded.prefix_cache import PrefixCacheStats

Script = Callable[[Sequence[int], int], Sequence[int]]
"""``script(prompt_ids, call_index) -> ids`` to return for that call."""


class ScriptedEngine:
    """Returns pre-written ids, honouring ``max_new_tokens`` and stop ids like a real engine.

    Log-probabilities are a constant (``logprob``), so ids, mask and alignment can be checked
    without a model. ``responses`` is either a sequence used in order (cycling when ``cycle``) or a
    callable that sees the prompt. ``delay(prompt_ids, call_index)``: seconds each call waits before it
    answers (a simulated latency; none by default). It meets
    :class:`~agentboost.engines.base.TrainableEngine` too (its weights: nothing; ``weight_version``
    counts the syncs), so a trainer can run on it.
    """

    def __init__(
        self,
        responses: Sequence[Sequence[int]] | Script,
        *,
        cycle: bool = False,
        context_length: int | None = None,
        logprob: float = -0.5,
        delay: Callable[[Sequence[int], int], float] | None = None,
    ) -> None:
        if callable(responses):
            self._script: Script = responses
        else:
            items = [list(r) for r in responses]
            source: Iterable[list[int]] = itertools.cycle(items) if cycle else iter(items)

            def replay(_prompt: Sequence[int], index: int) -> Sequence[int]:
                try:
                    return next(source)
                except StopIteration:
                    raise EngineError(f"scripted engine has no response left for call {index}") from None

            self._script = replay
        self._context_length = context_length
        self._logprob = logprob
        self._delay = delay
        self.weight_version = 0
        self.calls = 0
        self.prompts: list[list[int]] = []
        self.record_prompts = False

    @property
    def context_length(self) -> int | None:
        return self._context_length

    def bind(self, rollout: RolloutKey) -> ScriptedEngine:
        """One script serves every rollout: itself."""
        return self

    def unbind(self, rollout: RolloutKey) -> None:
        return None

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        index = self.calls
        self.calls += 1
        if self.record_prompts:
            self.prompts.append(list(prompt_ids))
        if self._delay is not None:
            await asyncio.sleep(self._delay(prompt_ids, index))
        ids = list(self._script(prompt_ids, index))
        finish = "length"
        stops = sampling.stop_token_ids
        for position, token in enumerate(ids):
            if token in stops:
                ids = ids[: position + 1]
                finish = "stop"
                break
        if len(ids) > max_new_tokens:
            ids = ids[:max_new_tokens]
            finish = "length"
        return Generation(
            token_ids=ids,
            logprobs=[self._logprob] * len(ids),
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
        )

    def sync_weights(self) -> int:
        self.weight_version += 1
        return self.weight_version

    def release_memory(self) -> None:
        return None

    def prefix_cache_stats(self) -> PrefixCacheStats:
        from agentboost.engines.embedded.prefix_cache import PrefixCacheStats

        return PrefixCacheStats()

    async def aclose(self) -> None:
        return None
