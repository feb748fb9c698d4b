"""An agentboost :class:`~agentboost.engines.base.Engine` over veRL's server manager (vLLM or SGLang servers).

veRL's agent-loop worker hands each loop a server manager whose
``generate(request_id, *, prompt_ids, sampling_params, ...)`` returns a ``TokenOutput`` (``token_ids``,
``log_probs``, ``stop_reason``, ``num_preempted``, ``extra_fields``). :class:`VerlServerEngine` wraps it for
ONE rollout: every turn goes out under the same ``request_id``, so the manager keeps the rollout on one
server and its prefix cache.

Each request's ``sampling_params`` are the backend's own sampling fields, built by the same functions the
SGLang and vLLM clients use (:func:`agentboost.engines.remote.wire.sglang.sampling_params`,
:func:`agentboost.engines.remote.wire.vllm.sampling_params`), plus veRL's ``logprobs`` switch:

* ``stop_token_ids`` = the provider's stop ids and ``ignore_eos = True``: the server stops only there or
  at the token budget, so ``finish_reason`` is ``stop`` exactly when the last id is a stop id;
* ``logprobs = True``: one log-probability per generated id, whatever ``rollout.calculate_log_probs`` says;
* SGLang also gets ``no_stop_trim = True`` so the stop id stays in ``output_ids``.

Log-probabilities are the server's: with veRL's default ``rollout.logprobs_mode=processed_logprobs``, vLLM
reports them after temperature (and top-k/top-p) processing, which is agentboost's convention when top-k
and top-p are off. A server that aborts, returns no tokens, no or misaligned log-probabilities, or stops
early without a stop id raises :class:`~agentboost.errors.EngineError`: the rollout ends ``engine_error``.

This module does not import veRL: it only reads the attributes of what the server manager returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentboost.engines.base import Generation, RolloutKey, SamplingParams, check_max_new_tokens
from agentboost.engines.remote.wire import sglang as sglang_wire
from agentboost.engines.remote.wire import vllm as vllm_wire
from agentboost.errors import EngineError, PromptTooLongError

_ABORTED = frozenset({"aborted", "abort"})
_OWN_KEYS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "max_new_tokens",
        "stop_token_ids",
        "logprobs",
        "ignore_eos",
        "no_stop_trim",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "seed",
        "sampling_seed",
    }
)


class VerlServerEngine:
    """One rollout's view of veRL's server manager, as an agentboost Engine.

    ``backend`` is ``actor_rollout_ref.rollout.name`` (``vllm`` or ``sglang``). ``extra_sampling`` carries
    veRL's other sampling keys (e.g. ``repetition_penalty``) unchanged. ``max_prompt_tokens`` refuses a
    first prompt longer than veRL can train on. ``generate_kwargs`` go to every ``generate`` call (e.g.
    ``priority``).
    """

    def __init__(
        self,
        server_manager: Any,
        *,
        request_id: str,
        backend: str = "vllm",
        context_length: int | None = None,
        max_prompt_tokens: int | None = None,
        extra_sampling: Mapping[str, Any] | None = None,
        generate_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.server_manager = server_manager
        self.request_id = request_id
        self.backend = backend
        self._context_length = context_length
        self.max_prompt_tokens = max_prompt_tokens
        self.extra_sampling = {k: v for k, v in (extra_sampling or {}).items() if k not in _OWN_KEYS}
        self.generate_kwargs = dict(generate_kwargs or {})
        self.calls = 0
        self.generate_s = 0.0
        self.num_preempted: int | None = None
        """Summed over calls; None when the server never reported it."""
        self.min_global_steps: Any = None
        """Weight version of the first turn (veRL's staleness bookkeeping)."""
        self.max_global_steps: Any = None
        """Weight version of the last turn."""

    @property
    def context_length(self) -> int | None:
        return self._context_length

    def sampling_params(self, sampling: SamplingParams, max_new_tokens: int) -> dict[str, Any]:
        """The ``sampling_params`` dict veRL's vLLM / SGLang servers accept for one request."""
        params: dict[str, Any] = dict(self.extra_sampling)
        if self.backend == "sglang":
            params.update(sglang_wire.sampling_params(sampling, max_new_tokens))
        else:
            params.update(vllm_wire.sampling_params(sampling, max_new_tokens))
        params["logprobs"] = True  # veRL's switch for one log-probability per generated id
        return params

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        prompt = [int(token) for token in prompt_ids]
        if self.calls == 0 and self.max_prompt_tokens is not None and len(prompt) > self.max_prompt_tokens:
            raise PromptTooLongError(
                f"the first prompt has {len(prompt)} tokens but veRL's rollout.prompt_length "
                f"(data.max_prompt_length) is {self.max_prompt_tokens}: raise data.max_prompt_length, or "
                "shorten the system prompt, tool descriptions or task"
            )
        self.calls += 1
        started = time.perf_counter()
        try:
            output = await self.server_manager.generate(
                request_id=self.request_id,
                prompt_ids=prompt,
                sampling_params=self.sampling_params(sampling, max_new_tokens),
                **self.generate_kwargs,
            )
        except asyncio.CancelledError:
            raise
        except EngineError:
            raise
        except Exception as error:
            raise EngineError(f"veRL's server manager failed: {type(error).__name__}: {error}") from error
        finally:
            self.generate_s += time.perf_counter() - started
        self._record(output)
        return self._generation(output, prompt, sampling, max_new_tokens)

    def bind(self, rollout: RolloutKey) -> VerlServerEngine:
        """Already one rollout's view (one ``request_id``): itself."""
        return self

    def unbind(self, rollout: RolloutKey) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def _record(self, output: Any) -> None:
        preempted = getattr(output, "num_preempted", None)
        if preempted is not None:
            self.num_preempted = (self.num_preempted or 0) + int(preempted)
        extra = getattr(output, "extra_fields", None) or {}
        first = extra.get("min_global_steps", extra.get("global_steps"))
        last = extra.get("max_global_steps", extra.get("global_steps"))
        if self.min_global_steps is None:
            self.min_global_steps = first
        if last is not None:
            self.max_global_steps = last

    def _generation(
        self, output: Any, prompt: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> Generation:
        reason = getattr(output, "stop_reason", None)
        if reason in _ABORTED:
            raise EngineError(
                "veRL's server aborted the request (weights were being updated, or it was shut down)"
            )
        token_ids = [int(token) for token in (output.token_ids or [])]
        if not token_ids:
            raise EngineError(f"veRL's server returned no tokens (stop_reason={reason!r})")
        logprobs = output.log_probs
        if logprobs is None:
            raise EngineError(
                "veRL's server returned no log-probabilities although logprobs=True was asked for"
            )
        if len(logprobs) != len(token_ids):
            raise EngineError(
                f"veRL's server returned {len(token_ids)} token ids but {len(logprobs)} log-probabilities"
            )
        if token_ids[-1] in sampling.stop_token_ids:
            finish = "stop"
        else:
            expected = max_new_tokens
            if self._context_length is not None:
                expected = min(expected, self._context_length - len(prompt))
            if len(token_ids) < expected:
                raise EngineError(
                    f"veRL's server stopped after {len(token_ids)} of {expected} tokens without a stop id "
                    f"(last id {token_ids[-1]}, stop ids {list(sampling.stop_token_ids)}, "
                    f"stop_reason={reason!r}): it stopped on an id it was not given, trimmed the stop id, or "
                    "ran out of context (set actor_rollout_ref.rollout.max_model_len)"
                )
            finish = "length"
        return Generation(
            token_ids=token_ids,
            logprobs=[float(value) for value in logprobs],
            finish_reason=finish,
            prompt_tokens=len(prompt),
        )
