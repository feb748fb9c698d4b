"""Checks shared by the SGLang and vLLM wire formats, on the client side and the server side."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentboost.engines.base import FinishReason, Generation, SamplingParams, check_max_new_tokens
from agentboost.errors import ConfigError, RequestFormatError, ResponseFormatError


@dataclass(frozen=True)
class ServedRequest:
    """A generation request as ``agentboost serve`` understood it: what to run, and the body it came in."""

    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    body: Mapping[str, Any]
    """The request as received, for the answer's optional parts (logprobs, token ids)."""


# --- reading answers (client side) ---------------------------------------------------------------


def finish_reason_for(
    token_ids: list[int], server_reason: str, sampling: SamplingParams, max_new_tokens: int
) -> FinishReason:
    """Map a server's finish reason onto the Engine protocol's ``stop`` / ``length``.

    ``stop`` requires the last id to be one of the requested stop ids (the protocol's promise);
    a server that stopped anywhere else is reported as a format error rather than passed on.
    """
    if len(token_ids) > max_new_tokens:
        raise ResponseFormatError(
            f"{len(token_ids)} tokens came back but at most {max_new_tokens} were asked for"
        )
    if server_reason == "length":
        return "length"
    if server_reason == "stop":
        if token_ids and token_ids[-1] in sampling.stop_token_ids:
            return "stop"
        last = token_ids[-1] if token_ids else None
        raise ResponseFormatError(
            f"the server reports finish reason 'stop' but the last generated id is {last}, not one of the "
            f"requested stop ids {list(sampling.stop_token_ids)} (did the server stop on its own EOS or a "
            "stop string, or trim the stop token?)"
        )
    if server_reason == "abort":
        raise ResponseFormatError("the server aborted the request", retryable=True)
    raise ResponseFormatError(f"unknown finish reason {server_reason!r}")


def float_list(values: Any, what: str) -> list[float]:
    """``values`` as a list of floats, or ResponseFormatError naming ``what``."""
    if not isinstance(values, list):
        raise ResponseFormatError(f"{what} is {type(values).__name__}, expected a list")
    out: list[float] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResponseFormatError(f"{what} holds {value!r}, expected numbers")
        out.append(float(value))
    return out


def int_list(values: Any, what: str) -> list[int]:
    """``values`` as a list of ints, or ResponseFormatError naming ``what``."""
    if not isinstance(values, list):
        raise ResponseFormatError(f"{what} is {type(values).__name__}, expected a list")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise ResponseFormatError(f"{what} holds non-integer values")
    return list(values)


def check_prompt_tokens(reported: Any, prompt_ids: list[int]) -> int:
    """The server's prompt-token count, which must equal what was sent."""
    if isinstance(reported, bool) or not isinstance(reported, int) or reported != len(prompt_ids):
        raise ResponseFormatError(f"the server saw {reported} prompt tokens, {len(prompt_ids)} were sent")
    return reported


def generation(
    token_ids: list[int], logprobs: list[float], finish: FinishReason, prompt_ids: list[int], **metrics: float
) -> Generation:
    """The Generation a parsed answer stands for (ids and logprobs already checked to pair up)."""
    if len(logprobs) != len(token_ids):
        raise ResponseFormatError(f"{len(token_ids)} token ids but {len(logprobs)} log-probabilities")
    return Generation(token_ids, logprobs, finish, len(prompt_ids), dict(metrics))


# --- reading requests (server side) --------------------------------------------------------------


def request_object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise RequestFormatError("the request body must be a JSON object")
    return body


def prompt_ids(value: Any, field_name: str) -> list[int]:
    """A request's prompt: one non-empty list of token ids (no text, no batch)."""
    if isinstance(value, str):
        raise RequestFormatError(f"'{field_name}' is text; agentboost serve has no tokenizer: send token ids")
    if not isinstance(value, list) or not value:
        raise RequestFormatError(f"'{field_name}' must be a non-empty list of token ids")
    if any(isinstance(item, list) for item in value):
        raise RequestFormatError(f"'{field_name}' holds a batch; send one request per prompt")
    if any(isinstance(item, bool) or not isinstance(item, int) or item < 0 for item in value):
        raise RequestFormatError(f"'{field_name}' must hold non-negative integers")
    return list(value)


def check_fields(given: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    """Refuse fields outside the supported subset rather than silently ignoring them."""
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise RequestFormatError(
            f"{where}: agentboost serve does not support {unknown}; supported: {sorted(allowed)}"
        )


def check_neutral(given: Mapping[str, Any], neutral: Mapping[str, Any], where: str) -> None:
    """Fields the subset accepts only at their no-op value (penalties, min_p, ...)."""
    for name, value in neutral.items():
        if name in given and given[name] not in (None, value):
            raise RequestFormatError(
                f"{where}: {name}={given[name]!r} is not supported by agentboost serve (only {value!r})"
            )


def max_new_tokens_from_wire(value: Any, default: int) -> int:
    """A request's token budget (``default`` when absent): an integer >= 1, or RequestFormatError."""
    if value is None:
        return default
    try:
        return check_max_new_tokens(int(value))
    except (ConfigError, TypeError, ValueError) as error:
        raise RequestFormatError(f"invalid sampling parameters: {error}") from error


def sampling_from_wire(
    *, temperature: Any, top_p: Any, top_k: Any, stop_token_ids: Any, seed: Any
) -> SamplingParams:
    """SamplingParams from the wire's fields (``top_k`` -1 is "off", as 0 is in agentboost)."""
    try:
        return SamplingParams(
            temperature=float(1.0 if temperature is None else temperature),
            top_p=float(1.0 if top_p is None else top_p),
            top_k=0 if top_k in (None, -1) else int(top_k),
            stop_token_ids=tuple(stop_token_ids or ()),
            seed=None if seed is None else int(seed),
        )
    except (ConfigError, TypeError, ValueError) as error:
        raise RequestFormatError(f"invalid sampling parameters: {error}") from error


def wire_top_k(sampling: SamplingParams) -> int:
    """agentboost's ``top_k`` on the wire: SGLang and vLLM write "off" as -1, agentboost as 0."""
    return sampling.top_k if sampling.top_k > 0 else -1
