"""SGLang's native ``POST /generate``: the subset agentboost speaks, token ids in and out.

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
``completion_tokens``. An abort is a server fault (retryable).

Context: SGLang refuses a request unless ``prompt + max_new_tokens < context length``
(:data:`CONTEXT_SLACK` = 1). The context length is in ``/model_info`` (or ``/get_model_info``) when the
server reports one, else ``max_model_len`` in ``/v1/models``.
"""

from __future__ import annotations

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

GENERATE_PATH = "/generate"
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
"""Where SGLang reports its server arguments and version (newer, older)."""
MODEL_INFO_PATHS = ("/model_info", "/get_model_info", "/v1/models")
"""Where a server reports its context length, in the order to ask (the last one is vLLM-style)."""
CONTEXT_SLACK = 1
"""SGLang needs ``prompt + max_new_tokens <= context length - CONTEXT_SLACK``."""
_CONTEXT_KEYS = ("context_length", "max_context_length", "context_len", "max_model_len")


class SGLangSamplingParams(TypedDict, total=False):
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop_token_ids: list[int]
    ignore_eos: bool
    no_stop_trim: bool
    skip_special_tokens: bool
    sampling_seed: int


class GenerateRequest(TypedDict, total=False):
    input_ids: list[int]
    sampling_params: SGLangSamplingParams
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int


class FinishReasonInfo(TypedDict, total=False):
    type: str  # "stop" | "length" | "abort"
    matched: int
    length: int
    message: str


class MetaInfo(TypedDict, total=False):
    id: str
    finish_reason: FinishReasonInfo
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: float
    output_token_logprobs: list[list[Any]]  # [logprob, token_id, text-or-null]


class GenerateResponse(TypedDict):
    text: str
    output_ids: list[int]
    meta_info: MetaInfo


# --- the client ------------------------------------------------------------------------------------


def sampling_params(sampling: SamplingParams, max_new_tokens: int) -> SGLangSamplingParams:
    """SGLang's ``sampling_params`` for one request that stops only at ``sampling.stop_token_ids``."""
    params: SGLangSamplingParams = {
        "max_new_tokens": max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": wire_top_k(sampling),
        "stop_token_ids": list(sampling.stop_token_ids),
        "ignore_eos": True,
        "no_stop_trim": True,
        "skip_special_tokens": False,
    }
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    return params


def build_request(prompt: list[int], sampling: SamplingParams, max_new_tokens: int) -> GenerateRequest:
    """The body of ``POST /generate`` for one generation with log-probabilities of the new tokens."""
    return {
        "input_ids": prompt,
        "sampling_params": sampling_params(sampling, max_new_tokens),
        "return_logprob": True,
        "logprob_start_len": -1,
    }


def parse_response(
    payload: Any, prompt: list[int], sampling: SamplingParams, max_new_tokens: int
) -> Generation:
    """The Generation in a ``/generate`` answer; ResponseFormatError when it is not one."""
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
    logprobs = float_list([_logprob_of(entry) for entry in entries], "output_token_logprobs")
    logged_ids = [entry[1] for entry in entries if isinstance(entry, list) and len(entry) > 1]
    if len(logged_ids) == len(token_ids) and logged_ids != token_ids:
        raise ResponseFormatError("the token ids in output_token_logprobs differ from output_ids")
    if not isinstance(finish, dict) or not isinstance(finish.get("type"), str):
        raise ResponseFormatError(f"'meta_info.finish_reason' is {finish!r}, expected {{'type': ...}}")
    reason = finish_reason_for(token_ids, finish["type"], sampling, max_new_tokens)
    check_prompt_tokens(meta.get("prompt_tokens", len(prompt)), prompt)
    metrics: dict[str, float] = {}
    for key, name in (("e2e_latency", "server_s"), ("cached_tokens", "cached_tokens")):
        value = meta.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[name] = float(value)
    return generation(token_ids, logprobs, reason, prompt, **metrics)


def context_length_in(payload: Any) -> int | None:
    """The context length in a model-info or ``/v1/models`` answer, if it names one."""
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


def top_logprobs_request(prompt: list[int], temperature: float, top_k: int, count: int) -> GenerateRequest:
    """A one-token request for the ``count`` most likely next tokens' logprobs (the logprobs probe)."""
    sampling = SamplingParams(temperature=temperature, top_k=top_k, seed=0)
    body = build_request(prompt, sampling, 1)
    body["top_logprobs_num"] = count
    return body


def top_logprobs_in(payload: Any) -> dict[int, float]:
    """``{token id: logprob}`` of the first generated token in a ``top_logprobs_request`` answer."""
    if isinstance(payload, list) and len(payload) == 1:
        payload = payload[0]
    meta = payload.get("meta_info") if isinstance(payload, dict) else None
    top = meta.get("output_top_logprobs") if isinstance(meta, dict) else None
    if not isinstance(top, list) or not top or not isinstance(top[0], list):
        raise ResponseFormatError(
            "'meta_info.output_top_logprobs' is missing (was top_logprobs_num ignored?)"
        )
    found: dict[int, float] = {}
    for entry in top[0]:
        if not isinstance(entry, (list, tuple)) or len(entry) < 2 or isinstance(entry[1], bool):
            raise ResponseFormatError(f"output_top_logprobs entry {entry!r} is not [logprob, token_id, ...]")
        value, token = entry[0], entry[1]
        if not isinstance(token, int) or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResponseFormatError(f"output_top_logprobs entry {entry!r} is not [logprob, token_id, ...]")
        found[token] = float(value)
    return found


def server_facts_in(payload: Any) -> dict[str, Any]:
    """Version, model and dtype in a ``/server_info`` answer (SGLang's server arguments)."""
    if not isinstance(payload, dict):
        raise ResponseFormatError("/server_info answer is not a JSON object")
    return {
        "server": "SGLang",
        "version": payload.get("version"),
        "model": payload.get("served_model_name") or payload.get("model_path"),
        "dtype": payload.get("dtype"),
    }


def served_by(payload: Any) -> str | None:
    """The ``server`` a model-info answer names (``agentboost serve`` writes its own name there)."""
    server = payload.get("server") if isinstance(payload, dict) else None
    return server if isinstance(server, str) else None


def _logprob_of(entry: Any) -> Any:
    """The logprob of one ``output_token_logprobs`` entry (``[logprob, token_id, text]``)."""
    if isinstance(entry, (list, tuple)) and entry:
        return entry[0]
    raise ResponseFormatError(f"output_token_logprobs entry {entry!r} is not [logprob, token_id, ...]")


# --- the server (agentboost serve) -------------------------------------------------------------------

REQUEST_FIELDS = frozenset(
    {
        "input_ids",
        "text",
        "sampling_params",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "return_text_in_logprobs",
        "stream",
        "rid",
    }
)
SAMPLING_FIELDS = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop_token_ids",
        "sampling_seed",
        "ignore_eos",
        "no_stop_trim",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "n",
        "min_p",
        "min_new_tokens",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "stop",
    }
)
NEUTRAL_SAMPLING = {
    "n": 1,
    "min_p": 0.0,
    "min_new_tokens": 0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "stop": [],
}
"""Sampling fields accepted only at these no-op values."""
DEFAULT_MAX_NEW_TOKENS = 128


def read_request(body: Any, *, context_length: int | None, model_name: str) -> ServedRequest:
    """What a ``/generate`` body asks for, under SGLang's context rule; RequestFormatError if unsupported."""
    body = request_object(body)
    check_fields(body, REQUEST_FIELDS, GENERATE_PATH)
    if body.get("text") is not None:
        raise RequestFormatError(
            "'text' prompts need a tokenizer, which agentboost serve does not have: send input_ids"
        )
    if body.get("stream"):
        raise RequestFormatError("streaming is not supported by agentboost serve")
    if body.get("top_logprobs_num"):
        raise RequestFormatError("top_logprobs_num is not supported by agentboost serve")
    prompt = prompt_ids(body.get("input_ids"), "input_ids")
    start = body.get("logprob_start_len")
    if start is not None and start != -1 and start < len(prompt):
        raise RequestFormatError("prompt log-probabilities are not supported: use logprob_start_len=-1")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise RequestFormatError("'sampling_params' must be a JSON object")
    where = f"{GENERATE_PATH} sampling_params"
    check_fields(params, SAMPLING_FIELDS, where)
    check_neutral(params, NEUTRAL_SAMPLING, where)
    max_new = max_new_tokens_from_wire(params.get("max_new_tokens"), DEFAULT_MAX_NEW_TOKENS)
    if context_length is not None:
        if len(prompt) >= context_length:
            raise RequestFormatError(
                f"The input ({len(prompt)} tokens) is longer than the model's context length "
                f"({context_length} tokens)."
            )
        if len(prompt) + max_new >= context_length:
            raise RequestFormatError(
                "Requested token count exceeds the model's maximum context length of "
                f"{context_length} tokens. You requested a total of {len(prompt) + max_new} tokens: "
                f"{len(prompt)} tokens from the input and {max_new} tokens for the completion."
            )
    sampling = sampling_from_wire(
        temperature=params.get("temperature"),
        top_p=params.get("top_p"),
        top_k=params.get("top_k"),
        stop_token_ids=params.get("stop_token_ids"),
        seed=params.get("sampling_seed"),
    )
    return ServedRequest(prompt, sampling, max_new, body)


def build_response(
    request: ServedRequest, generated: Generation, *, elapsed_s: float, model_name: str, request_id: str
) -> GenerateResponse:
    """The ``/generate`` answer for ``generated``, as SGLang writes it."""
    ids = generated.token_ids
    if generated.finish_reason == "stop":
        finish: FinishReasonInfo = {"type": "stop", "matched": ids[-1]}
    else:
        finish = {"type": "length", "length": len(ids)}
    meta: MetaInfo = {
        "id": request_id,
        "finish_reason": finish,
        "prompt_tokens": generated.prompt_tokens,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "e2e_latency": elapsed_s,
    }
    if request.body.get("return_logprob"):
        meta["output_token_logprobs"] = [
            [logprob, token, None] for logprob, token in zip(generated.logprobs, ids, strict=True)
        ]
    return {"text": "", "output_ids": ids, "meta_info": meta}


def error_body(message: str, status: int) -> dict[str, Any]:
    """An error answer as SGLang writes it."""
    return {"error": {"message": message}}


def model_info(model_name: str, context_length: int | None) -> dict[str, Any]:
    """The ``/model_info`` answer."""
    return {
        "model_path": model_name,
        "tokenizer_path": model_name,
        "is_generation": True,
        "context_length": context_length,
        "server": "agentboost serve",
    }
