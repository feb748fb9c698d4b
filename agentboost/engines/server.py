"""`agentboost serve`: any Engine behind the SGLang and vLLM wire formats the remote clients speak.

It lets a laptop run the remote path end to end (``agentboost serve`` in one terminal,
``--engine sglang --url http://127.0.0.1:30000`` in another), and it is what the clients' tests talk
to over loopback. Endpoints (token ids in, ids and log-probabilities out; no tokenizer, so no text):

* ``POST /generate``: the SGLang native subset (``input_ids``, ``sampling_params``,
  ``return_logprob``); answers ``output_ids`` and ``meta_info`` as SGLang does.
* ``POST /v1/completions``: the vLLM subset (``prompt`` as token ids, ``logprobs`` 0,
  ``return_token_ids``, ``return_tokens_as_token_ids``); ``logprobs.tokens`` are always
  ``"token_id:<id>"`` strings.
* ``GET /model_info``, ``/get_model_info`` (SGLang, plus ``context_length``), ``GET /v1/models``
  (vLLM, with ``max_model_len``) and ``GET /health``.

Anything the subset does not cover (text prompts, batches, streaming, penalties, prompt logprobs)
is refused with HTTP 400 rather than silently ignored. Context limits follow each server's rule.
The engine stops only at the requested stop ids, so ``ignore_eos`` has no effect here.

Fault injection (tests, demos of the clients' retries): a :class:`FaultConfig` makes generation
requests fail with HTTP 500, 429 or 400, answer slowly, drop the connection without an answer, or
send malformed JSON or a truncated body, by probability or by a deterministic schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agentboost.engines.base import Engine, Generation, SamplingParams
from agentboost.errors import (
    AgentBoostError,
    ConfigError,
    ContextLengthError,
    EngineError,
    EngineOverloadedError,
)

logger = logging.getLogger(__name__)

FAULT_KINDS = ("http_500", "http_429", "http_400", "slow", "drop", "malformed", "truncated")
"""What a :class:`FaultConfig` can inject. ``slow`` delays a correct answer by ``slow_delay_s``;
``drop`` closes the connection without answering; ``malformed`` sends a complete HTTP answer whose
JSON is invalid; ``truncated`` declares the full length and sends half the body."""


@dataclass(frozen=True)
class FaultConfig:
    """Which generation requests fail, and how.

    The n-th generation request (counted across ``/generate`` and ``/v1/completions``) gets
    ``schedule[n]`` while the schedule lasts (``None`` or ``"ok"``: no fault); after it, each request
    draws a fault from ``probabilities`` (kind -> probability, summing to at most 1) with ``seed``.
    """

    schedule: Sequence[str | None] = ()
    probabilities: Mapping[str, float] = field(default_factory=dict)
    slow_delay_s: float = 5.0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", tuple(None if k in (None, "ok") else k for k in self.schedule))
        object.__setattr__(self, "probabilities", dict(self.probabilities))
        for kind in [*self.schedule, *self.probabilities]:
            if kind is not None and kind not in FAULT_KINDS:
                raise ConfigError(f"unknown fault {kind!r}; choose from {', '.join(FAULT_KINDS)} (or 'ok')")
        if any(p < 0 for p in self.probabilities.values()) or sum(self.probabilities.values()) > 1 + 1e-9:
            raise ConfigError(
                f"fault probabilities must be >= 0 and sum to at most 1, got {self.probabilities}"
            )
        if self.slow_delay_s < 0:
            raise ConfigError(f"slow_delay_s must be >= 0, got {self.slow_delay_s}")


class _FaultInjector:
    def __init__(self, config: FaultConfig | None) -> None:
        self.config = config
        self._rng = random.Random(config.seed if config else 0)
        self._count = 0

    def next_fault(self) -> str | None:
        config = self.config
        if config is None:
            return None
        index = self._count
        self._count += 1
        if index < len(config.schedule):
            return config.schedule[index]
        draw = self._rng.random()
        for kind, probability in config.probabilities.items():
            if draw < probability:
                return kind
            draw -= probability
        return None


@dataclass
class ServerStats:
    """What the server saw: for tests, benchmarks and the curious."""

    requests: Counter[str] = field(default_factory=Counter)
    """Requests per path, faulty ones included."""
    generations: int = 0
    """Generations answered successfully."""
    faults: Counter[str] = field(default_factory=Counter)
    cancelled: int = 0
    """Generation handlers cancelled because the client went away."""
    in_flight: int = 0
    max_in_flight: int = 0
    clients: Counter[str] = field(default_factory=Counter)
    """Generation requests per client address (host:port): one entry per connection used."""
    record_bodies: bool = False
    bodies: list[dict[str, Any]] = field(default_factory=list)
    """Generation request bodies as received, when ``record_bodies``."""


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


STATS_KEY = web.AppKey("agentboost_stats", ServerStats)


def build_app(
    engine: Engine,
    *,
    model_name: str,
    context_length: int | None = None,
    faults: FaultConfig | None = None,
) -> web.Application:
    """An aiohttp application serving ``engine``. ``context_length`` defaults to the engine's."""
    stats = ServerStats()
    injector = _FaultInjector(faults)
    created = int(time.time())

    def context() -> int | None:
        return context_length if context_length is not None else engine.context_length

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": model_name})

    async def model_info(request: web.Request) -> web.Response:
        stats.requests[request.path] += 1
        return web.json_response(
            {
                "model_path": model_name,
                "tokenizer_path": model_name,
                "is_generation": True,
                "context_length": context(),
            }
        )

    async def models(request: web.Request) -> web.Response:
        stats.requests[request.path] += 1
        card = {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "agentboost",
            "root": model_name,
            "parent": None,
            "max_model_len": context(),
        }
        return web.json_response({"object": "list", "data": [card]})

    async def generate(request: web.Request, wire: str) -> web.StreamResponse:
        stats.requests[request.path] += 1
        peer = request.transport.get_extra_info("peername") if request.transport else None
        stats.clients[f"{peer[0]}:{peer[1]}" if peer else "?"] += 1
        fault = injector.next_fault()
        if fault is not None:
            stats.faults[fault] += 1
        if fault == "drop":
            _drop(request)
            return web.Response()
        if fault == "http_500":
            return _error(wire, "injected fault: internal server error", 500)
        if fault == "http_429":
            return _error(wire, "injected fault: too many requests", 429, headers={"Retry-After": "0"})
        if fault == "http_400":
            return _error(wire, "injected fault: bad request", 400)
        try:
            body = await request.json()
        except ValueError as error:
            return _error(wire, f"request body is not valid JSON: {error}", 400)
        if stats.record_bodies:
            stats.bodies.append(body)
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        try:
            if fault == "slow":
                await asyncio.sleep(faults.slow_delay_s if faults else 0.0)
            if wire == "sglang":
                payload = await _serve_sglang(engine, body, context())
            else:
                payload = await _serve_vllm(engine, body, context(), model_name)
        except _BadRequest as error:
            return _error(wire, str(error), error.status)
        except asyncio.CancelledError:
            stats.cancelled += 1
            raise
        finally:
            stats.in_flight -= 1
        stats.generations += 1
        data = json.dumps(payload, separators=(",", ":")).encode()
        if fault == "malformed":
            return web.Response(body=b"{" + data[1:-1] + b",}", content_type="application/json")
        if fault == "truncated":
            return await _truncated(request, data)
        return web.Response(body=data, content_type="application/json")

    async def sglang_generate(request: web.Request) -> web.StreamResponse:
        return await generate(request, "sglang")

    async def vllm_completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, "vllm")

    app = web.Application()
    app[STATS_KEY] = stats
    app.router.add_get("/health", health)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/generate", sglang_generate)
    app.router.add_post("/v1/completions", vllm_completions)
    return app


def _error(wire: str, message: str, status: int, headers: Mapping[str, str] | None = None) -> web.Response:
    """An error answer in the wire format of the endpoint (SGLang or vLLM/OpenAI)."""
    if wire == "vllm":
        kind = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError"}.get(
            status, "InternalServerError"
        )
        error: dict[str, Any] = {"message": message, "type": kind, "param": None, "code": status}
    else:
        error = {"message": message}
    return web.json_response({"error": error}, status=status, headers=headers)


def _drop(request: web.Request) -> None:
    """Close the connection without sending anything."""
    transport = request.transport
    if transport is not None:
        transport.close()


async def _truncated(request: web.Request, data: bytes) -> web.StreamResponse:
    """Declare the full body length, send half of it, then close the connection."""
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    response.content_length = len(data)
    await response.prepare(request)
    await response.write(data[: len(data) // 2])
    _drop(request)
    return response


# --- wire formats ----------------------------------------------------------------------------


def _token_ids(value: Any, field_name: str) -> list[int]:
    if isinstance(value, str):
        raise _BadRequest(f"'{field_name}' is text; agentboost serve has no tokenizer: send token ids")
    if not isinstance(value, list) or not value:
        raise _BadRequest(f"'{field_name}' must be a non-empty list of token ids")
    if any(isinstance(item, list) for item in value):
        raise _BadRequest(f"'{field_name}' holds a batch; send one request per prompt")
    if any(isinstance(item, bool) or not isinstance(item, int) or item < 0 for item in value):
        raise _BadRequest(f"'{field_name}' must hold non-negative integers")
    return list(value)


def _check_fields(given: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise _BadRequest(
            f"{where}: agentboost serve does not support {unknown}; supported: {sorted(allowed)}"
        )


def _check_neutral(given: Mapping[str, Any], neutral: Mapping[str, Any], where: str) -> None:
    """Fields the subset accepts only at their no-op value (penalties, min_p, ...)."""
    for name, value in neutral.items():
        if name in given and given[name] not in (None, value):
            raise _BadRequest(
                f"{where}: {name}={given[name]!r} is not supported by agentboost serve (only {value!r})"
            )


def _sampling(
    *, temperature: Any, top_p: Any, top_k: Any, max_new_tokens: Any, stop_token_ids: Any, seed: Any
) -> SamplingParams:
    try:
        return SamplingParams(
            temperature=float(1.0 if temperature is None else temperature),
            top_p=float(1.0 if top_p is None else top_p),
            top_k=0 if top_k in (None, -1) else int(top_k),
            max_new_tokens=int(max_new_tokens),
            stop_token_ids=tuple(stop_token_ids or ()),
            seed=None if seed is None else int(seed),
        )
    except (ConfigError, TypeError, ValueError) as error:
        raise _BadRequest(f"invalid sampling parameters: {error}") from error


async def _run_engine(
    engine: Engine, prompt: list[int], sampling: SamplingParams
) -> tuple[Generation, float]:
    started = time.perf_counter()
    try:
        generation = await engine.generate(prompt, sampling)
    except ContextLengthError as error:
        raise _BadRequest(str(error)) from error
    except EngineOverloadedError as error:
        raise _BadRequest(str(error), status=429) from error
    except EngineError as error:
        logger.exception("engine failed a request")
        raise _BadRequest(f"engine error: {error}", status=500) from error
    return generation, time.perf_counter() - started


_SGLANG_TOP = {
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
_SGLANG_SAMPLING = {
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
_SGLANG_NEUTRAL = {
    "n": 1,
    "min_p": 0.0,
    "min_new_tokens": 0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "stop": [],
}


async def _serve_sglang(engine: Engine, body: Any, context_length: int | None) -> dict[str, Any]:
    """Answer one SGLang ``/generate`` request."""
    if not isinstance(body, dict):
        raise _BadRequest("the request body must be a JSON object")
    _check_fields(body, _SGLANG_TOP, "/generate")
    if body.get("text") is not None:
        raise _BadRequest(
            "'text' prompts need a tokenizer, which agentboost serve does not have: send input_ids"
        )
    if body.get("stream"):
        raise _BadRequest("streaming is not supported by agentboost serve")
    if body.get("top_logprobs_num"):
        raise _BadRequest("top_logprobs_num is not supported by agentboost serve")
    prompt = _token_ids(body.get("input_ids"), "input_ids")
    start = body.get("logprob_start_len")
    if start is not None and start != -1 and start < len(prompt):
        raise _BadRequest("prompt log-probabilities are not supported: use logprob_start_len=-1")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise _BadRequest("'sampling_params' must be a JSON object")
    _check_fields(params, _SGLANG_SAMPLING, "/generate sampling_params")
    _check_neutral(params, _SGLANG_NEUTRAL, "/generate sampling_params")
    max_new = params.get("max_new_tokens", 128)
    if context_length is not None:
        if len(prompt) >= context_length:
            raise _BadRequest(
                f"The input ({len(prompt)} tokens) is longer than the model's context length "
                f"({context_length} tokens)."
            )
        if max_new is not None and len(prompt) + int(max_new) >= context_length:
            raise _BadRequest(
                "Requested token count exceeds the model's maximum context length of "
                f"{context_length} tokens. You requested a total of {len(prompt) + int(max_new)} tokens: "
                f"{len(prompt)} tokens from the input and {max_new} tokens for the completion."
            )
    sampling = _sampling(
        temperature=params.get("temperature"),
        top_p=params.get("top_p"),
        top_k=params.get("top_k"),
        max_new_tokens=max_new if max_new is not None else 128,
        stop_token_ids=params.get("stop_token_ids"),
        seed=params.get("sampling_seed"),
    )
    generation, elapsed = await _run_engine(engine, prompt, sampling)
    ids = generation.token_ids
    if generation.finish_reason == "stop":
        finish: dict[str, Any] = {"type": "stop", "matched": ids[-1]}
    else:
        finish = {"type": "length", "length": len(ids)}
    meta: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "finish_reason": finish,
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "e2e_latency": elapsed,
    }
    if body.get("return_logprob"):
        meta["output_token_logprobs"] = [
            [lp, token, None] for lp, token in zip(generation.logprobs, ids, strict=True)
        ]
    return {"text": "", "output_ids": ids, "meta_info": meta}


_VLLM_FIELDS = {
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
_VLLM_NEUTRAL = {
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


async def _serve_vllm(
    engine: Engine, body: Any, context_length: int | None, model_name: str
) -> dict[str, Any]:
    """Answer one vLLM ``/v1/completions`` request."""
    if not isinstance(body, dict):
        raise _BadRequest("the request body must be a JSON object")
    _check_fields(body, _VLLM_FIELDS, "/v1/completions")
    _check_neutral(body, _VLLM_NEUTRAL, "/v1/completions")
    model = body.get("model")
    if model is not None and model != model_name:
        raise _BadRequest(f"The model `{model}` does not exist.", status=404)
    prompt = _token_ids(body.get("prompt"), "prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None and logprobs != 0:
        raise _BadRequest(
            "only logprobs=0 (the sampled token's log-probability) is supported by agentboost serve"
        )
    max_tokens = body.get("max_tokens")
    max_tokens = 16 if max_tokens is None else int(max_tokens)
    if context_length is not None and len(prompt) + max_tokens > context_length:
        raise _BadRequest(
            f"This model's maximum context length is {context_length} tokens. However, you requested "
            f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion."
        )
    sampling = _sampling(
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        top_k=body.get("top_k"),
        max_new_tokens=max_tokens,
        stop_token_ids=body.get("stop_token_ids"),
        seed=body.get("seed"),
    )
    generation, _elapsed = await _run_engine(engine, prompt, sampling)
    ids = generation.token_ids
    choice: dict[str, Any] = {
        "index": 0,
        "text": "",
        "logprobs": None,
        "finish_reason": generation.finish_reason,
        "stop_reason": ids[-1] if generation.finish_reason == "stop" else None,
        "token_ids": ids if body.get("return_token_ids") else None,
        "prompt_token_ids": prompt if body.get("return_token_ids") else None,
        "prompt_logprobs": None,
    }
    if logprobs is not None:
        tokens = [f"token_id:{token}" for token in ids]
        choice["logprobs"] = {
            "text_offset": [0] * len(ids),
            "token_logprobs": list(generation.logprobs),
            "tokens": tokens,
            "top_logprobs": [{token: lp} for token, lp in zip(tokens, generation.logprobs, strict=True)],
        }
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": generation.prompt_tokens,
            "completion_tokens": len(ids),
            "total_tokens": generation.prompt_tokens + len(ids),
        },
    }


# --- running it --------------------------------------------------------------------------------


@dataclass
class RunningServer:
    """A started server: ``url`` to point clients at, ``stats`` to look at, ``close()`` to stop it."""

    url: str
    app: web.Application
    runner: web.AppRunner

    @property
    def stats(self) -> ServerStats:
        return self.app[STATS_KEY]

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_server(
    engine: Engine,
    *,
    model_name: str = "agentboost",
    context_length: int | None = None,
    faults: FaultConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> RunningServer:
    """Start serving ``engine`` in the running event loop; ``port=0`` picks a free port.

    Handlers are cancelled when their client disconnects, so a cancelled rollout stops the
    generation it was waiting for. The engine is not closed by ``close()``.
    """
    app = build_app(engine, model_name=model_name, context_length=context_length, faults=faults)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {error}. Pick another --port or --host."
        ) from error
    bound_host, bound_port = runner.addresses[0][:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return RunningServer(url=f"http://{shown}:{bound_port}", app=app, runner=runner)


async def serve_forever(engine: Engine, *, ready: asyncio.Event | None = None, **kwargs: Any) -> None:
    """Serve until cancelled or until SIGINT/SIGTERM; prints the URL once listening."""
    server = await start_server(engine, **kwargs)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    context = kwargs.get("context_length") or engine.context_length
    print(f"agentboost serve: listening on {server.url} (context length {context})", flush=True)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await server.close()


# --- command line ------------------------------------------------------------------------------


def register_serve_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to an argparse ``subparsers`` object; ``args.func(args)`` runs it."""
    from agentboost.cli_args import count, number, port, probability

    parser = subparsers.add_parser(
        "serve",
        help="serve a model over HTTP in the SGLang /generate and vLLM /v1/completions wire formats",
        description=(
            "Serve a model with the embedded transformers engine, speaking the subset of the SGLang "
            "and vLLM wire formats that agentboost's remote engines use (token ids in, ids and "
            "log-probabilities out), plus GET /health."
        ),
    )
    parser.add_argument(
        "--model", default=None, help="model directory or hub id (default: the embedded default model)"
    )
    parser.add_argument(
        "--served-model-name", default=None, help="name reported by /v1/models (default: --model)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=port, default=30000, help="port to listen on (default: 30000)")
    parser.add_argument(
        "--context-length",
        type=count(1),
        default=None,
        help="context length to report (default: the model's)",
    )
    faults = parser.add_argument_group("fault injection (for testing clients)")
    for kind in FAULT_KINDS:
        faults.add_argument(
            f"--fault-{kind.replace('_', '-')}",
            type=probability,
            default=0.0,
            metavar="P",
            dest=f"fault_{kind}",
            help=f"probability that a generation request gets fault {kind!r}",
        )
    faults.add_argument(
        "--fault-schedule",
        default="",
        metavar="LIST",
        help="comma-separated faults for the first generation requests, e.g. 'http_500,ok,drop' "
        f"(kinds: {', '.join(FAULT_KINDS)})",
    )
    faults.add_argument(
        "--fault-slow-delay", type=number(minimum=0), default=5.0, metavar="S", help="delay of 'slow' (s)"
    )
    faults.add_argument("--fault-seed", type=int, default=0, help="seed of the fault draws")
    parser.set_defaults(func=run_serve)
    return parser


def faults_from_args(args: argparse.Namespace) -> FaultConfig | None:
    """The FaultConfig the ``--fault-*`` options describe, or None when they describe none."""
    probabilities = {
        kind: getattr(args, f"fault_{kind}") for kind in FAULT_KINDS if getattr(args, f"fault_{kind}")
    }
    schedule = [item.strip() for item in args.fault_schedule.split(",") if item.strip()]
    if not probabilities and not schedule:
        return None
    return FaultConfig(
        schedule=schedule,
        probabilities=probabilities,
        slow_delay_s=args.fault_slow_delay,
        seed=args.fault_seed,
    )


def run_serve(args: argparse.Namespace) -> int:
    """The ``serve`` command: load the model, serve until interrupted. Returns the exit status."""
    try:
        faults = faults_from_args(args)
        from agentboost.engines.local import LocalEngine
        from agentboost.engines.models import DEFAULT_MODEL

        model = args.model or DEFAULT_MODEL
        engine = LocalEngine.from_pretrained(model)
    except AgentBoostError as error:
        print(f"agentboost serve: {error}", file=sys.stderr)
        return 2
    name = args.served_model_name or model

    async def main() -> None:
        try:
            await serve_forever(
                engine,
                model_name=name,
                context_length=args.context_length,
                faults=faults,
                host=args.host,
                port=args.port,
            )
        finally:
            await engine.aclose()

    try:
        asyncio.run(main())
    except ConfigError as error:
        print(f"agentboost serve: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
