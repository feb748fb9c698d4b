"""A zero-latency engine that replays scripted token ids: for tests, benchmarks and demos."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

from agentboost.engines.base import Generation, RolloutKey, SamplingParams, check_max_new_tokens
from agentboost.errors import EngineError

Script = Callable[[Sequence[int], int], Sequence[int]]
"""``script(prompt_ids, call_index) -> ids`` to return for that call."""


class ScriptedEngine:
    """Returns pre-written ids, honouring ``max_new_tokens`` and stop ids like a real engine.

    Log-probabilities are a constant (``logprob``), so ids, mask and alignment can be checked
    without a model. ``responses`` is either a sequence used in order (cycling when ``cycle``) or a
    callable that sees the prompt.
    """

    def __init__(
        self,
        responses: Sequence[Sequence[int]] | Script,
        *,
        cycle: bool = False,
        context_length: int | None = None,
        logprob: float = -0.5,
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

    async def aclose(self) -> None:
        return None
