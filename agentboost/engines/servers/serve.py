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

The bodies are :mod:`agentboost.engines.remote.wire`'s (the same module the clients use); faults for testing
clients come from :mod:`agentboost.engines.servers.faults`; the command line is
:mod:`agentboost.engines.servers.serve_command`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from aiohttp import web

from agentboost.engines.base import Engine
from agentboost.engines.remote.wire import sglang as sglang_wire
from agentboost.engines.remote.wire import vllm as vllm_wire
from agentboost.engines.servers import faults as fault_kinds
from agentboost.engines.servers.faults import FaultConfig, FaultInjector
from agentboost.errors import (
    ConfigError,
    ContextLengthError,
    EngineError,
    EngineOverloadedError,
    RequestFormatError,
)

logger = logging.getLogger(__name__)


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
    injector = FaultInjector(faults)
    created = int(time.time())

    def context() -> int | None:
        return context_length if context_length is not None else engine.context_length

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": model_name})

    async def model_info(request: web.Request) -> web.Response:
        stats.requests[request.path] += 1
        return web.json_response(sglang_wire.model_info(model_name, context()))

    async def models(request: web.Request) -> web.Response:
        stats.requests[request.path] += 1
        return web.json_response(vllm_wire.model_list(model_name, context(), created))

    async def generate(request: web.Request, wire: ModuleType) -> web.StreamResponse:
        stats.requests[request.path] += 1
        peer = request.transport.get_extra_info("peername") if request.transport else None
        stats.clients[f"{peer[0]}:{peer[1]}" if peer else "?"] += 1
        fault = injector.next_fault()
        if fault is not None:
            stats.faults[fault] += 1
        if fault == "drop":
            fault_kinds.drop(request)
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
                await asyncio.sleep(injector.slow_delay_s)
            served = wire.read_request(body, context_length=context(), model_name=model_name)
            started = time.perf_counter()
            generated = await engine.generate(
                served.prompt_ids, served.sampling, max_new_tokens=served.max_new_tokens
            )
            elapsed = time.perf_counter() - started
        except RequestFormatError as error:
            return _error(wire, str(error), error.status)
        except ContextLengthError as error:
            return _error(wire, str(error), 400)
        except EngineOverloadedError as error:
            return _error(wire, str(error), 429)
        except EngineError as error:
            logger.exception("engine failed a request")
            return _error(wire, f"engine error: {error}", 500)
        except asyncio.CancelledError:
            stats.cancelled += 1
            raise
        finally:
            stats.in_flight -= 1
        stats.generations += 1
        payload = wire.build_response(
            served, generated, elapsed_s=elapsed, model_name=model_name, request_id=uuid.uuid4().hex
        )
        data = json.dumps(payload, separators=(",", ":")).encode()
        if fault == "malformed":
            return fault_kinds.malformed(data)
        if fault == "truncated":
            return await fault_kinds.truncated(request, data)
        return web.Response(body=data, content_type="application/json")

    async def sglang_generate(request: web.Request) -> web.StreamResponse:
        return await generate(request, sglang_wire)

    async def vllm_completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, vllm_wire)

    app = web.Application()
    app[STATS_KEY] = stats
    app.router.add_get("/health", health)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get(vllm_wire.MODELS_PATH, models)
    app.router.add_post(sglang_wire.GENERATE_PATH, sglang_generate)
    app.router.add_post(vllm_wire.COMPLETIONS_PATH, vllm_completions)
    return app


def _error(
    wire: ModuleType, message: str, status: int, headers: dict[str, str] | None = None
) -> web.Response:
    """An error answer in the wire format of the endpoint (SGLang or vLLM/OpenAI)."""
    return web.json_response(wire.error_body(message, status), status=status, headers=headers)


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
