"""vLLM as an engine: token ids in, token ids and log-probabilities out, over ``/v1/completions``.

The request and answer are :mod:`agentboost.engines.wire.vllm`'s (never the chat endpoint: it
re-renders the conversation from text and loses token exactness).

Context length: ``max_model_len`` from ``/v1/models``, read once; vLLM accepts a request when
``prompt + max_tokens <= max_model_len``, so ``max_tokens`` is clamped to what is left and
:class:`~agentboost.errors.ContextLengthError` is raised without a request when nothing is.

Log-probabilities: vLLM's default ``--logprobs-mode raw_logprobs`` reports the untempered model
distribution. That is the convention of :mod:`agentboost.engines.base` for greedy decoding and for
temperature 1. To sample at another temperature, start vLLM with
``--logprobs-mode processed_logprobs`` (temperature-scaled; note that it also applies top-k/top-p,
which the convention does not), or recompute log-probabilities in the trainer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from agentboost.engines.base import Generation, SamplingParams
from agentboost.engines.remote import RemoteEngine
from agentboost.engines.wire import vllm as wire
from agentboost.errors import EngineRequestError

logger = logging.getLogger(__name__)


class VLLMEngine(RemoteEngine):
    """Drives one or more vLLM servers through ``/v1/completions`` with token-id prompts.

    ``model`` is the served model name; when None, the first model ``/v1/models`` lists is used.
    ``urls`` and routing work as in :class:`~agentboost.engines.sglang.SGLangEngine`.
    """

    server_kind: ClassVar[str] = "vLLM"
    generate_path: ClassVar[str] = wire.COMPLETIONS_PATH
    context_slack: ClassVar[int] = wire.CONTEXT_SLACK

    def __init__(self, urls: str | Sequence[str], *, model: str | None = None, **options: Any) -> None:
        """``model``: the served model's name (learned from /v1/models when None); ``options`` as
        :class:`~agentboost.engines.remote.RemoteEngine` (timeouts, retry policy, context length)."""
        super().__init__(urls, **options)
        self.model = model
        context_length = options.get("context_length")
        # the model name is a model fact too: learn it with the context length unless both are given
        self._info_known = context_length is not None and model is not None

    def build_request(
        self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> dict[str, Any]:
        return dict(wire.build_request(prompt_ids, sampling, max_new_tokens, model=self.model))

    def parse_response(
        self, payload: Any, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> Generation:
        return wire.parse_response(payload, prompt_ids, sampling, max_new_tokens)

    async def _fetch_context_length(self) -> int | None:
        try:
            result = await self._client.request("GET", wire.MODELS_PATH, parse=wire.model_cards)
        except EngineRequestError:
            logger.warning("vLLM servers %s do not answer /v1/models; max_tokens is not clamped", self.urls)
            return None
        cards = result.value
        card = next((c for c in cards if c["id"] == self.model), None) if self.model is not None else None
        if self.model is None:
            if not cards:
                raise EngineRequestError(
                    f"vLLM server {result.url} lists no model in /v1/models; pass model= explicitly",
                    url=result.url,
                )
            card = cards[0]
            self.model = card["id"]
            if len(cards) > 1:
                logger.warning(
                    "vLLM server %s serves %d models; using %r", result.url, len(cards), self.model
                )
        if card is None:
            names = [c["id"] for c in cards]
            raise EngineRequestError(
                f"vLLM server {result.url} does not serve model {self.model!r}; it serves {names}. "
                "Pass one of those as model=.",
                url=result.url,
            )
        length = card.get("max_model_len")
        return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
