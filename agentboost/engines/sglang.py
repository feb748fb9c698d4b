"""SGLang as an engine: token ids in, token ids and log-probabilities out, over native ``/generate``.

The request (SGLang ``GenerateReqInput`` and ``SamplingParams``)::

    {"input_ids": [...], "return_logprob": true, "logprob_start_len": -1,
     "sampling_params": {"max_new_tokens": N, "temperature": T, "top_p": P, "top_k": K,
                         "stop_token_ids": [...], "ignore_eos": true, "no_stop_trim": true,
                         "skip_special_tokens": false, "sampling_seed": S}}

* ``top_k`` -1 means "off" in SGLang (agentboost's 0). ``sampling_seed`` is only sent when a seed is set
  (older SGLang versions reject unknown sampling keys).
* ``ignore_eos``: the server stops only at the ids in ``stop_token_ids``, exactly like every other
  agentboost engine; put the model's end-of-turn and EOS ids there.
* ``no_stop_trim``: the stop id stays the last id of ``output_ids``, as the Engine protocol requires.
* ``logprob_start_len = -1``: log-probabilities of the generated tokens only.

The answer: ``output_ids``, ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` per
generated token), ``meta_info.finish_reason`` (``{"type": "stop", "matched": id}``,
``{"type": "length", "length": n}`` or ``{"type": "abort", ...}``), ``meta_info.prompt_tokens`` and
``completion_tokens``. An abort counts as a server fault and is retried.

Context length: SGLang refuses a request unless ``prompt + max_new_tokens < context length``, so
:attr:`SGLangEngine.context_length` reports one less than the server's, the client clamps
``max_new_tokens`` to what that leaves and raises :class:`~agentboost.errors.ContextLengthError`
without sending anything when nothing is left. The server's context length is read once from
``/model_info`` (or ``/get_model_info``) when it reports one, else from ``max_model_len`` in
``/v1/models``.

Log-probabilities: SGLang reports them under the temperature-scaled distribution before top-k/top-p
(and under the plain model for greedy requests), the convention of
:mod:`agentboost.engines.base`. If your SGLang build returns the untempered ("original") logprobs
instead, sample at temperature 1 or recompute them in the trainer.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from agentboost.engines.base import Generation, SamplingParams
from agentboost.engines.http import (
    RemoteEngine,
    ResponseFormatError,
    finish_reason_for,
    float_list,
    int_list,
)
from agentboost.errors import EngineRequestError

logger = logging.getLogger(__name__)

_CONTEXT_KEYS = ("context_length", "max_context_length", "context_len", "max_model_len")


class SGLangEngine(RemoteEngine):
    """Drives one or more SGLang servers through native ``/generate`` with token ids.

    ``urls`` is one URL, a comma-separated string or a sequence; requests go to the least-loaded
    server, and :meth:`bind` keeps one rollout on one server (prefix cache reuse).
    ``context_length`` overrides the server's context length (as configured on the server).
    """

    server_kind: ClassVar[str] = "SGLang"
    generate_path: ClassVar[str] = "/generate"
    context_slack: ClassVar[int] = 1

    def build_request(
        self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": True,
            "no_stop_trim": True,
            "skip_special_tokens": False,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        return {
            "input_ids": prompt_ids,
            "sampling_params": params,
            "return_logprob": True,
            "logprob_start_len": -1,
        }

    def parse_response(
        self, payload: Any, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> Generation:
        if isinstance(payload, list) and len(payload) == 1:
            payload = payload[0]  # a batch of one
        if not isinstance(payload, dict):
            raise ResponseFormatError(f"expected a JSON object, got {type(payload).__name__}")
        meta = payload.get("meta_info")
        if not isinstance(meta, dict):
            raise ResponseFormatError("'meta_info' is missing")
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            raise ResponseFormatError(
                f"the server aborted the request: {finish.get('message', '')}", retryable=True
            )
        if "output_ids" not in payload:
            raise ResponseFormatError("'output_ids' is missing")
        token_ids = int_list(payload["output_ids"], "output_ids")
        entries = meta.get("output_token_logprobs")
        if not isinstance(entries, list):
            raise ResponseFormatError(
                "'meta_info.output_token_logprobs' is missing (was return_logprob ignored?)"
            )
        if len(entries) != len(token_ids):
            raise ResponseFormatError(f"{len(token_ids)} output_ids but {len(entries)} output_token_logprobs")
        logprobs = float_list([_first(entry) for entry in entries], "output_token_logprobs")
        logged_ids = [entry[1] for entry in entries if isinstance(entry, list) and len(entry) > 1]
        if len(logged_ids) == len(token_ids) and logged_ids != token_ids:
            raise ResponseFormatError("the token ids in output_token_logprobs differ from output_ids")
        if not isinstance(finish, dict) or not isinstance(finish.get("type"), str):
            raise ResponseFormatError(f"'meta_info.finish_reason' is {finish!r}, expected {{'type': ...}}")
        reason = finish_reason_for(token_ids, finish["type"], sampling, max_new_tokens)
        prompt_tokens = meta.get("prompt_tokens", len(prompt_ids))
        if not isinstance(prompt_tokens, int) or prompt_tokens != len(prompt_ids):
            raise ResponseFormatError(
                f"the server saw {prompt_tokens} prompt tokens, {len(prompt_ids)} were sent"
            )
        metrics: dict[str, float] = {}
        for key, name in (("e2e_latency", "server_s"), ("cached_tokens", "cached_tokens")):
            value = meta.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[name] = float(value)
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=reason,  # type: ignore[arg-type]
            prompt_tokens=prompt_tokens,
            metrics=metrics,
        )

    async def _fetch_context_length(self) -> int | None:
        for path in ("/model_info", "/get_model_info", "/v1/models"):
            try:
                result = await self._client.request("GET", path, parse=_context_length_in)
            except EngineRequestError:
                continue  # this server version lacks the endpoint; try the next one
            if result.value is not None:
                return result.value
        logger.warning(
            "SGLang servers %s report no context length; max_new_tokens is not clamped", ", ".join(self.urls)
        )
        return None


def _first(entry: Any) -> Any:
    """The logprob of one ``output_token_logprobs`` entry (``[logprob, token_id, text]``)."""
    if isinstance(entry, (list, tuple)) and entry:
        return entry[0]
    raise ResponseFormatError(f"output_token_logprobs entry {entry!r} is not [logprob, token_id, ...]")


def _context_length_in(payload: Any) -> int | None:
    """The context length in a model-info or /v1/models answer, if it names one."""
    candidates: list[Any] = []
    if isinstance(payload, dict):
        candidates.append(payload)
        data = payload.get("data")
        if isinstance(data, list):
            candidates.extend(item for item in data if isinstance(item, dict))
    for item in candidates:
        for key in _CONTEXT_KEYS:
            value = item.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None
