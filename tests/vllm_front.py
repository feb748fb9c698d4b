"""A vLLM server's address with a recorder in front: what the trainer's two-server tests count with.

:class:`VLLMFront` listens on loopback and forwards every request to a backend (a real vLLM server, or
`agentboost serve`, which speaks vLLM's ``/v1/completions`` but has no weight-update endpoints), keeping
each request's path and body. With ``weight_endpoints=True`` it answers vLLM's development endpoints
(``/pause``, ``/collective_rpc``, ``/reset_prefix_cache``, ``/resume``) itself, as a server started with
``VLLM_SERVER_DEV_MODE=1`` does; ``refuse`` answers one of them HTTP 404, as a server without it does.

:func:`requests_per_rollout` maps the completion requests back to the rollouts of a training step's
results file: a rollout's turn ``t`` samples with seed ``job_seed + t``, and the file's header records
the step's seed base (its RunSpec identity).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, web

from agentboost.agent.limits import RolloutLimits
from agentboost.envs.base import Environment, Task
from agentboost.rollout.results import identify, read_results
from agentboost.rollout.runner import job_seed

WEIGHT_PATHS = ("/pause", "/collective_rpc", "/reset_prefix_cache", "/resume")


class LoopThread:
    """An event loop in a daemon thread, for servers the test's own (blocking) code talks to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> LoopThread:
        self._thread.start()
        return self

    def call(self, coroutine: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def __exit__(self, *_: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class VLLMFront:
    """Forwards to ``backend`` and records ``(path with query, JSON body)`` of every request."""

    def __init__(self, backend: str, *, weight_endpoints: bool = False, refuse: str | None = None) -> None:
        self.backend = backend.rstrip("/")
        self.weight_endpoints = weight_endpoints
        self.refuse = refuse
        self.calls: list[tuple[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]

    def completions(self) -> list[dict[str, Any]]:
        return [body for path, body in self.calls if path.startswith("/v1/completions")]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.calls.append((request.path_qs, json.loads(raw) if raw else None))
        if request.path == self.refuse:
            return web.json_response({"detail": "Not Found"}, status=404)
        if self.weight_endpoints and request.path in WEIGHT_PATHS:
            return web.json_response({"results": [None]} if request.path == "/collective_rpc" else {})
        assert self._session is not None
        async with self._session.request(
            request.method,
            self.backend + request.path_qs,
            data=raw or None,
            headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
        ) as answer:
            body = await answer.read()
            return web.Response(body=body, status=answer.status, content_type=answer.content_type)

    async def start(self) -> VLLMFront:
        self._session = ClientSession()
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


class Chatty(Environment):
    """A conversation: the user answers each reply with "Go on.", ``user_turns`` times for sample 0 and
    once more for each later sample, so rollouts run different numbers of turns (reward: the sample's
    parity, so every group carries a signal and each step updates the weights)."""

    name = "chatty"
    system_prompt = "Reply with one short sentence."
    template = "qwen3"

    def __init__(self, user_turns: int = 2, max_new_tokens: int = 16, samples: int = 2) -> None:
        self.user_turns = user_turns
        # turns to spare: a rollout ends because the user stops, not at a limit
        self.limits = RolloutLimits(max_turns=user_turns + samples + 1, max_new_tokens=max_new_tokens)

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        return [Task(f"{split}-{index}", f"Tell me about the number {index}.") for index in range(n or 8)]

    async def next_user_message(self, episode: Any, messages: list[Any]) -> str | None:
        replies = sum(1 for message in messages if message["role"] == "assistant")
        return "Go on." if replies <= self.user_turns + episode.sample else None

    def reward(self, trajectory: Any, episode: Any) -> float:
        return float(episode.sample % 2)


def requests_per_rollout(step_file: Path, fronts: list[VLLMFront]) -> dict[tuple[str, int], dict[str, int]]:
    """``(task_id, sample) -> {server url: completion requests}`` for the rollouts of one step's file."""
    base = identify(step_file)["run"]["seed"]
    owner: dict[int, tuple[str, int]] = {}
    for result in read_results(step_file):
        first = job_seed(base, result.task_id, result.sample)
        for turn in range(int(result.trajectory.metrics["turns"])):
            owner[first + turn] = (result.task_id, result.sample)
    counts: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for front in fronts:
        for body in front.completions():
            key = owner.get(body.get("seed"))
            if key is not None:
                counts[key][front.url] += 1
    return {key: dict(servers) for key, servers in counts.items()}
