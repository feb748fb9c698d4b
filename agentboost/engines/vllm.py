"""vLLM as an engine: token ids in, token ids and log-probabilities out, over ``/v1/completions``.

Never the chat endpoint: it re-renders the conversation from text and loses token exactness. The
request (vLLM ``CompletionRequest``)::

    {"model": M, "prompt": [...ids...], "max_tokens": N, "temperature": T, "top_p": P, "top_k": K,
     "stop_token_ids": [...], "ignore_eos": true, "skip_special_tokens": false,
     "include_stop_str_in_output": true, "logprobs": 0, "return_token_ids": true,
     "return_tokens_as_token_ids": true, "n": 1, "echo": false, "stream": false, "seed": S}

* ``prompt`` as a list of token ids is taken verbatim (no tokenization, no BOS added).
* ``logprobs: 0`` asks for the sampled token's log-probability only.
* ``return_token_ids`` puts the generated ids in ``choices[0].token_ids`` (recent vLLM);
  ``return_tokens_as_token_ids`` writes each entry of ``logprobs.tokens`` as ``"token_id:<id>"``, so
  older servers without ``token_ids`` still give exact ids. The client reads ``token_ids`` when
  present and checks it against the ``token_id:`` entries.
* ``ignore_eos``: the server stops only at ``stop_token_ids`` (which stay in the output), like
  every agentboost engine; put the model's end-of-turn and EOS ids there.
* ``top_k`` -1 is "off" (agentboost's 0); ``seed`` is only sent when set.

The answer: ``choices[0]`` with ``token_ids``, ``logprobs.token_logprobs``, ``logprobs.tokens``,
``finish_reason`` ("stop" / "length"; "abort" is retried) and ``stop_reason`` (the stop id), and
``usage.prompt_tokens``.

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
from agentboost.engines.http import (
    RemoteEngine,
    ResponseFormatError,
    finish_reason_for,
    float_list,
    int_list,
)
from agentboost.errors import EngineRequestError

logger = logging.getLogger(__name__)

_TOKEN_PREFIX = "token_id:"


class VLLMEngine(RemoteEngine):
    """Drives one or more vLLM servers through ``/v1/completions`` with token-id prompts.

    ``model`` is the served model name; when None, the first model ``/v1/models`` lists is used.
    ``urls`` and routing work as in :class:`~agentboost.engines.sglang.SGLangEngine`.
    """

    server_kind: ClassVar[str] = "vLLM"
    generate_path: ClassVar[str] = "/v1/completions"
    context_slack: ClassVar[int] = 0

    def __init__(self, urls: str | Sequence[str], *, model: str | None = None, **options: Any) -> None:
        """``model``: the served model's name (learned from /v1/models when None); ``options`` as
        :class:`~agentboost.engines.http.RemoteEngine` (timeouts, retry policy, context length)."""
        super().__init__(urls, **options)
        self.model = model
        context_length = options.get("context_length")
        # the model name is a model fact too: learn it with the context length unless both are given
        self._info_known = context_length is not None and model is not None

    def build_request(
        self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_ids,
            "max_tokens": max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "n": 1,
            "echo": False,
            "stream": False,
        }
        if self.model is None:
            del body["model"]
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def parse_response(
        self, payload: Any, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int
    ) -> Generation:
        if not isinstance(payload, dict):
            raise ResponseFormatError(f"expected a JSON object, got {type(payload).__name__}")
        choices = payload.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise ResponseFormatError("expected exactly one entry in 'choices'")
        choice = choices[0]
        reason = choice.get("finish_reason")
        if reason == "abort":
            raise ResponseFormatError("the server aborted the request", retryable=True)
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict):
            raise ResponseFormatError("'choices[0].logprobs' is missing (was 'logprobs' ignored?)")
        values = float_list(logprobs.get("token_logprobs"), "logprobs.token_logprobs")
        ids_from_tokens = _ids_from_tokens(logprobs.get("tokens"))
        if choice.get("token_ids") is not None:
            token_ids = int_list(choice["token_ids"], "choices[0].token_ids")
            if ids_from_tokens is not None and ids_from_tokens != token_ids:
                raise ResponseFormatError("choices[0].token_ids differ from the ids in logprobs.tokens")
        elif ids_from_tokens is not None:
            token_ids = ids_from_tokens
        else:
            raise ResponseFormatError(
                "no token ids: neither choices[0].token_ids (return_token_ids) nor 'token_id:<id>' "
                "entries in logprobs.tokens (return_tokens_as_token_ids) came back; upgrade vLLM"
            )
        if len(values) != len(token_ids):
            raise ResponseFormatError(f"{len(token_ids)} token ids but {len(values)} token_logprobs")
        if not isinstance(reason, str):
            raise ResponseFormatError(f"'choices[0].finish_reason' is {reason!r}")
        finish = finish_reason_for(token_ids, reason, sampling, max_new_tokens)
        usage = payload.get("usage")
        prompt_tokens = (
            usage.get("prompt_tokens", len(prompt_ids)) if isinstance(usage, dict) else len(prompt_ids)
        )
        if prompt_tokens != len(prompt_ids):
            raise ResponseFormatError(
                f"the server saw {prompt_tokens} prompt tokens, {len(prompt_ids)} were sent"
            )
        return Generation(
            token_ids=token_ids,
            logprobs=values,
            finish_reason=finish,  # type: ignore[arg-type]
            prompt_tokens=len(prompt_ids),
        )

    async def _fetch_context_length(self) -> int | None:
        try:
            result = await self._client.request("GET", "/v1/models", parse=_model_cards)
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


def _ids_from_tokens(tokens: Any) -> list[int] | None:
    """Ids from ``["token_id:12", ...]`` (return_tokens_as_token_ids); None if not in that form."""
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        return None
    if not all(t.startswith(_TOKEN_PREFIX) for t in tokens):
        return None
    try:
        return [int(t[len(_TOKEN_PREFIX) :]) for t in tokens]
    except ValueError:
        return None


def _model_cards(payload: Any) -> list[dict[str, Any]]:
    """The model cards of a ``/v1/models`` answer."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ResponseFormatError("/v1/models answer has no 'data' list")
    cards = [card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str)]
    if len(cards) != len(data):
        raise ResponseFormatError("/v1/models lists an entry without a string 'id'")
    return cards
