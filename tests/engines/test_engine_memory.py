"""The embedded engine's memory: one budget for the running batch's KV and the prefix cache, freed."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time

import pytest
from conftest import run, tiny_qwen3

import agentboost.engines.embedded.engine as local
from agentboost.engines.base import SamplingParams
from agentboost.engines.embedded import model_step, scheduler
from agentboost.engines.embedded.engine import LocalEngine, _kv_bytes_per_token
from agentboost.errors import ConfigError, EngineError
from agentboost.memory import large_blocks_from_heap, resident_bytes, trim_heap

GREEDY = SamplingParams(temperature=0)
BUDGET = 10


def prompts(count: int, length: int, start: int = 1000) -> list[list[int]]:
    return [list(range(start + 97 * i, start + 97 * i + length)) for i in range(count)]


async def serve(engine: LocalEngine, requests: list[list[int]], max_new_tokens: int = BUDGET):
    try:
        return await asyncio.gather(
            *(engine.generate(ids, GREEDY, max_new_tokens=max_new_tokens) for ids in requests)
        )
    finally:
        await engine.aclose()


def test_the_budget_caps_the_batch_and_the_cache_and_changes_no_result(random_qwen3):
    per_token = _kv_bytes_per_token(random_qwen3)
    assert per_token == 2 * 2 * 2 * 16 * 4  # layers x (k, v) x kv heads x head_dim x fp32
    requests = prompts(8, 40)
    budget = 3 * (40 + BUDGET) * per_token  # three rows at their longest
    bounded = LocalEngine(random_qwen3, memory_budget_bytes=budget)
    free = LocalEngine(random_qwen3)
    within = run(serve(bounded, requests))
    reference = run(serve(free, requests))
    assert 1 <= bounded.max_batch_seen <= 3 < free.max_batch_seen
    assert [r.token_ids for r in within] == [r.token_ids for r in reference]
    assert bounded.prefix_cache.stats.budget_bytes <= budget


def test_the_prefix_cache_gives_way_to_the_running_batch(random_qwen3):
    per_token = _kv_bytes_per_token(random_qwen3)
    budget = 4 * 50 * per_token
    engine = LocalEngine(random_qwen3, memory_budget_bytes=budget)

    async def main():
        for wave in range(3):  # each wave fills the cache, the next needs the room back
            await asyncio.gather(
                *(
                    engine.generate(ids, GREEDY, max_new_tokens=BUDGET)
                    for ids in prompts(4, 40, 2000 + 5000 * wave)
                )
            )
            assert engine.kv_bytes() <= budget
            engine.prefix_cache.check_invariants()
        await engine.aclose()

    run(main())
    assert engine.prefix_cache.stats.evicted_tokens > 0 and engine.kv_bytes() == 0


def test_a_request_over_the_budget_is_refused_and_bad_budgets_too(random_qwen3):
    engine = LocalEngine(random_qwen3, memory_budget_bytes=1000)
    with pytest.raises(EngineError, match="memory_budget_bytes"):
        run(serve(engine, prompts(1, 40)))
    for options in ({"memory_budget_bytes": 0}, {"prefix_cache_bytes": -1}):
        with pytest.raises(ConfigError):
            LocalEngine(random_qwen3, **options)


def test_closed_engines_hold_no_kv_and_many_of_them_keep_memory_flat():
    model = tiny_qwen3(hidden=256)  # 2 layers x 2 kv heads x 64: 2 KiB of KV a token
    requests = prompts(16, 300)
    kept, marks = [], []
    for _ in range(8):  # kept referenced, as a test suite or a trainer's evaluations keep them
        engine = LocalEngine(model)
        run(serve(engine, requests, max_new_tokens=2))
        assert engine.kv_bytes() == 0
        kept.append(engine)
        gc.collect()  # the finished event loops' reference cycles
        trim_heap()
        marks.append(resident_bytes())
    per_engine = 16 * 302 * _kv_bytes_per_token(model)  # what each engine's prefix cache held: 9.4 MiB
    assert marks[-1] - marks[1] < 2 * per_engine, [m / 2**20 for m in marks]


def test_a_closed_engines_scheduler_thread_serves_the_next_engine_and_ends_when_idle(
    monkeypatch, random_qwen3
):
    """Engines made one after another run on one kept thread (its arena, OpenMP workers and oneDNN
    scratch reused: the flat memory above); engines alive together each have their own; a thread left
    idle for SCHEDULER_IDLE_S ends."""
    monkeypatch.setattr(scheduler, "SCHEDULER_IDLE_S", 0.5)
    monkeypatch.setattr(scheduler, "_SCHEDULERS", scheduler._SchedulerThreads())
    seen: list[threading.Thread] = []

    def engine_recording_its_thread() -> LocalEngine:
        engine = LocalEngine(random_qwen3)
        original = engine._serve
        monkeypatch.setattr(
            engine,
            "_serve",
            lambda: seen.append(threading.current_thread()) or original(),
        )
        return engine

    async def one(engine: LocalEngine):
        result = await engine.generate([5, 6, 7], GREEDY, max_new_tokens=3)
        await engine.aclose()
        return result

    first = run(one(engine_recording_its_thread()))
    second = run(one(engine_recording_its_thread()))
    assert first.token_ids == second.token_ids and len(seen) == 2
    assert seen[0] is seen[1] and seen[0].name == "agentboost-local-engine"  # the same kept thread

    async def together():
        engines = [engine_recording_its_thread() for _ in range(3)]
        results = await asyncio.gather(*(e.generate([5, 6, 7], GREEDY, max_new_tokens=3) for e in engines))
        for engine in engines:
            await engine.aclose()
        return results

    assert all(r.token_ids == first.token_ids for r in run(together()))
    assert len(set(seen[2:])) == 3 and seen[0] in seen[2:]
    deadline = time.monotonic() + 10
    while scheduler._SCHEDULERS._idle and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not scheduler._SCHEDULERS._idle  # every idle thread ended
    for thread in seen:
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_a_forked_child_does_not_inherit_its_parents_idle_scheduler_threads(monkeypatch, random_qwen3):
    """The threads do not exist in a child process: handing its engine one would hang it."""
    monkeypatch.setattr(scheduler, "_SCHEDULERS", scheduler._SchedulerThreads())
    engine = LocalEngine(random_qwen3)
    run(engine.generate([5, 6, 7], GREEDY, max_new_tokens=2))
    engine.close()
    assert scheduler._SCHEDULERS._idle  # the parent keeps its thread for the next engine
    child = os.fork()
    if child == 0:  # nothing but a look at the pool in the child
        os._exit(0 if not scheduler._SCHEDULERS._idle else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_release_memory_drops_an_idle_engines_prefix_cache_and_results_stay_the_same(random_qwen3):
    engine = LocalEngine(random_qwen3)
    requests = prompts(3, 40)

    async def main():
        first = await asyncio.gather(
            *(engine.generate(ids, GREEDY, max_new_tokens=BUDGET) for ids in requests)
        )
        held = engine.kv_bytes()
        # while a request runs, the scheduler owns the cache: release_memory leaves it alone
        running = asyncio.ensure_future(engine.generate(requests[0], GREEDY, max_new_tokens=200))
        while not engine._rows:
            await asyncio.sleep(0.005)
        engine.release_memory()
        kept = engine.prefix_cache.stats.entries
        await running
        engine.release_memory()  # the trainer's call before an update: nothing runs, all of it goes
        after = engine.kv_bytes(), engine.prefix_cache.stats.entries
        again = await asyncio.gather(
            *(engine.generate(ids, GREEDY, max_new_tokens=BUDGET) for ids in requests)
        )
        await engine.aclose()
        return first, held, kept, after, again

    first, held, kept, after, again = run(main())
    assert held > 0 and kept > 0
    assert after == (0, 0)
    assert [r.token_ids for r in again] == [r.token_ids for r in first]
    for a, b in zip(again, first, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.mark.parametrize(("threshold", "large"), [(1, True), (1 << 40, False)])
def test_only_a_large_prefill_keeps_its_blocks_in_the_heap_and_the_heap_is_trimmed_right_after(
    monkeypatch, threshold, large
):
    """A prefill at least ``LARGE_PREFILL_BYTES`` wide runs inside ``large_blocks_from_heap``, and the
    heap is trimmed before the next decode step's forward, not rate-limited; a smaller one changes
    nothing. Recorded on the real engine's calls (the allocator's effect itself: tests/test_heap.py)."""
    events: list[str] = []

    @contextlib.contextmanager
    def recorded():
        events.append("enter")
        with large_blocks_from_heap():
            yield True
        events.append("exit")

    monkeypatch.setattr(model_step, "large_blocks_from_heap", recorded)
    for module in (local, scheduler, model_step):  # where engine.py's code uses it now
        monkeypatch.setattr(module, "trim_heap", lambda: events.append("trim"))
    monkeypatch.setattr(model_step, "LARGE_PREFILL_BYTES", threshold)
    engine = LocalEngine(tiny_qwen3(), prefix_cache_bytes=0)
    engine._trimmed_at = float("inf")  # the rate-limited trim after a batch change never comes due here
    assert engine._use_direct()  # the direct forward's first-use check runs its passes before recording
    original_forward, original_direct = engine._forward, engine._direct.forward
    monkeypatch.setattr(
        engine, "_forward", lambda **inputs: events.append("forward") or original_forward(**inputs)
    )
    monkeypatch.setattr(
        engine._direct, "forward", lambda *args: events.append("forward") or original_direct(*args)
    )
    results = run(serve(engine, prompts(4, 40), max_new_tokens=3))
    assert [len(r.token_ids) for r in results] == [3, 3, 3, 3]
    if large:
        # prefill inside the block, then a trim before the first decode step's forward
        assert events[:4] == ["enter", "forward", "exit", "trim"], events
    else:
        assert "enter" not in events and events[:2] == ["forward", "forward"], events
