"""Shared pieces of the remote-engine tests: a gated fake engine, a stub server, fast retry policies."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from agentboost.engines.base import Generation, SamplingParams
from agentboost.engines.remote.transport import RetryPolicy

T = TypeVar("T")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BLOCK = 999
"""A prompt starting with this id waits in :class:`GateEngine` until its gate opens."""


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run ``coro`` in a fresh event loop; a hang fails the test instead of stalling the suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def fast_retry(budget_s: float = 5.0, attempts: int = 8) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=attempts, initial_backoff_s=0.01, max_backoff_s=0.05, total_budget_s=budget_s
    )


def load_fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def dead_url() -> str:
    """A loopback URL on which nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def expected_ids(prompt: Sequence[int], sampling: SamplingParams, max_new_tokens: int) -> list[int]:
    """What :class:`GateEngine` generates for ``prompt``: a pure function of the prompt."""
    ids = [(sum(prompt) * 7 + step * 13) % 97 + 3 for step in range(max_new_tokens)]
    for position, token in enumerate(ids):
        if token in sampling.stop_token_ids:
            return ids[: position + 1]
    return ids


class GateEngine:
    """A deterministic fake engine. Prompts that start with BLOCK wait until ``gate`` is set."""

    def __init__(self, context_length: int | None = 256) -> None:
        self._context_length = context_length
        self.gate = asyncio.Event()
        self.calls = 0
        self.waiting = 0

    @property
    def context_length(self) -> int | None:
        return self._context_length

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        self.calls += 1
        if prompt_ids and prompt_ids[0] == BLOCK:
            self.waiting += 1
            try:
                await self.gate.wait()
            finally:
                self.waiting -= 1
        ids = expected_ids(prompt_ids, sampling, max_new_tokens)
        finish = "stop" if ids and ids[-1] in sampling.stop_token_ids else "length"
        logprobs = [-((token % 11) + 1) / 8 for token in ids]
        return Generation(ids, logprobs, finish, len(prompt_ids))  # type: ignore[arg-type]

    async def aclose(self) -> None:
        return None


class StubServer:
    """Replays canned JSON answers per path and records the request bodies it received."""

    def __init__(self, routes: dict[str, list[tuple[int, Any]]]) -> None:
        self.routes = {path: list(answers) for path, answers in routes.items()}
        self.bodies: dict[str, list[Any]] = {path: [] for path in routes}
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        path = request.path
        if request.method == "POST":
            self.bodies[path].append(await request.json())
        else:
            self.bodies[path].append(None)
        answers = self.routes[path]
        status, payload = answers.pop(0) if len(answers) > 1 else answers[0]
        return web.json_response(payload, status=status)

    async def start(self) -> StubServer:
        app = web.Application()
        for path in self.routes:
            app.router.add_route("*", path, self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class ServerThread:
    """`agentboost serve` over a fresh engine in a background thread with its own event loop."""

    def __init__(self, engine_factory: Any, **server_kwargs: Any) -> None:
        self._engine_factory = engine_factory
        self._kwargs = server_kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.server: Any = None

    def __enter__(self) -> Any:
        from agentboost.engines.servers.serve import start_server

        self._thread.start()

        async def start() -> Any:
            return await start_server(self._engine_factory(), **self._kwargs)

        self.server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=10)
        return self.server

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
