"""The shared client core, over real loopback HTTP against `agentboost serve` with injected faults.

Each fault ends as documented: retried and recovered where retryable, a typed error otherwise, and
never later than the retry budget allows.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from remote_support import BLOCK, GateEngine, ServerThread, dead_url, expected_ids, fast_retry, run

from agentboost.engines.base import Engine, Generation, RolloutKey, SamplingParams, bound
from agentboost.engines.remote.engine import RemoteEngine
from agentboost.engines.remote.sglang import SGLangEngine
from agentboost.engines.remote.transport import RetryPolicy, normalize_urls
from agentboost.engines.remote.vllm import VLLMEngine
from agentboost.engines.servers.faults import FaultConfig
from agentboost.engines.servers.serve import start_server
from agentboost.errors import (
    ConfigError,
    ContextLengthError,
    EngineConnectionError,
    EngineError,
    EngineOverloadedError,
    EngineRateLimitedError,
    EngineRequestError,
    EngineResponseError,
    EngineServerError,
    EngineTimeoutError,
)

ENGINES = [SGLangEngine, VLLMEngine]
SAMPLING = SamplingParams(temperature=0.0, stop_token_ids=(50,))
BUDGET = 12
PROMPT = [1, 2, 3, 4]


def _make(engine_class: type[RemoteEngine], urls: str | list[str], **kwargs: object) -> RemoteEngine:
    kwargs.setdefault("retry", fast_retry())
    return engine_class(urls, **kwargs)  # type: ignore[arg-type]


def _generation_path(engine_class: type[RemoteEngine]) -> str:
    return engine_class.generate_path


# --- retryable faults recover ------------------------------------------------------------------


@pytest.mark.parametrize("engine_class", ENGINES)
@pytest.mark.parametrize("fault", ["http_500", "http_429", "drop", "malformed", "truncated", "slow"])
def test_retryable_fault_is_retried_and_the_request_recovers(engine_class, fault):
    async def scenario():
        engine = GateEngine()
        server = await start_server(engine, faults=FaultConfig(schedule=[fault], slow_delay_s=5.0))
        client = _make(engine_class, server.url, read_timeout_s=0.3)
        try:
            generation = await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
        finally:
            await client.aclose()
            await server.close()
        return generation, server.stats

    generation, stats = run(scenario())
    assert generation.token_ids == expected_ids(PROMPT, SAMPLING, BUDGET)
    assert generation.metrics["attempts"] == 2
    assert stats.faults[fault] == 1
    assert stats.requests[_generation_path(engine_class)] == 2


# --- persistent faults end in typed errors, within the budget ---------------------------------

PERSISTENT = [
    ("http_500", EngineServerError),
    ("http_429", EngineRateLimitedError),
    ("drop", EngineConnectionError),
    ("malformed", EngineResponseError),
    ("truncated", EngineResponseError),
    ("slow", EngineTimeoutError),
]


@pytest.mark.parametrize("engine_class", ENGINES)
@pytest.mark.parametrize(("fault", "error_class"), PERSISTENT)
def test_persistent_fault_ends_in_a_typed_error_within_the_budget(engine_class, fault, error_class):
    budget = 0.6

    async def scenario():
        server = await start_server(
            GateEngine(), faults=FaultConfig(probabilities={fault: 1.0}, slow_delay_s=5.0)
        )
        client = _make(engine_class, server.url, read_timeout_s=0.15, retry=fast_retry(budget, attempts=1000))
        started = time.monotonic()
        try:
            with pytest.raises(error_class) as caught:
                await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
        finally:
            elapsed = time.monotonic() - started
            await client.aclose()
            await server.close()
        return caught.value, elapsed, server.stats

    error, elapsed, stats = run(scenario())
    assert elapsed <= budget + 0.5
    assert error.attempts >= 2 and error.attempts == stats.requests[_generation_path(engine_class)]
    assert error.url is not None and "total_budget_s" in str(error)
    if fault == "http_429":
        assert isinstance(error, EngineOverloadedError)


def test_max_attempts_bounds_the_number_of_requests():
    async def scenario():
        server = await start_server(GateEngine(), faults=FaultConfig(probabilities={"http_500": 1.0}))
        client = _make(SGLangEngine, server.url, retry=fast_retry(10.0, attempts=3))
        try:
            with pytest.raises(EngineServerError) as caught:
                await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
        finally:
            await client.aclose()
            await server.close()
        return caught.value, server.stats

    error, stats = run(scenario())
    assert error.attempts == 3 and error.status == 500
    assert stats.requests["/generate"] == 3
    assert "max_attempts" in str(error) and "Check the server's log" in str(error)


@pytest.mark.parametrize("engine_class", ENGINES)
def test_other_4xx_is_not_retried(engine_class):
    async def scenario():
        server = await start_server(GateEngine(), faults=FaultConfig(schedule=["http_400"]))
        client = _make(engine_class, server.url)
        try:
            with pytest.raises(EngineRequestError) as caught:
                await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
        finally:
            await client.aclose()
            await server.close()
        return caught.value, server.stats

    error, stats = run(scenario())
    assert error.status == 400 and error.attempts == 1
    assert stats.requests[_generation_path(engine_class)] == 1
    assert "Not retried" in str(error)


def test_unknown_vllm_model_is_a_request_error_naming_the_served_models():
    async def scenario():
        server = await start_server(GateEngine(), model_name="served-model")
        client = _make(VLLMEngine, server.url, model="other-model")
        try:
            with pytest.raises(EngineRequestError) as caught:
                await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
        finally:
            await client.aclose()
            await server.close()
        return caught.value, server.stats

    error, stats = run(scenario())
    assert "served-model" in str(error) and "other-model" in str(error)
    assert stats.requests["/v1/completions"] == 0  # refused before any generation request


@pytest.mark.parametrize("engine_class", ENGINES)
def test_unreachable_server_is_a_connection_error_within_the_budget(engine_class):
    budget = 0.5

    async def scenario():
        client = _make(engine_class, dead_url(), retry=fast_retry(budget, attempts=1000), context_length=64)
        started = time.monotonic()
        try:
            with pytest.raises(EngineConnectionError) as caught:
                await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
        finally:
            await client.aclose()
        return caught.value, time.monotonic() - started

    error, elapsed = run(scenario())
    assert elapsed <= budget + 0.5
    assert error.attempts >= 2
    assert "could not connect" in str(error) and "is running" in str(error)


def test_a_run_with_random_faults_never_crashes_and_every_request_recovers():
    """50 concurrent requests against a server that fails 40% of them in every way it can."""
    faults = FaultConfig(
        probabilities={"http_500": 0.1, "http_429": 0.1, "drop": 0.1, "malformed": 0.05, "truncated": 0.05},
        seed=3,
    )
    prompts = [[n, n + 1, n + 2] for n in range(1, 51)]

    async def scenario():
        server = await start_server(GateEngine(), faults=faults)
        clients = [
            _make(SGLangEngine, server.url, retry=fast_retry(20.0, attempts=30)),
            _make(VLLMEngine, server.url, retry=fast_retry(20.0, attempts=30)),
        ]
        try:
            results = await asyncio.gather(
                *(
                    clients[i % 2].generate(prompt, SAMPLING, max_new_tokens=BUDGET)
                    for i, prompt in enumerate(prompts)
                ),
                return_exceptions=True,
            )
        finally:
            for client in clients:
                await client.aclose()
            await server.close()
        return results, server.stats

    results, stats = run(scenario(), timeout=60)
    assert all(isinstance(r, Generation) for r in results), [
        r for r in results if not isinstance(r, Generation)
    ]
    assert [r.token_ids for r in results] == [expected_ids(p, SAMPLING, BUDGET) for p in prompts]
    assert sum(stats.faults.values()) >= 10  # the faults really happened
    assert stats.generations >= len(prompts)


# --- context length --------------------------------------------------------------------------


@pytest.mark.parametrize(("engine_class", "room", "usable"), [(SGLangEngine, 5, 15), (VLLMEngine, 6, 16)])
def test_max_new_tokens_is_clamped_to_the_servers_context(engine_class, room, usable):
    """SGLang needs prompt + max_new_tokens < its context length, vLLM <= (both servers' rules)."""
    prompt = list(range(1, 11))
    sampling = SamplingParams(temperature=0.0, stop_token_ids=())

    async def scenario():
        server = await start_server(GateEngine(), context_length=16)
        client = _make(engine_class, server.url)
        try:
            generation = await client.generate(prompt, sampling, max_new_tokens=100)
        finally:
            await client.aclose()
            await server.close()
        return client, generation

    client, generation = run(scenario())
    assert client.context_length == usable
    assert len(generation.token_ids) == room and generation.finish_reason == "length"


@pytest.mark.parametrize(("engine_class", "prompt_len"), [(SGLangEngine, 15), (VLLMEngine, 16)])
def test_a_full_context_raises_context_length_error_without_sending(engine_class, prompt_len):
    async def scenario():
        server = await start_server(GateEngine(), context_length=16)
        client = _make(engine_class, server.url)
        try:
            with pytest.raises(ContextLengthError) as caught:
                await client.generate(list(range(prompt_len)), SAMPLING, max_new_tokens=BUDGET)
        finally:
            await client.aclose()
            await server.close()
        return caught.value, server.stats

    error, stats = run(scenario())
    assert stats.requests[engine_class.generate_path] == 0
    assert "not sent" in str(error)


@pytest.mark.parametrize("engine_class", ENGINES)
def test_a_server_refusing_a_long_prompt_maps_to_context_length_error(engine_class):
    """The client believes the context is larger than the server's: the 400 is still context_full."""

    async def scenario():
        server = await start_server(GateEngine(), context_length=16)
        extra = {"model": "agentboost"} if engine_class is VLLMEngine else {}
        client = _make(engine_class, server.url, context_length=1000, **extra)
        try:
            with pytest.raises(ContextLengthError) as caught:
                await client.generate(list(range(40)), SAMPLING, max_new_tokens=BUDGET)
        finally:
            await client.aclose()
            await server.close()
        return caught.value, server.stats

    error, stats = run(scenario())
    assert stats.requests[engine_class.generate_path] == 1
    assert "context" in str(error)


# --- routing ---------------------------------------------------------------------------------


async def _wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def test_unbound_requests_go_to_the_least_loaded_server():
    async def scenario():
        engines = [GateEngine(), GateEngine(), GateEngine()]
        servers = [await start_server(engine) for engine in engines]
        client = _make(SGLangEngine, [s.url for s in servers])
        try:
            blocked = [
                asyncio.create_task(client.generate([BLOCK, n], SAMPLING, max_new_tokens=BUDGET))
                for n in range(6)
            ]
            await _wait_for(lambda: sum(e.waiting for e in engines) == 6)
            loads = sorted(e.waiting for e in engines)
            in_flight = client.in_flight()
            # one quick request now goes to a server like any other (all equally loaded) and returns
            quick = await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            for engine in engines:
                engine.gate.set()
            await asyncio.gather(*blocked)
        finally:
            await client.aclose()
            for server in servers:
                await server.close()
        return loads, in_flight, quick

    loads, in_flight, quick = run(scenario())
    assert loads == [2, 2, 2]
    assert sorted(in_flight.values()) == [2, 2, 2]
    assert quick.token_ids == expected_ids(PROMPT, SAMPLING, BUDGET)


def test_a_bound_session_sticks_to_its_server_and_others_avoid_the_load():
    async def scenario():
        engines = [GateEngine(), GateEngine()]
        servers = [await start_server(engine) for engine in engines]
        by_url = dict(zip([s.url for s in servers], engines, strict=True))
        client = _make(VLLMEngine, [s.url for s in servers])
        view = client.bind("rollout-1")
        try:
            await view.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            home = view.server_url
            # three more turns of the same rollout at once: least-loaded would spread them, the
            # binding keeps them on the rollout's server
            turns = [
                asyncio.create_task(view.generate([BLOCK, n], SAMPLING, max_new_tokens=BUDGET))
                for n in range(3)
            ]
            await _wait_for(lambda: by_url[home].waiting == 3)
            other_url = next(url for url in by_url if url != home)
            waiting_elsewhere = by_url[other_url].waiting
            # an unbound request goes to the idle server
            unbound = await client.generate([5, 6], SAMPLING, max_new_tokens=BUDGET)
            calls_elsewhere = by_url[other_url].calls
            by_url[home].gate.set()
            await asyncio.gather(*turns)
            await view.generate([*PROMPT, 7], SAMPLING, max_new_tokens=BUDGET)
            still_home = view.server_url
            await view.aclose()
            released = client.server_for("rollout-1")
        finally:
            await client.aclose()
            for server in servers:
                await server.close()
        return home, waiting_elsewhere, calls_elsewhere, unbound, still_home, released, by_url[home].calls

    home, waiting_elsewhere, calls_elsewhere, unbound, still_home, released, home_calls = run(scenario())
    assert home is not None and still_home == home
    assert waiting_elsewhere == 0
    assert calls_elsewhere == 1 and unbound.token_ids == expected_ids([5, 6], SAMPLING, BUDGET)
    assert home_calls == 5  # first turn, three concurrent turns, last turn
    assert released is None


def test_sessions_bound_to_an_unreachable_server_move_to_a_live_one():
    async def scenario():
        server = await start_server(GateEngine())
        urls = [dead_url(), server.url]
        client = _make(SGLangEngine, urls)
        views = [client.bind(f"rollout-{n}") for n in range(4)]
        try:
            generations = [await view.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET) for view in views]
            after = await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
        finally:
            await client.aclose()
            await server.close()
        return [v.server_url for v in views], generations, after, server.url

    bound, generations, after, live = run(scenario())
    assert bound == [live] * 4
    assert all(g.token_ids == expected_ids(PROMPT, SAMPLING, BUDGET) for g in generations)
    assert after.metrics["attempts"] == 1  # the dead server is avoided while it stays down


def test_grpo_siblings_of_one_task_are_bound_separately_and_never_unbind_each_other():
    """Samples 0 and 1 of one task are two rollouts: each keeps its own server until it ends."""

    async def scenario():
        engines = [GateEngine(), GateEngine()]
        servers = [await start_server(engine) for engine in engines]
        by_url = dict(zip([s.url for s in servers], engines, strict=True))
        client = _make(SGLangEngine, [s.url for s in servers])
        first, second = RolloutKey("task-7", 0), RolloutKey("task-7", 1)
        try:
            view_a, view_b = client.bind(first), client.bind(second)
            await view_a.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            await view_b.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            homes = (view_a.server_url, view_b.server_url)
            client.unbind(first)  # sibling 0 finished first
            # sibling 1's server is now the busier one: an unbound caller blocks two requests there
            home = by_url[homes[1]]
            blocked = [
                asyncio.create_task(view_b.generate([BLOCK, n], SAMPLING, max_new_tokens=BUDGET))
                for n in range(2)
            ]
            await _wait_for(lambda: home.waiting == 2)
            calls_before = home.calls
            await view_b.generate(
                [*PROMPT, 9], SAMPLING, max_new_tokens=BUDGET
            )  # least-loaded would pick the idle server
            stayed = home.calls == calls_before + 1
            home.gate.set()
            await asyncio.gather(*blocked)
            client.unbind(second)
            released = (client.server_for(first), client.server_for(second))
        finally:
            await client.aclose()
            for server in servers:
                await server.close()
        return homes, stayed, released

    homes, stayed, released = run(scenario())
    assert None not in homes and homes[0] != homes[1]  # two idle servers: the siblings are spread
    assert stayed  # sibling 0 ending did not unbind sibling 1
    assert released == (None, None)


def test_views_of_one_rollout_key_are_counted():
    async def scenario():
        server = await start_server(GateEngine())
        client = _make(VLLMEngine, server.url)
        key = RolloutKey("task", 3)
        try:
            one, two = client.bind(key), client.bind(key)
            await one.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            await one.aclose()
            still = client.server_for(key)  # the other view holds the binding
            await two.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            await two.aclose()
            return still, client.server_for(key), server.url
        finally:
            await client.aclose()
            await server.close()

    still, after, url = run(scenario())
    assert still == url and after is None


def test_one_backend_engines_bind_to_themselves():
    from agentboost.engines.scripted import ScriptedEngine

    engine = ScriptedEngine([[1, 2]])
    key = RolloutKey("t", 0)
    assert engine.bind(key) is engine
    with bound(engine, key) as view:
        assert view is engine
        generation = run(view.generate([5], SamplingParams(stop_token_ids=(2,)), max_new_tokens=4))
    assert generation.token_ids == [1, 2]


# --- cancellation, pools, lifecycle ----------------------------------------------------------


@pytest.mark.parametrize("engine_class", ENGINES)
def test_cancelling_the_caller_cancels_the_request_on_the_server(engine_class):
    async def scenario():
        engine = GateEngine()
        server = await start_server(engine)
        client = _make(engine_class, server.url)
        try:
            task = asyncio.create_task(client.generate([BLOCK, 1], SAMPLING, max_new_tokens=BUDGET))
            await _wait_for(lambda: engine.waiting == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await _wait_for(lambda: server.stats.cancelled == 1)
            return engine.waiting, client.in_flight(), server.stats.generations
        finally:
            await client.aclose()
            await server.close()

    waiting, in_flight, generations = run(scenario())
    assert waiting == 0  # the engine call itself was cancelled
    assert set(in_flight.values()) == {0}
    assert generations == 0


def test_sequential_requests_reuse_one_pooled_connection():
    async def scenario():
        server = await start_server(GateEngine())
        client = _make(SGLangEngine, server.url)
        try:
            for n in range(5):
                await client.generate([n + 1], SAMPLING, max_new_tokens=BUDGET)
        finally:
            await client.aclose()
            await server.close()
        return server.stats

    stats = run(scenario())
    assert stats.requests["/generate"] == 5
    assert len(stats.clients) == 1


def test_one_engine_works_across_event_loops_with_a_pool_each():
    with ServerThread(GateEngine) as server:
        client = _make(SGLangEngine, server.url)

        async def use_then_close() -> Generation:
            try:
                return await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            finally:
                await client.aclose()

        first = asyncio.run(use_then_close())
        second = asyncio.run(use_then_close())  # a new loop gets a new pool
        clients = len(server.stats.clients)
    assert first.token_ids == second.token_ids == expected_ids(PROMPT, SAMPLING, BUDGET)
    assert clients == 2  # one connection per loop


def test_aclose_releases_connections_and_is_idempotent():
    async def scenario():
        server = await start_server(GateEngine())
        client = _make(VLLMEngine, server.url)
        try:
            await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            await client.aclose()
            await client.aclose()
            await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)  # a new pool, a new connection
        finally:
            await client.aclose()
            await server.close()
        return server.stats

    stats = run(scenario())
    assert stats.requests["/v1/completions"] == 3
    assert len(stats.clients) == 2


def test_a_closed_view_refuses_work_but_the_engine_stays_open():
    async def scenario():
        server = await start_server(GateEngine())
        client = _make(SGLangEngine, server.url)
        view = client.bind("rollout")
        try:
            await view.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            await view.aclose()
            await view.aclose()
            with pytest.raises(EngineError, match="closed"):
                await view.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
            return await client.generate(PROMPT, SAMPLING, max_new_tokens=BUDGET)
        finally:
            await client.aclose()
            await server.close()

    assert run(scenario()).token_ids == expected_ids(PROMPT, SAMPLING, BUDGET)


# --- small pieces ----------------------------------------------------------------------------


def test_remote_engines_and_bound_views_are_engines():
    for engine_class in ENGINES:
        engine = engine_class("http://127.0.0.1:1")
        assert isinstance(engine, Engine) and isinstance(engine.bind(RolloutKey("s", 0)), Engine)


def test_backoff_grows_exponentially_with_bounded_jitter():
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0, jitter=0.5)
    rng = random.Random(0)
    for attempt, base in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        waits = [policy.backoff_s(attempt, rng) for _ in range(200)]
        assert min(waits) >= base * 0.5 - 1e-12 and max(waits) <= base + 1e-12
        assert max(waits) - min(waits) > base * 0.3  # jitter really spreads the waits


@pytest.mark.parametrize(
    "kwargs",
    [{"max_attempts": 0}, {"total_budget_s": 0}, {"initial_backoff_s": -1}, {"jitter": 1.5}],
)
def test_retry_policy_rejects_nonsense(kwargs):
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)


def test_urls_are_normalized_and_checked():
    assert normalize_urls("http://a:1/, http://b:2") == ["http://a:1", "http://b:2"]
    assert normalize_urls(["https://x"]) == ["https://x"]
    for bad in ["", "a:1", "ftp://x", ["http://a", "http://a/"]]:
        with pytest.raises(ConfigError):
            normalize_urls(bad)
