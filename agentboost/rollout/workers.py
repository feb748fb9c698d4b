"""Long-lived worker processes, each an event loop running many rollouts, for CPU parallelism and isolation.

The parent starts ``python -m agentboost.rollout.worker SPEC CONCURRENCY`` N times and talks JSON lines: jobs
go to a worker's stdin; results come back on a private pipe (fd 3 in the worker), so whatever a
tool or library prints cannot corrupt the protocol. A worker that dies (a segfault, the OOM killer)
fails only the rollouts it had in flight (the runner retries them or records ``worker_crashed``) and
is replaced. No process starts per rollout in steady state. Workers build their own environment
(from its reference), tokenizer and engine from the run's :class:`RunSpec` (sent as JSON); with a
remote engine they all share one server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import sys

from agentboost.envs.base import RolloutResult
from agentboost.errors import AgentBoostError, ConfigError, WorkerSetupError
from agentboost.rollout.runner import ExecutorPool, Job, WorkerCrashed
from agentboost.rollout.spec import RunSpec

_LINE_LIMIT = 1 << 30  # a 1,000-turn trajectory is a long line


_KEY = re.compile(rb'^\{"id":\s*(\d+)')


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process, results: asyncio.StreamReader) -> None:
        self.process = process
        self.results = results
        self.in_flight: dict[int, asyncio.Future[RolloutResult]] = {}
        self.reader: asyncio.Task[None] | None = None


class WorkerPool(ExecutorPool):
    """N worker processes (``workers``, default ``spec.workers``) each running up to its share of
    ``spec.concurrency``; :meth:`execute` is the runner's execution function.

    A worker that dies is replaced after a pause that doubles with each death in a row (from
    ``restart_backoff_s``); after ``max_restarts`` deaths in a row without a result between them,
    or as soon as a worker reports that it cannot be set up, the pool stops and every rollout
    waiting on it fails with that cause. A worker that has not finished its setup (environment,
    tokenizer, engine) within ``setup_timeout_s`` is killed and the pool stops the same way: a hang
    at start (a model load waiting on a dead mount, an environment blocking on a network call) does
    not fix itself by restarting (default ``spec.worker_setup_timeout_s``).
    """

    def __init__(
        self,
        spec: RunSpec,
        workers: int | None = None,
        *,
        max_restarts: int = 5,
        restart_backoff_s: float = 0.5,
        max_restart_backoff_s: float = 30.0,
        setup_timeout_s: float | None = None,
    ) -> None:
        count = spec.workers if workers is None else workers
        setup_timeout_s = spec.worker_setup_timeout_s if setup_timeout_s is None else setup_timeout_s
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"a worker pool needs at least one worker, got {count!r}")
        workers = count
        if max_restarts < 0 or restart_backoff_s < 0:
            raise ConfigError("max_restarts and restart_backoff_s must be >= 0")
        if not setup_timeout_s > 0:
            raise ConfigError(f"setup_timeout_s must be > 0, got {setup_timeout_s!r}")
        self.setup_timeout_s = setup_timeout_s
        self.spec = spec
        self.size = workers
        self.workers: list[_Worker] = []
        self.started = 0
        """Processes started over the pool's life (replacements included)."""
        self.max_restarts = max_restarts
        self.restart_backoff_s = restart_backoff_s
        self.max_restart_backoff_s = max_restart_backoff_s
        self._deaths_in_a_row = 0
        self._fatal: AgentBoostError | None = None
        self._next_id = 0
        self._closing = False
        self._readers: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        """Set when a worker was replaced or the pool gave up: jobs waiting for a live worker look again."""
        self.concurrency = spec.worker_concurrency(workers)
        """Rollouts in flight in each worker."""
        self._capacity = asyncio.Semaphore(workers * self.concurrency)

    async def start(self) -> None:
        """Start the workers and wait until each has built its setup (or one reports it cannot)."""
        spawned = await asyncio.gather(
            *(self._first_spawn() for _ in range(self.size - len(self.workers))), return_exceptions=True
        )
        for outcome in spawned:
            if isinstance(outcome, _Worker):
                self.workers.append(outcome)
        for outcome in spawned:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _first_spawn(self) -> _Worker:
        try:
            return await self._spawn()
        except WorkerCrashed as crash:
            replacement = await self._respawn(crash)
            if replacement is None:
                raise self._fatal or crash from None
            return replacement

    async def _spawn(self) -> _Worker:
        read_fd, write_fd = os.pipe()
        spec = json.dumps(self.spec.to_dict())
        argv = [sys.executable, "-m", "agentboost.rollout.worker", spec, str(self.concurrency)]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                pass_fds=(write_fd,),
                env={**os.environ, "AGENTBOOST_RESULT_FD": str(write_fd)},
            )
        finally:
            os.close(write_fd)
        self.started += 1
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_LINE_LIMIT)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb"))
        worker = _Worker(process, reader)
        try:  # {"ready": true}, or {"fatal": ...} when setup failed
            first = await asyncio.wait_for(reader.readline(), timeout=self.setup_timeout_s)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            self._fatal = WorkerSetupError(
                f"worker process {process.pid} did not finish its setup (environment, tokenizer, engine) "
                f"within {self.setup_timeout_s:g} s and was killed; if loading is just slow, raise the "
                "setup timeout (agentboost rollout --worker-setup-timeout)"
            )
            raise self._fatal from None
        try:
            hello = json.loads(first) if first else {}
        except json.JSONDecodeError:
            hello = {}
        if "fatal" in hello:
            await process.wait()
            self._fatal = WorkerSetupError(str(hello["fatal"]))
            raise self._fatal
        if not hello.get("ready"):
            # it said something else first, or nothing (it closed the pipe: it is exiting): it cannot be
            # trusted. Wait for its exit before killing it: kill() on a process that already exited reaps
            # it behind asyncio's back, and its exit code is lost.
            try:
                code = await asyncio.wait_for(process.wait(), timeout=0.5 if first else 5)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                code = await process.wait()
            raise WorkerCrashed(f"worker process {process.pid} exited with code {code} while starting")
        worker.reader = asyncio.create_task(self._read(worker))
        self._readers.add(worker.reader)
        worker.reader.add_done_callback(self._readers.discard)
        return worker

    def _resolve(self, worker: _Worker, line: bytes) -> None:
        """Settle the future a result line answers. A malformed line fails only its own rollout."""
        try:
            message = json.loads(line)
            job_id = message["id"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
            match = _KEY.match(line)
            if match is None:  # cannot tell whose it is: the worker is broken, retire it
                print(
                    f"agentboost: worker {worker.process.pid} sent an unreadable line ({error}); "
                    "replacing it",
                    file=sys.stderr,
                )
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                return
            job_id, message = int(match.group(1)), {"malformed": str(error)}
        future = worker.in_flight.pop(job_id, None)
        if future is None or future.done():
            return
        if "result" in message:
            try:
                future.set_result(RolloutResult.from_dict(message["result"]))
                self._deaths_in_a_row = 0
            except Exception as error:  # a result that does not parse fails only this rollout
                future.set_exception(WorkerCrashed(f"the worker's result could not be read: {error}"))
        elif "error" in message:
            future.set_exception(WorkerSetupError(str(message["error"])))
        else:
            reason = message.get("malformed", "no result in it")
            future.set_exception(WorkerCrashed(f"the worker sent a malformed result line ({reason})"))

    async def _read(self, worker: _Worker) -> None:
        """Resolve results as they arrive; when the worker dies, fail its rollouts and replace it."""
        while True:
            try:
                line = await worker.results.readline()
            except (ValueError, asyncio.LimitOverrunError) as error:  # a line beyond the limit
                print(f"agentboost: worker {worker.process.pid}: {error}; replacing it", file=sys.stderr)
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                break
            if not line:
                break
            self._resolve(worker, line)
        code = await worker.process.wait()
        crash = WorkerCrashed(f"worker process {worker.process.pid} exited with code {code}")
        for future in worker.in_flight.values():
            if not future.done():
                future.set_exception(crash)
        worker.in_flight.clear()
        if self._closing or worker not in self.workers:
            return
        await self._replace(worker, crash)

    async def _replace(self, worker: _Worker, crash: WorkerCrashed) -> None:
        replacement = await self._respawn(crash)
        if replacement is not None and worker in self.workers:
            self.workers[self.workers.index(worker)] = replacement  # close() stops it if closing
        self._changed.set()

    async def _respawn(self, crash: WorkerCrashed) -> _Worker | None:
        """A new worker after a pause that doubles with each death in a row; None after the bound."""
        while not self._closing and self._fatal is None:
            self._deaths_in_a_row += 1
            if self._deaths_in_a_row > self.max_restarts:
                self._fatal = WorkerSetupError(
                    f"worker processes died {self._deaths_in_a_row} times in a row without finishing a "
                    f"rollout (last: {crash}); see the worker's output above for the cause"
                )
                self._fail_everything(self._fatal)
                return None
            delay = min(self.max_restart_backoff_s, self.restart_backoff_s * 2 ** (self._deaths_in_a_row - 1))
            await asyncio.sleep(delay)
            try:
                return await self._spawn()
            except WorkerCrashed as error:
                crash = error
            except AgentBoostError as error:
                self._fail_everything(error)
                return None
        return None

    def _fail_everything(self, error: BaseException) -> None:
        self._changed.set()
        for other in self.workers:
            for future in other.in_flight.values():
                if not future.done():
                    future.set_exception(error)
            other.in_flight.clear()

    async def execute(self, job: Job) -> RolloutResult:
        if self._fatal is not None:
            raise self._fatal
        async with self._capacity:
            if self._fatal is not None:
                raise self._fatal
            while True:  # while every worker is being replaced, wait instead of failing the job
                if self._fatal is not None:
                    raise self._fatal
                alive = [w for w in self.workers if w.process.returncode is None]
                if alive or self._closing:
                    break
                self._changed.clear()
                await self._changed.wait()
            worker = min(alive or self.workers, key=lambda w: len(w.in_flight))
            self._next_id += 1
            job_id = self._next_id
            future: asyncio.Future[RolloutResult] = asyncio.get_running_loop().create_future()
            worker.in_flight[job_id] = future
            line = json.dumps({"id": job_id, **dataclasses.asdict(job)}) + "\n"
            if worker.process.stdin is None:
                raise WorkerCrashed(f"worker process {worker.process.pid} has no input pipe")
            try:
                worker.process.stdin.write(line.encode("utf-8"))
                await worker.process.stdin.drain()
            except (ConnectionError, RuntimeError) as error:
                worker.in_flight.pop(job_id, None)
                raise WorkerCrashed(f"worker process {worker.process.pid} is gone: {error}") from error
            return await future

    async def close(self) -> None:
        """Stop every worker, replacements being started included; waits for them to exit."""
        self._closing = True
        stopped: set[int] = set()
        while True:
            workers = [w for w in self.workers if id(w) not in stopped]
            readers = [task for task in self._readers if not task.done()]
            if not workers and not readers:
                break
            for worker in workers:
                if worker.process.stdin is not None:
                    with contextlib.suppress(Exception):
                        worker.process.stdin.close()
            for worker in workers:
                try:
                    await asyncio.wait_for(worker.process.wait(), timeout=10)
                except asyncio.TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        worker.process.kill()
                    await worker.process.wait()
                stopped.add(id(worker))
            # readers finish their worker's bookkeeping; one replacing a dead worker puts its
            # replacement in self.workers, which the next pass stops
            await asyncio.gather(*readers, return_exceptions=True)
        self.workers = []
