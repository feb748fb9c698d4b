"""Synchronous tools run on daemon threads, so one that hangs cannot keep the process alive.

Strands runs a plain ``def`` tool with ``asyncio.to_thread``: on the event loop's default executor,
whose threads the interpreter joins at exit and ``asyncio.run`` waits for on its way out. A tool
stuck in a blocking call (a socket read, ``time.sleep``, a lock) would then hold the process past
the rollout's ``--timeout`` and past Ctrl-C forever. :func:`use_daemon_threads` gives the running
loop an executor whose threads are daemons and whose shutdown does not wait for them: the rollout
ends at its timeout as before, and the process exits when its work is done.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_MAX_THREADS = 64
_installed: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


class DaemonThreadExecutor(ThreadPoolExecutor):
    """Each call on its own daemon thread (at most ``max_workers`` running; the rest wait their turn).

    ``shutdown`` never waits: a call that never returns is abandoned, not joined.
    """

    def __init__(self, max_workers: int = _MAX_THREADS) -> None:
        super().__init__(max_workers=1)  # asyncio requires a ThreadPoolExecutor; its own pool is unused
        self._slots = threading.BoundedSemaphore(max_workers)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()

        def call() -> None:
            with self._slots:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    result = fn(*args, **kwargs)
                except BaseException as error:  # delivered to the awaiting coroutine
                    future.set_exception(error)
                else:
                    future.set_result(result)

        threading.Thread(target=call, name="agentboost-sync-tool", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=cancel_futures)


def use_daemon_threads(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Make ``loop``'s (default: the running loop's) default executor a :class:`DaemonThreadExecutor`."""
    loop = loop or asyncio.get_running_loop()
    if loop not in _installed:
        loop.set_default_executor(DaemonThreadExecutor())
        _installed.add(loop)
