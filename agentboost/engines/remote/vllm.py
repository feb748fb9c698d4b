"""vLLM as an engine: token ids in, token ids and log-probabilities out, over ``/v1/completions``.

The request and answer are :mod:`agentboost.engines.remote.wire.vllm`'s (never the chat endpoint: it
re-renders the conversation from text and loses token exactness).

Context length: ``max_model_len`` from ``/v1/models``, read once; vLLM accepts a request when
``prompt + max_tokens <= max_model_len``, so ``max_tokens`` is clamped to what is left and
:class:`~agentboost.errors.ContextLengthError` is raised without a request when nothing is.

Log-probabilities: vLLM's default ``--logprobs-mode raw_logprobs`` reports the untempered model
distribution, not the convention of :mod:`agentboost.engines.base`; ``processed_logprobs`` reports
the sampling distribution, after top-k/top-p. Before its first generation the engine probes each
server (:mod:`agentboost.engines.remote.probe`) and refuses one whose logprobs are not the sampling
distribution's, and refuses top-k/top-p on one that reports them after truncation.
:mod:`agentboost.engines.servers.vllm_server` starts vLLM with the right flags. The facts found (version,
model, dtype, logprobs) are in :attr:`VLLMEngine.server_facts`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from agentboost.engines.base import Generation, SamplingParams
from agentboost.engines.remote.engine import RemoteEngine
from agentboost.engines.remote.probe import AGENTBOOST_SERVE, PROBE_PROMPT, PROBE_TOP
from agentboost.engines.remote.wire import vllm as wire
from agentboost.errors import EngineRequestError

logger = logging.getLogger(__name__)


class VLLMEngine(RemoteEngine):
    """Drives one or more vLLM servers through ``/v1/completions`` with token-id prompts.

    ``model`` is the served model name; when None, the first model ``/v1/models`` lists is used.
    ``urls`` and routing work as in :class:`~agentboost.engines.remote.sglang.SGLangEngine`.
    """

    server_kind: ClassVar[str] = "vLLM"
    logprobs_fix: ClassVar[str] = (
        "; restart it with --logprobs-mode processed_logprobs (`agentboost serve-vllm` sets it)"
    )
    generate_path: ClassVar[str] = wire.COMPLETIONS_PATH
    context_slack: ClassVar[int] = wire.CONTEXT_SLACK

    def __init__(self, urls: str | Sequence[str], *, model: str | None = None, **options: Any) -> None:
        """``model``: the served model's name (learned from /v1/models when None); ``options`` as
        :class:`~agentboost.engines.remote.engine.RemoteEngine` (timeouts, retry policy, context length)."""
        super().__init__(urls, **options)
        self.model = model
        # the model name is a model fact too: learn it with the context length unless both are given
        self._info_known = self._info_known and model is not None

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

    async def _fetch_facts(self, url: str) -> dict[str, Any]:
        cards = (await self._client.request("GET", wire.MODELS_PATH, parse=wire.model_cards, url=url)).value
        card = next((c for c in cards if c["id"] == self.model), cards[0] if cards else {})
        if card.get("owned_by") == "agentboost":
            return {"server": AGENTBOOST_SERVE, "model": card.get("id")}
        facts: dict[str, Any] = {"server": "vLLM", "model": card.get("id"), "root": card.get("root")}
        try:
            version = await self._client.request("GET", wire.VERSION_PATH, parse=wire.version_in, url=url)
            facts["version"] = version.value
        except EngineRequestError:
            facts["version"] = None
        try:  # development mode only: the engine configuration, with the dtype
            info = await self._client.request("GET", wire.SERVER_INFO_PATH, parse=wire.dtype_in, url=url)
            facts["dtype"] = info.value
        except EngineRequestError:
            facts["dtype"] = None
        return facts

    async def _top_logprobs(self, url: str, temperature: float, top_k: int) -> dict[int, float]:
        body = wire.top_logprobs_request(list(PROBE_PROMPT), temperature, top_k, PROBE_TOP, model=self.model)
        result = await self._client.request(
            "POST", wire.COMPLETIONS_PATH, body=dict(body), parse=wire.top_logprobs_in, url=url
        )
        return result.value
