"""SGLang as an engine: token ids in, token ids and log-probabilities out, over native ``/generate``.

The request and answer are :mod:`agentboost.engines.remote.wire.sglang`'s. Context length: SGLang refuses a
request unless ``prompt + max_new_tokens < context length``, so :attr:`SGLangEngine.context_length`
reports one less than the server's, the client clamps ``max_new_tokens`` to what that leaves and raises
:class:`~agentboost.errors.ContextLengthError` without sending anything when nothing is left. The
server's context length is read once from ``/model_info`` (or ``/get_model_info``) when it reports one,
else from ``max_model_len`` in ``/v1/models``.

Log-probabilities: SGLang reports them under the temperature-scaled distribution before top-k/top-p
(and under the plain model for greedy requests), the convention of
:mod:`agentboost.engines.base`. If your SGLang build returns the untempered ("original") logprobs
instead, sample at temperature 1 or recompute them in the trainer.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from agentboost.engines.base import Generation, SamplingParams
from agentboost.engines.remote.engine import RemoteEngine
from agentboost.engines.remote.probe import AGENTBOOST_SERVE, PROBE_PROMPT, PROBE_TOP
from agentboost.engines.remote.wire import sglang as wire
from agentboost.errors import EngineRequestError

logger = logging.getLogger(__name__)


class SGLangEngine(RemoteEngine):
    """Drives one or more SGLang servers through native ``/generate`` with token ids.

    ``urls`` is one URL, a comma-separated string or a sequence; requests go to the least-loaded
    server, and :meth:`bind` keeps one rollout on one server (prefix cache reuse).
    ``context_length`` overrides the server's context length (as configured on the server).
    """

    server_kind: ClassVar[str] = "SGLang"
    logprobs_fix: ClassVar[str] = (
        "; serve the sampling distribution's logprobs (SGLang's default: drop any option that returns "
        "the original, untempered logprobs), or sample at temperature 1"
    )
    generate_path: ClassVar[str] = wire.GENERATE_PATH
    context_slack: ClassVar[int] = wire.CONTEXT_SLACK

    def build_request(
        self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> dict[str, Any]:
        return dict(wire.build_request(prompt_ids, sampling, max_new_tokens))

    def parse_response(
        self, payload: Any, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> Generation:
        return wire.parse_response(payload, prompt_ids, sampling, max_new_tokens)

    async def _fetch_context_length(self) -> int | None:
        for path in wire.MODEL_INFO_PATHS:
            try:
                result = await self._client.request("GET", path, parse=wire.context_length_in)
            except EngineRequestError:
                continue  # this server version lacks the endpoint; try the next one
            if result.value is not None:
                return result.value
        logger.warning(
            "SGLang servers %s report no context length; max_new_tokens is not clamped", ", ".join(self.urls)
        )
        return None

    async def _fetch_facts(self, url: str) -> dict[str, Any]:
        for path in wire.MODEL_INFO_PATHS[:2]:
            try:
                info = await self._client.request("GET", path, parse=wire.served_by, url=url)
            except EngineRequestError:
                continue
            if info.value == AGENTBOOST_SERVE:
                return {"server": AGENTBOOST_SERVE}
            break
        for path in wire.SERVER_INFO_PATHS:
            try:
                return (await self._client.request("GET", path, parse=wire.server_facts_in, url=url)).value
            except EngineRequestError:
                continue
        return {"server": "SGLang", "version": None, "model": None, "dtype": None}

    async def _top_logprobs(self, url: str, temperature: float, top_k: int) -> dict[int, float]:
        body = wire.top_logprobs_request(list(PROBE_PROMPT), temperature, top_k, PROBE_TOP)
        result = await self._client.request(
            "POST", wire.GENERATE_PATH, body=dict(body), parse=wire.top_logprobs_in, url=url
        )
        return result.value
