"""The embedded engine's scheduler: one thread owns the model, admits queued requests and runs the batch.

``LocalEngine.generate`` queues a ``_Request`` and awaits its future. The scheduler loop (on a thread kept
and reused across engines: ``_SchedulerThreads``) takes what the engine's admission allows, prefills it,
runs decode steps while rows are running, retires finished rows (their KV into the prefix cache) and
settles their futures on the callers' event loops; a crash fails every waiting request. What a pass
computes is :mod:`agentboost.engines.embedded.model_step`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from agentboost.engines.base import Generation, SamplingParams
from agentboost.errors import EngineError
from agentboost.memory import trim_heap

logger = logging.getLogger(__name__)


PACKED_IDLE_RELEASE_S = 1.0
"""An engine with nothing to run for this long drops its packed weights (rebuilt in ~0.2 s on demand)."""
SCHEDULER_IDLE_S = 600.0
"""How long a scheduler thread whose engine closed waits for the next engine before it ends."""


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    generator: torch.Generator | None
    max_new_tokens: int
    submitted: float = field(default_factory=time.perf_counter)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cancelled: bool = False
    prefill_s: float = 0.0
    cached_tokens: int = 0
    computed_tokens: int = 0
    weights_epoch: int = 0


class Scheduler:
    """The scheduler half of :class:`~agentboost.engines.embedded.engine.LocalEngine`: the thread
    loop, the running batch's rows joining and leaving, the callers' futures. A mixin: the state is
    the engine's, made in its ``__init__``."""

    # --- scheduler thread -------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = _SCHEDULERS.run(self._serve)

    def _serve(self) -> None:
        try:
            with torch.inference_mode():
                while True:
                    with self._wake:
                        while not self._closed and not self._queue and not self._rows:
                            if self._linears is None or not self._linears.held:
                                self._wake.wait()
                            elif not self._wake.wait(timeout=PACKED_IDLE_RELEASE_S):
                                self._linears.release()  # idle: give the packed weights' memory back
                                trim_heap()
                        if self._closed:
                            break
                        self._admitting = self._take_admissible()
                    if self._admitting:
                        self._prefill(self._admitting)
                        self._admitting = []
                    if self._rows:
                        self._decode_step()
                    elif self._trim_now:  # a large prefill whose rows all ended at their first token
                        self._trim()
        except BaseException as error:  # a crash must not leave awaiting rollouts hanging
            logger.exception("the local engine's scheduler crashed")
            crash = EngineError(f"the local engine crashed: {type(error).__name__}: {error}")
            with self._wake:
                self._crash, self._closed = crash, True
            self._fail_all(crash)
            return
        self._fail_all(EngineError("the local engine was closed while this request was running"))

    def _fail_all(self, error: EngineError) -> None:
        with self._wake:
            pending = list(self._queue) + self._admitting + self._rows
            self._queue.clear()
        self._admitting, self._rows = [], []
        self._set_batch([])
        self._lengths, self._last_ids = [], []
        for request in pending:
            self._resolve(request, error)

    @staticmethod
    def _resolve(request: _Request, outcome: Generation | BaseException) -> None:
        def settle() -> None:
            if request.future.done():
                return
            if isinstance(outcome, BaseException):
                request.future.set_exception(outcome)
            else:
                request.future.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # the caller's event loop is gone: nobody is waiting
            request.loop.call_soon_threadsafe(settle)

    # --- batch bookkeeping -------------------------------------------------------------------------

    def _join(self, requests: list[_Request], kv: Any, lengths: list[int]) -> None:
        """Make ``kv`` (the running rows and the prefilled ones after them) the running batch."""
        self._rows.extend(requests)
        self._lengths.extend(lengths)
        self._last_ids.extend([0] * len(requests))
        self._use_batch(kv)
        self.max_batch_seen = max(self.max_batch_seen, len(self._rows))

    def _retire(self, indices: list[int]) -> None:
        finished = set(indices)
        if self.prefix_cache.enabled:
            self._fit_prefix_cache([r for i, r in enumerate(self._rows) if i not in finished])
            fresh = self._current_epoch() == self._cache_epoch
            for index in indices:
                request = self._rows[index]
                if fresh and request.weights_epoch == self._cache_epoch:  # never hold stale KV
                    read = request.prompt_ids + request.token_ids[:-1]  # the last id was never fed
                    self._hold(read, self._batch_kv, index)
        leaving = [self._rows[index] for index in indices]
        keep = [index for index in range(len(self._rows)) if index not in finished]
        self._rows = [self._rows[index] for index in keep]
        self._lengths = [self._lengths[index] for index in keep]
        self._last_ids = [self._last_ids[index] for index in keep]
        if not keep:
            self._set_batch([])
        else:  # re-pack before the callers hear back, so kv_bytes() no longer counts the rows that left
            assert self._mask is not None
            mask = self._mask[keep]
            # drop columns that are padding in every remaining row
            first_real = int((mask.cumsum(-1) == 0).sum(-1).min())
            runs: list[list[int]] = []  # kept rows in runs of consecutive indices: one view (no copy) each
            for index in keep:
                if runs and runs[-1][1] == index:
                    runs[-1][1] = index + 1
                else:
                    runs.append([index, index + 1])
            self._set_batch(
                [
                    (
                        [(k[a:b, :, first_real:], v[a:b, :, first_real:]) for k, v in self._cache],
                        self._mask[a:b, first_real:],
                    )
                    for a, b in runs
                ]
            )
        for request in leaving:
            if request.cancelled:
                continue
            stopped = bool(request.token_ids) and request.token_ids[-1] in request.sampling.stop_token_ids
            generation = Generation(
                token_ids=request.token_ids,
                logprobs=request.logprobs,
                finish_reason="stop" if stopped else "length",
                prompt_tokens=len(request.prompt_ids),
                metrics={
                    "prefill_s": request.prefill_s,
                    "total_s": time.perf_counter() - request.submitted,
                    "prompt_cached_tokens": float(request.cached_tokens),
                    "prompt_computed_tokens": float(request.computed_tokens),
                },
            )
            self._resolve(request, generation)

    def _set_batch(self, parts: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], Any]]) -> None:
        """Make ``parts`` (rows of KV and mask, in order) the running batch's buffers; none: no batch."""
        from agentboost.engines.embedded.batch_kv import BatchKV

        self._cache, self._mask, self._batch_kv = [], None, None  # the old buffer goes once parts are copied
        if not parts:
            if self._graphs is not None:  # their views would keep the last batch's buffer alive
                self._graphs.release()
            return
        self._use_batch(BatchKV(parts, self._reserved_width(self._rows), **self._padding(len(self._rows))))

    def _use_batch(self, kv: Any) -> None:
        self._batch_kv, self._cache, self._mask = kv, kv.layers(), kv.mask()
        self._trim_due = True


class _Run:
    """One function running on a :class:`_SchedulerThreads` thread; :meth:`join` waits for it."""

    def __init__(self, function: Any) -> None:
        self.function = function
        self._done = threading.Event()

    def join(self) -> None:
        self._done.wait()


class _SchedulerThreads:
    """The threads engines' schedulers run on, kept and reused when an engine closes.

    A thread that computes owns memory beyond its tensors: glibc's arena of its own, the OpenMP worker
    threads PyTorch's and the kernels' parallel regions start for it, oneDNN's per-thread scratch. A
    new thread per engine made all of that afresh, and a process that makes engine after engine (the
    test suite, a trainer's evaluations) grew by 1-3 MiB an engine, memory left behind by the threads
    that ended; on a kept thread it is the next engine's. An idle thread waits for the next engine for
    :data:`SCHEDULER_IDLE_S`, then ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []

    def run(self, function: Any) -> _Run:
        job = _Run(function)
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = _Worker(job)
            threading.Thread(
                target=self._loop, args=(worker,), name="agentboost-local-engine", daemon=True
            ).start()
            return job
        with worker.wake:
            worker.job = job
            worker.wake.notify()
        return job

    def _loop(self, worker: _Worker) -> None:
        while True:
            job = worker.job
            assert job is not None
            try:
                job.function()
            finally:  # idle again before the engine's close() returns: the next engine finds it
                with worker.wake:
                    worker.job = None
                with self._lock:
                    self._idle.append(worker)
                job._done.set()
            with worker.wake:
                while worker.job is None:
                    if not worker.wake.wait(timeout=SCHEDULER_IDLE_S) and worker.job is None:
                        with self._lock:  # still idle, or taken by run(), whose job is on its way
                            if worker in self._idle:
                                self._idle.remove(worker)
                                return


class _Worker:
    def __init__(self, job: _Run) -> None:
        self.wake = threading.Condition()
        self.job: _Run | None = job


_SCHEDULERS = _SchedulerThreads()


def _forget_schedulers_after_fork() -> None:
    """A forked child has none of its parent's threads: its engines start their own."""
    global _SCHEDULERS
    _SCHEDULERS = _SchedulerThreads()


os.register_at_fork(after_in_child=_forget_schedulers_after_fork)
