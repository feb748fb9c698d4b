"""vLLM's ``POST /v1/completions`` with token-id prompts: the subset agentboost speaks.

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
``finish_reason`` ("stop" / "length"; "abort" is a retryable server fault) and ``stop_reason`` (the stop
id), and ``usage.prompt_tokens``.

Context: ``max_model_len`` of the served model in ``GET /v1/models``; vLLM accepts a request when
``prompt + max_tokens <= max_model_len`` (:data:`CONTEXT_SLACK` = 0).
"""

from __future__ import annotations

import re
import time
from typing import Any, TypedDict

from agentboost.engines.base import Generation, SamplingParams
from agentboost.engines.remote.wire.common import (
    ServedRequest,
    check_fields,
    check_neutral,
    check_prompt_tokens,
    finish_reason_for,
    float_list,
    generation,
    int_list,
    max_new_tokens_from_wire,
    prompt_ids,
    request_object,
    sampling_from_wire,
    wire_top_k,
)
from agentboost.errors import RequestFormatError, ResponseFormatError

COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"
VERSION_PATH = "/version"
SERVER_INFO_PATH = "/server_info"
"""Development mode only (``VLLM_SERVER_DEV_MODE=1``): the engine configuration, dtype included."""
CONTEXT_SLACK = 0
"""vLLM needs ``prompt + max_tokens <= max_model_len``."""
TOKEN_PREFIX = "token_id:"
"""How ``return_tokens_as_token_ids`` writes each entry of ``logprobs.tokens``."""


class VLLMSamplingFields(TypedDict, total=False):
    """The fields a completion request shares with vLLM's ``SamplingParams`` (what veRL forwards)."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop_token_ids: list[int]
    ignore_eos: bool
    skip_special_tokens: bool
    include_stop_str_in_output: bool
    seed: int


class CompletionRequest(VLLMSamplingFields, total=False):
    model: str
    prompt: list[int]
    logprobs: int
    return_token_ids: bool
    return_tokens_as_token_ids: bool
    n: int
    echo: bool
    stream: bool


class CompletionLogprobs(TypedDict, total=False):
    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


class CompletionChoice(TypedDict, total=False):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str  # "stop" | "length" | "abort"
    stop_reason: int | str | None
    token_ids: list[int] | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: Any


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(TypedDict):
    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(TypedDict, total=False):
    id: str
    object: str
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int | None


# --- the client ------------------------------------------------------------------------------------


def sampling_params(sampling: SamplingParams, max_tokens: int) -> VLLMSamplingFields:
    """vLLM's sampling fields for one request that stops only at ``sampling.stop_token_ids``."""
    fields: VLLMSamplingFields = {
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": wire_top_k(sampling),
        "stop_token_ids": list(sampling.stop_token_ids),
        "ignore_eos": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if sampling.seed is not None:
        fields["seed"] = sampling.seed
    return fields


def build_request(
    prompt: list[int], sampling: SamplingParams, max_tokens: int, *, model: str | None
) -> CompletionRequest:
    """The body of ``POST /v1/completions`` for one generation with the sampled tokens' logprobs."""
    fields = sampling_params(sampling, max_tokens)
    seed = fields.pop("seed", None)
    body: CompletionRequest = {
        "model": model or "",
        "prompt": prompt,
        **fields,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "n": 1,
        "echo": False,
        "stream": False,
    }
    if model is None:
        del body["model"]
    if seed is not None:
        body["seed"] = seed
    return body


def parse_response(
    payload: Any, prompt: list[int], sampling: SamplingParams, max_new_tokens: int
) -> Generation:
    """The Generation in a ``/v1/completions`` answer; ResponseFormatError when it is not one."""
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
    check_prompt_tokens(
        usage.get("prompt_tokens", len(prompt)) if isinstance(usage, dict) else len(prompt), prompt
    )
    return generation(token_ids, values, finish, prompt)


def model_cards(payload: Any) -> list[ModelCard]:
    """The model cards of a ``/v1/models`` answer."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ResponseFormatError("/v1/models answer has no 'data' list")
    cards = [card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str)]
    if len(cards) != len(data):
        raise ResponseFormatError("/v1/models lists an entry without a string 'id'")
    return cards


def top_logprobs_request(
    prompt: list[int], temperature: float, top_k: int, count: int, *, model: str | None
) -> CompletionRequest:
    """A one-token request for the ``count`` most likely next tokens' logprobs (the logprobs probe)."""
    sampling = SamplingParams(temperature=temperature, top_k=top_k, seed=0)
    body = build_request(prompt, sampling, 1, model=model)
    body["logprobs"] = count
    return body


def top_logprobs_in(payload: Any) -> dict[int, float]:
    """``{token id: logprob}`` of the first generated token in a ``top_logprobs_request`` answer."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    logprobs = choices[0].get("logprobs") if isinstance(choices, list) and choices else None
    top = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(top, list) or not top or not isinstance(top[0], dict):
        raise ResponseFormatError("'choices[0].logprobs.top_logprobs' is missing")
    found: dict[int, float] = {}
    for token, value in top[0].items():
        ids = _ids_from_tokens([token])
        if ids is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResponseFormatError(
                f"top_logprobs entry {token!r}: {value!r} is not 'token_id:<id>': number"
            )
        found[ids[0]] = float(value)
    return found


def version_in(payload: Any) -> str:
    """The version in a ``GET /version`` answer (``{"version": "0.32.0"}``)."""
    version = payload.get("version") if isinstance(payload, dict) else None
    if not isinstance(version, str):
        raise ResponseFormatError("/version answer has no string 'version'")
    return version


def dtype_in(payload: Any) -> str | None:
    """The model dtype in a ``GET /server_info`` answer (development mode only), if it names one."""
    text = str(payload.get("vllm_config", "")) if isinstance(payload, dict) else ""
    match = re.search(r"dtype=(?:torch\.)?([a-z0-9]+)", text)
    return match.group(1) if match else None


def _ids_from_tokens(tokens: Any) -> list[int] | None:
    """Ids from ``["token_id:12", ...]`` (return_tokens_as_token_ids); None if not in that form."""
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        return None
    if not all(t.startswith(TOKEN_PREFIX) for t in tokens):
        return None
    try:
        return [int(t[len(TOKEN_PREFIX) :]) for t in tokens]
    except ValueError:
        return None


# --- the server (agentboost serve) -------------------------------------------------------------------

REQUEST_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "logprobs",
        "return_token_ids",
        "return_tokens_as_token_ids",
        "n",
        "echo",
        "stream",
        "stop",
        "min_tokens",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "add_special_tokens",
        "user",
        "request_id",
    }
)
NEUTRAL_FIELDS = {
    "n": 1,
    "echo": False,
    "stream": False,
    "stop": [],
    "min_tokens": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}
"""Fields accepted only at these no-op values."""
DEFAULT_MAX_TOKENS = 16
_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError"}


def read_request(body: Any, *, context_length: int | None, model_name: str) -> ServedRequest:
    """What a ``/v1/completions`` body asks for, under vLLM's context rule; RequestFormatError if not."""
    body = request_object(body)
    check_fields(body, REQUEST_FIELDS, COMPLETIONS_PATH)
    check_neutral(body, NEUTRAL_FIELDS, COMPLETIONS_PATH)
    model = body.get("model")
    if model is not None and model != model_name:
        raise RequestFormatError(f"The model `{model}` does not exist.", status=404)
    prompt = prompt_ids(body.get("prompt"), "prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None and logprobs != 0:
        raise RequestFormatError(
            "only logprobs=0 (the sampled token's log-probability) is supported by agentboost serve"
        )
    max_tokens = max_new_tokens_from_wire(body.get("max_tokens"), DEFAULT_MAX_TOKENS)
    if context_length is not None and len(prompt) + max_tokens > context_length:
        raise RequestFormatError(
            f"This model's maximum context length is {context_length} tokens. However, you requested "
            f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion."
        )
    sampling = sampling_from_wire(
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        top_k=body.get("top_k"),
        stop_token_ids=body.get("stop_token_ids"),
        seed=body.get("seed"),
    )
    return ServedRequest(prompt, sampling, max_tokens, body)


def build_response(
    request: ServedRequest, generated: Generation, *, elapsed_s: float, model_name: str, request_id: str
) -> CompletionResponse:
    """The ``/v1/completions`` answer for ``generated``, as vLLM writes it (ids as ``token_id:`` strings)."""
    ids = generated.token_ids
    with_ids = bool(request.body.get("return_token_ids"))
    choice: CompletionChoice = {
        "index": 0,
        "text": "",
        "logprobs": None,
        "finish_reason": generated.finish_reason,
        "stop_reason": ids[-1] if generated.finish_reason == "stop" else None,
        "token_ids": ids if with_ids else None,
        "prompt_token_ids": request.prompt_ids if with_ids else None,
        "prompt_logprobs": None,
    }
    if request.body.get("logprobs") is not None:
        tokens = [f"{TOKEN_PREFIX}{token}" for token in ids]
        choice["logprobs"] = {
            "text_offset": [0] * len(ids),
            "token_logprobs": list(generated.logprobs),
            "tokens": tokens,
            "top_logprobs": [{token: lp} for token, lp in zip(tokens, generated.logprobs, strict=True)],
        }
    return {
        "id": f"cmpl-{request_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": generated.prompt_tokens,
            "completion_tokens": len(ids),
            "total_tokens": generated.prompt_tokens + len(ids),
        },
    }


def error_body(message: str, status: int) -> dict[str, Any]:
    """An error answer as vLLM (the OpenAI API) writes it."""
    kind = _ERROR_TYPES.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def model_list(model_name: str, context_length: int | None, created: int) -> dict[str, Any]:
    """The ``/v1/models`` answer: one card, with ``max_model_len``."""
    card: ModelCard = {
        "id": model_name,
        "object": "model",
        "created": created,
        "owned_by": "agentboost",
        "root": model_name,
        "parent": None,
        "max_model_len": context_length,
    }
    return {"object": "list", "data": [card]}
