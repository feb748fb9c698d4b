"""Servers that go away: every server down ends requests within one shared budget, a restart within it
is ridden out, and a server that stops listening while holding requests open does not stall them.

Real sockets on loopback and ``agentboost serve`` (a deterministic fake engine); the same faults
against a real vLLM server are in ``test_vllm_real.py``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest
from aiohttp import web
from remote_support import GateEngine, dead_url, expected_ids, fast_retry, run

from agentboost.engines.base import SamplingParams
from agentboost.engines.factory import check_servers
from agentboost.engines.remote.sglang import SGLangEngine
from agentboost.engines.remote.transport import RetryPolicy
from agentboost.engines.servers.serve import start_server
from agentboost.errors import EngineConnectionError, ServersDownError

PROMPT = [5, 6, 7]
SAMPLING = SamplingParams(temperature=0.0)
BUDGET = 4


def test_when_every_server_is_down_all_requests_end_within_one_shared_budget_with_one_message(caplog):
    budget = 1.0
    policy = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.2, total_budget_s=60.0, down_budget_s=budget)

    async def scenario():
        engine = SGLangEngine([dead_url(), dead_url()], retry=policy, context_length=64)
        views = [engine.bind(f"rollout-{n}") for n in range(20)]
        assert engine.outage() is None  # nothing refused yet: a run does not stop
        started = time.monotonic()
        try:
            first = await asyncio.gather(
                *(v.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET) for v in views), return_exceptions=True
            )
            first_s = time.monotonic() - started
            started = time.monotonic()
            later = await asyncio.gather(
                *(v.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET) for v in views), return_exceptions=True
            )
            later_s = time.monotonic() - started
            stop = engine.outage()  # what a run stops with
        finally:
            await engine.aclose()
        assert isinstance(stop, ServersDownError) and "--server-down-timeout" in str(stop)
        assert all(url in str(stop) for url in engine.urls)
        return first, first_s, later, later_s

    with caplog.at_level(logging.WARNING, logger="agentboost"):
        first, first_s, later, later_s = run(scenario())
    assert all(isinstance(error, ServersDownError) for error in first + later)
    assert first_s < budget + 1.0  # one outage clock for all twenty, not a budget each
    assert later_s < 0.5  # once the budget is spent, a request gives up after one refused connection
    message = str(later[0])
    assert "every one of the 2 SGLang servers has refused connections" in message
    assert "Restart the server and resume the run" in message
    assert "moves from" not in caplog.text  # no rollout "moves" between dead servers


def test_a_server_restarted_within_the_budget_is_ridden_out():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.2, max_attempts=2, down_budget_s=20.0)

    async def scenario():
        engine = SGLangEngine(
            f"http://127.0.0.1:{port}", retry=policy, context_length=64, check_logprobs=False
        )

        async def restart_later():
            await asyncio.sleep(1.5)  # well past max_attempts=2: the outage budget is what counts
            return await start_server(GateEngine(), port=port)

        restart = asyncio.create_task(restart_later())
        try:
            generation = await engine.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
        finally:
            await engine.aclose()
            await (await restart).close()
        return generation

    generation = run(scenario())
    assert generation.token_ids == expected_ids(PROMPT, SAMPLING, BUDGET)
    assert generation.metrics["attempts"] > 2


@pytest.mark.parametrize("liveness_s", [0.2])
def test_a_server_that_stops_listening_but_holds_requests_open_does_not_stall_them(liveness_s):
    """vLLM on SIGTERM: the listener closes, accepted connections stay open and are never answered."""

    async def scenario():
        held: list[asyncio.StreamWriter] = []

        async def never_answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)

        listener = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        engine = SGLangEngine(
            f"http://127.0.0.1:{port}",
            retry=fast_retry(budget_s=60.0),
            read_timeout_s=600.0,
            context_length=64,
            down_budget_s=1.0,
        )
        engine._client.liveness_interval_s = liveness_s
        request = asyncio.create_task(engine.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET))
        while not held:
            await asyncio.sleep(0.01)
        listener.close()  # the listener goes; the accepted connection stays open, unanswered
        started = time.monotonic()
        try:
            with pytest.raises(EngineConnectionError) as caught:
                await request
        finally:
            await engine.aclose()
            for writer in held:
                writer.close()
        return caught.value, time.monotonic() - started

    error, elapsed = run(scenario(), timeout=30)
    assert elapsed < 5.0  # not the 600 s read timeout
    assert "refused connections" in str(error)


def test_a_run_waits_for_a_server_that_is_still_starting_and_says_so():
    """`serve-vllm ... &` then `rollout` at once: the port refuses connections, then /health answers
    503 while the model loads, then 200. The check waits through both, saying what it waits for."""
    url = dead_url()
    port = int(url.rsplit(":", 1)[1])
    statuses: list[int] = []

    async def health(_request: web.Request) -> web.Response:
        statuses.append(503 if len(statuses) < 2 else 200)
        return web.Response(status=statuses[-1])

    async def scenario():
        runner = web.AppRunner(web.Application())
        runner.app.router.add_get("/health", health)
        await runner.setup()

        async def start_late():
            await asyncio.sleep(1.5)
            await web.TCPSite(runner, "127.0.0.1", port).start()

        heard: list[str] = []
        starting = asyncio.create_task(start_late())
        began = time.monotonic()
        try:
            await check_servers("vllm", [url], wait_s=30.0, say=heard.append)
        finally:
            await starting
            await runner.cleanup()
        return heard, time.monotonic() - began

    heard, waited = run(scenario())
    assert statuses == [503, 503, 200]  # asked again while it loaded, done at the first 200
    assert waited > 1.5
    refused = f"waiting for the engine at {url} (cannot be reached (Connection refused)"
    assert heard and heard[0].startswith(refused)
    assert "of 30 s)" in heard[0]


def test_a_server_that_never_starts_ends_the_wait_with_a_typed_error_and_the_fix():
    url = dead_url()
    heard: list[str] = []
    began = time.monotonic()
    with pytest.raises(ServersDownError) as caught:
        run(check_servers("vllm", [url], wait_s=1.0, say=heard.append))
    assert 1.0 <= time.monotonic() - began < 10.0
    message = str(caught.value)
    refused = f"the vllm server at {url} cannot be reached (Connection refused) after waiting 1 s"
    assert message.startswith(refused)
    assert "agentboost serve-vllm" in message and "--server-down-timeout" in message
    assert len(heard) == 1  # one line at the start, then one every 10 s
