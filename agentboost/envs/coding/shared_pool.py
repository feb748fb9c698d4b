"""One sandbox pool per process (and pool size), shared by every concurrent rollout.

A :class:`~agentboost.sandbox.SandboxPool` belongs to the event loop it started in. Rollouts of one
process share a loop most of the time (the local trainer runs every step's rollouts in one loop), but
a program may run one ``asyncio.run`` loop after another, and worker processes and veRL workers have
loops of their own. So the pool is made
lazily, in the running loop, on first use; when a later loop asks, the pool of a loop that has ended is
closed (its workers stopped) and a new one started for the new loop. Pools still open when the process
exits are closed then.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading

from agentboost.sandbox import SandboxLimits, SandboxPool

_pools: dict[tuple[int, int], tuple[asyncio.AbstractEventLoop, SandboxPool]] = {}
"""(pool size, id of the loop) -> (the loop, its pool)."""
_lock = threading.Lock()


def default_pool_size() -> int:
    """Sandbox runs at once: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 2)


def shared_pool(size: int | None = None, limits: SandboxLimits | None = None) -> SandboxPool:
    """The process's pool of ``size`` workers for the running event loop (made on first use).

    Call it from inside a coroutine. Jobs pass their own limits, so ``limits`` only sets the default of
    a pool made by this call."""
    loop = asyncio.get_running_loop()
    size = size or default_pool_size()
    with _lock:
        entry = _pools.get((size, id(loop)))
        if entry is not None and entry[0] is loop:
            return entry[1]
        stale = [key for key, (other, _) in _pools.items() if other.is_closed() or key == (size, id(loop))]
        for key in stale:
            _, old = _pools.pop(key)
            _close_later(old)
        pool = SandboxPool(size=size, limits=limits)
        _pools[(size, id(loop))] = (loop, pool)
        return pool


def shared_pools() -> list[SandboxPool]:
    """Every pool this process holds now (for tests and diagnostics)."""
    with _lock:
        return [pool for _, pool in _pools.values()]


async def close_shared_pools() -> None:
    """Close every shared pool of the running loop (and of loops that have ended)."""
    loop = asyncio.get_running_loop()
    with _lock:
        keys = [key for key, (other, _) in _pools.items() if other is loop or other.is_closed()]
        pools = [_pools.pop(key)[1] for key in keys]
    for pool in pools:
        with contextlib.suppress(Exception):
            await pool.close()


def _close_later(pool: SandboxPool) -> None:
    """Close a pool whose loop has ended, from the running loop, in the background."""
    task = asyncio.ensure_future(_close_quietly(pool))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_closing: set[asyncio.Future[None]] = set()


async def _close_quietly(pool: SandboxPool) -> None:
    with contextlib.suppress(Exception):
        await pool.close()


@atexit.register
def _close_at_exit() -> None:
    with _lock:
        pools = [pool for _, pool in _pools.values()]
        _pools.clear()
    if not pools:
        return

    async def close_all() -> None:
        for pool in pools:
            with contextlib.suppress(Exception):
                await pool.close()

    with contextlib.suppress(Exception):
        asyncio.run(close_all())
