"""Long-lived worker processes, each an event loop running many rollouts, for CPU parallelism and isolation.

The parent starts ``python -m agentboost.rollout.worker CONFIG`` N times and talks JSON lines: jobs
go to a worker's stdin; results come back on a private pipe (fd 3 in the worker), so whatever a
tool or library prints cannot corrupt the protocol. A worker that dies (a segfault, the OOM killer)
fails only the rollouts it had in flight (the runner retries them or records ``worker_crashed``) and
is replaced. No process starts per rollout in steady state. Workers build their own environment
(from its reference), tokenizer and engine; with a remote engine they all share one server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import SamplingParams
from agentboost.envs.base import RolloutResult
from agentboost.errors import ConfigError
from agentboost.rollout.runner import Job, WorkerCrashed

_LINE_LIMIT = 1 << 30  # a 1,000-turn trajectory is a long line


@dataclasses.dataclass
class WorkerSpec:
    """Everything a worker needs to rebuild the rollout setup; sent as JSON on its command line."""

    environment: str
    environment_kwargs: dict[str, Any]
    model: str
    """Tokenizer source (and the model, for the ``local`` engine)."""
    engine: str = "sglang"
    urls: list[str] = dataclasses.field(default_factory=list)
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
    limits: dict[str, Any] | None = None
    concurrency: int = 64

    @classmethod
    def build(
        cls,
        environment: str,
        *,
        model: str,
        engine: str = "sglang",
        urls: list[str] | None = None,
        environment_kwargs: Mapping[str, Any] | None = None,
        sampling: SamplingParams | None = None,
        limits: RolloutLimits | None = None,
        concurrency: int = 64,
    ) -> WorkerSpec:
        return cls(
            environment=environment,
            environment_kwargs=dict(environment_kwargs or {}),
            model=model,
            engine=engine,
            urls=list(urls or []),
            sampling=dataclasses.asdict(sampling or SamplingParams()),
            limits=dataclasses.asdict(limits) if limits is not None else None,
            concurrency=concurrency,
        )


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process, results: asyncio.StreamReader) -> None:
        self.process = process
        self.results = results
        self.in_flight: dict[int, asyncio.Future[RolloutResult]] = {}
        self.reader: asyncio.Task[None] | None = None


class WorkerPool:
    """N worker processes; :meth:`execute` is the runner's execution function."""

    def __init__(self, spec: WorkerSpec, workers: int = 2) -> None:
        if workers < 1:
            raise ConfigError(f"a worker pool needs at least one worker, got {workers}")
        self.spec = spec
        self.size = workers
        self.workers: list[_Worker] = []
        self.started = 0
        """Processes started over the pool's life (replacements included)."""
        self._next_id = 0
        self._closing = False
        self._capacity = asyncio.Semaphore(workers * spec.concurrency)

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        while len(self.workers) < self.size:
            self.workers.append(await self._spawn())

    async def _spawn(self) -> _Worker:
        read_fd, write_fd = os.pipe()
        argv = [sys.executable, "-m", "agentboost.rollout.worker", json.dumps(dataclasses.asdict(self.spec))]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                pass_fds=(write_fd,),
                env={**os.environ, "AGENTBOOST_RESULT_FD": str(write_fd)},
            )
        finally:
            os.close(write_fd)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_LINE_LIMIT)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb"))
        worker = _Worker(process, reader)
        worker.reader = asyncio.create_task(self._read(worker))
        self.started += 1
        return worker

    async def _read(self, worker: _Worker) -> None:
        """Resolve results as they arrive; when the worker dies, fail its rollouts and replace it."""
        while True:
            line = await worker.results.readline()
            if not line:
                break
            message = json.loads(line)
            future = worker.in_flight.pop(message["id"], None)
            if future is None or future.done():
                continue
            if "result" in message:
                future.set_result(RolloutResult.from_dict(message["result"]))
            else:
                future.set_exception(ConfigError(f"worker could not run the job: {message['error']}"))
        code = await worker.process.wait()
        crash = WorkerCrashed(f"worker process {worker.process.pid} exited with code {code}")
        for future in worker.in_flight.values():
            if not future.done():
                future.set_exception(crash)
        worker.in_flight.clear()
        if not self._closing and worker in self.workers:
            self.workers[self.workers.index(worker)] = await self._spawn()

    async def execute(self, job: Job) -> RolloutResult:
        async with self._capacity:
            alive = [w for w in self.workers if w.process.returncode is None] or self.workers
            worker = min(alive, key=lambda w: len(w.in_flight))
            self._next_id += 1
            job_id = self._next_id
            future: asyncio.Future[RolloutResult] = asyncio.get_running_loop().create_future()
            worker.in_flight[job_id] = future
            line = json.dumps({"id": job_id, **dataclasses.asdict(job)}) + "\n"
            try:
                assert worker.process.stdin is not None
                worker.process.stdin.write(line.encode("utf-8"))
                await worker.process.stdin.drain()
            except (ConnectionError, RuntimeError) as error:
                worker.in_flight.pop(job_id, None)
                raise WorkerCrashed(f"worker process {worker.process.pid} is gone: {error}") from error
            return await future

    async def close(self) -> None:
        self._closing = True
        for worker in self.workers:
            if worker.process.stdin is not None:
                with contextlib.suppress(Exception):
                    worker.process.stdin.close()
        for worker in self.workers:
            try:
                await asyncio.wait_for(worker.process.wait(), timeout=10)
            except asyncio.TimeoutError:
                worker.process.kill()
                await worker.process.wait()
            if worker.reader is not None:
                with contextlib.suppress(Exception):
                    await worker.reader
        self.workers = []
