"""Rollouts on a Ray cluster (``--workers ray``): one actor per node, an event loop running many rollouts.

The runner's other executors run rollouts in this process or in worker processes on this machine;
:class:`RayPool` runs them in Ray actors spread over a cluster's nodes. Each actor builds its
environment, tokenizer and engine from the run's :class:`~agentboost.rollout.spec.RunSpec` (as a
worker process does: :func:`~agentboost.rollout.worker.build_execution`) and reserves what the
environment declares (:class:`~agentboost.envs.resources.ActorResources`, default 1 CPU). Results
come back to the runner, which writes them to the one results file as it does for any executor, so
the file, its format and resuming are the same.

Before any rollout a preflight has every actor build its setup and reach the engine's servers from
its node; a node that cannot ends the run in one line (:class:`ClusterPreflightError`). An actor or
node lost mid-run fails only the rollouts it had in flight with :class:`WorkerCrashed` (the runner
reruns them, as for a crashed worker process) and is replaced on a node that has room. Ray is an
optional dependency (``pip install 'agentboost[ray]'``), imported only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

from agentboost.envs.base import RolloutResult
from agentboost.envs.resources import ActorResources
from agentboost.errors import (
    AgentBoostError,
    ClusterPreflightError,
    ConfigError,
    WorkerCrashed,
    WorkerSetupError,
)
from agentboost.rollout.runner import ExecutorPool, Job
from agentboost.rollout.spec import RunSpec


def import_ray() -> Any:
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError as error:
        raise ConfigError(
            f"--workers ray needs Ray, which is not installed ({error}); install it with "
            "pip install 'agentboost[ray]'"
        ) from None
    return ray


def _describe(error: BaseException) -> str:
    """An error as one line: an agentboost error's own message, else its type and first line."""
    if isinstance(error, AgentBoostError):
        return str(error)
    first = str(error).strip().splitlines()
    return f"{type(error).__name__}: {first[0] if first else ''}".rstrip(": ")


class RolloutActor:
    """The Ray actor (one per node): builds the run's setup once, then runs rollouts concurrently."""

    def __init__(self, spec_data: dict[str, Any]) -> None:
        self._spec_data = spec_data
        self._execute: Any = None
        self._engine: Any = None

    async def setup(self) -> dict[str, Any]:
        """Build the environment, tokenizer and engine, and reach the engine's servers from this node:
        ``{"ready": True, "node": ip}`` or ``{"fatal": message, "node": ip}``."""
        import ray

        node = f"{ray.util.get_node_ip_address()} ({ray.get_runtime_context().get_node_id()[:8]})"
        try:
            from agentboost.engines.factory import check_engine_args
            from agentboost.rollout.worker import build_execution

            spec = RunSpec.from_dict(self._spec_data)
            await check_engine_args(  # first: an unreachable server is refused before anything loads
                spec.engine,
                model=spec.model,
                urls=spec.urls,
                sampling=spec.sampling(),
                options=spec.engine_options(),
            )
            self._execute, self._engine = build_execution(spec)
        except Exception as error:
            return {"fatal": _describe(error), "node": node}
        return {"ready": True, "node": node, "pid": os.getpid()}

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """One rollout: ``{"result": ...}`` (a RolloutResult's dict) or ``{"error": message}``."""
        try:
            result = await self._execute(Job(**job))
        except Exception as error:  # a bad job must not take the actor down
            return {"error": _describe(error)}
        return {"result": result.to_dict()}

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.aclose()


@dataclasses.dataclass(eq=False)
class _Actor:
    handle: Any
    node: str = "?"
    in_flight: int = 0
    alive: bool = True


def _source_root() -> str:
    """The directory this agentboost is imported from, so actors import the same code (an editable
    install or a checkout on PYTHONPATH; on other machines the path may not exist, and is ignored)."""
    return str(Path(__file__).resolve().parents[2])


class RayPool(ExecutorPool):
    """Rollout actors on a Ray cluster; :meth:`execute` is the runner's execution function.

    ``address``: the cluster to join (default ``spec.ray_address``; None: ``RAY_ADDRESS``, else a
    local cluster started here and stopped on close). When Ray is already initialised in this process
    that connection is used and left open. One actor per alive node offering ``resources``; each runs
    its share of ``spec.concurrency``. A lost actor is replaced after a pause that doubles with each
    loss in a row (from ``restart_backoff_s``); after ``max_restarts`` losses in a row with no rollout
    finished in between, the run ends with the last cause.
    """

    def __init__(
        self,
        spec: RunSpec,
        resources: ActorResources | None = None,
        *,
        address: str | None = None,
        max_restarts: int = 5,
        restart_backoff_s: float = 0.5,
        max_restart_backoff_s: float = 30.0,
        setup_timeout_s: float | None = None,
    ) -> None:
        self.ray = import_ray()
        self.spec = spec
        self.resources = resources if resources is not None else ActorResources()
        self.address = address if address is not None else spec.ray_address
        self.setup_timeout_s = spec.worker_setup_timeout_s if setup_timeout_s is None else setup_timeout_s
        self.max_restarts = max_restarts
        self.restart_backoff_s = restart_backoff_s
        self.max_restart_backoff_s = max_restart_backoff_s
        self.actors: list[_Actor] = []
        self.started = 0
        """Actors started over the pool's life (replacements included)."""
        self.concurrency = 1
        """Rollouts in flight in each actor (set on start: ``spec.concurrency`` split over the nodes)."""
        self._capacity: asyncio.Semaphore | None = None
        self._owns_ray = False
        self._losses_in_a_row = 0
        self._fatal: AgentBoostError | None = None
        self._closing = False
        self._changed = asyncio.Event()
        self._replacing: set[asyncio.Task[None]] = set()
        self._actor_class: Any = None

    # --- starting ----------------------------------------------------------------------------------

    def _connect(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        try:
            ray.init(
                address=self.address,
                include_dashboard=False,
                log_to_driver=True,
                logging_level="warning",
                configure_logging=False,
            )
        except Exception as error:
            where = self.address or os.environ.get("RAY_ADDRESS") or "a local cluster"
            raise ClusterPreflightError(
                f"cannot join the Ray cluster at {where}: {_describe(error)}"
            ) from None
        self._owns_ray = True

    def _nodes(self) -> list[dict[str, Any]]:
        """Alive nodes that offer what one actor needs."""
        needs = self.resources.amounts()
        return [
            node
            for node in self.ray.nodes()
            if node.get("Alive")
            and all(node.get("Resources", {}).get(name, 0) >= amount for name, amount in needs.items())
        ]

    def _new_actor(self, node_id: str | None) -> _Actor:
        """An actor pinned to ``node_id``, or (a replacement) wherever the cluster has room."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        resources = self.resources
        paths = [_source_root(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        options: dict[str, Any] = {
            "num_cpus": resources.cpus,
            "resources": dict(resources.custom),
            "max_concurrency": self.concurrency + 4,  # its rollouts, plus setup and close
            "max_restarts": 0,  # the pool replaces lost actors itself (and reruns their rollouts)
            "runtime_env": {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}},
            "scheduling_strategy": (
                "SPREAD" if node_id is None else NodeAffinitySchedulingStrategy(node_id, soft=False)
            ),
        }
        if resources.memory_gib is not None:
            options["memory"] = int(resources.memory_gib * 2**30)
        if self._actor_class is None:
            self._actor_class = self.ray.remote(RolloutActor)
        handle = self._actor_class.options(**options).remote(self.spec.to_dict())
        self.started += 1
        return _Actor(handle)

    async def _set_up(self, actor: _Actor) -> None:
        """Wait for ``actor``'s setup; ClusterPreflightError when it cannot run rollouts."""
        try:
            # the actor's engine check waits up to --server-down-timeout for a server still starting
            waits = 0.0 if self.spec.engine == "local" else self.spec.server_down_timeout_s
            hello = await asyncio.wait_for(
                _awaitable(actor.handle.setup.remote()), self.setup_timeout_s + waits
            )
        except asyncio.TimeoutError:
            self.ray.kill(actor.handle)
            raise ClusterPreflightError(
                f"a Ray rollout actor did not finish its setup (environment, tokenizer, engine) within "
                f"{self.setup_timeout_s + waits:g} s and was killed; check that a node has "
                f"{self.resources.summary()} free, or raise --worker-setup-timeout if loading is slow"
            ) from None
        except self.ray.exceptions.RayError as error:
            with contextlib.suppress(Exception):
                self.ray.kill(actor.handle)
            raise ClusterPreflightError(f"a Ray rollout actor could not start: {_describe(error)}") from None
        actor.node = str(hello.get("node", "?"))
        if "fatal" in hello:
            self.ray.kill(actor.handle)
            raise ClusterPreflightError(f"Ray node {actor.node} cannot run rollouts: {hello['fatal']}")

    async def start(self) -> None:
        """Join (or start) the cluster, place one actor per node that offers the environment's
        resources, and wait until each has built its setup and reached the engine (the preflight)."""
        self._connect()
        nodes = self._nodes()
        if not nodes:
            raise ClusterPreflightError(
                "no node of the Ray cluster offers what one rollout actor needs "
                f"({self.resources.summary()}); add nodes or lower the environment's resources"
            )
        self.concurrency = self.spec.worker_concurrency(len(nodes))
        self._capacity = asyncio.Semaphore(len(nodes) * self.concurrency)
        self.actors = [self._new_actor(node["NodeID"]) for node in nodes]
        outcomes = await asyncio.gather(
            *(self._set_up(actor) for actor in self.actors), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    # --- running -----------------------------------------------------------------------------------

    def _lose(self, actor: _Actor, error: BaseException) -> WorkerCrashed:
        """``actor`` is gone: stop using it and start its replacement; the crash its rollouts get."""
        crash = WorkerCrashed(f"the Ray rollout actor on node {actor.node} was lost: {_describe(error)}")
        if actor.alive:
            actor.alive = False
            with contextlib.suppress(Exception):
                self.ray.kill(actor.handle)
            if not self._closing:
                task = asyncio.ensure_future(self._replace(actor, crash))
                self._replacing.add(task)
                task.add_done_callback(self._replacing.discard)
        return crash

    async def _replace(self, lost: _Actor, crash: WorkerCrashed) -> None:
        """A new actor where the cluster has room, after a pause that doubles with each loss in a row."""
        while not self._closing and self._fatal is None:
            self._losses_in_a_row += 1
            if self._losses_in_a_row > self.max_restarts:
                self._fatal = WorkerSetupError(
                    f"Ray rollout actors were lost {self._losses_in_a_row} times in a row without finishing "
                    f"a rollout (last: {crash})"
                )
                break
            delay = min(self.max_restart_backoff_s, self.restart_backoff_s * 2 ** (self._losses_in_a_row - 1))
            await asyncio.sleep(delay)
            replacement = self._new_actor(None)
            try:
                await self._set_up(replacement)
            except ClusterPreflightError as error:
                crash = WorkerCrashed(str(error))
                continue
            except asyncio.CancelledError:  # the pool closed while it was setting up: it must not outlive it
                with contextlib.suppress(Exception):
                    self.ray.kill(replacement.handle)
                raise
            if self._closing:
                self.ray.kill(replacement.handle)
            else:
                self.actors[self.actors.index(lost)] = replacement
            break
        self._changed.set()

    async def execute(self, job: Job) -> RolloutResult:
        if self._capacity is None:
            raise ConfigError("RayPool.execute() before start(): use `async with RayPool(spec) as pool`")
        async with self._capacity:
            while True:  # while every actor is being replaced, wait instead of failing the job
                if self._fatal is not None:
                    raise self._fatal
                alive = [actor for actor in self.actors if actor.alive]
                if alive:
                    break
                self._changed.clear()
                await self._changed.wait()
            actor = min(alive, key=lambda a: a.in_flight)
            actor.in_flight += 1
            try:
                reply = await _awaitable(actor.handle.run.remote(dataclasses.asdict(job)))
            except self.ray.exceptions.RayError as error:  # the actor, its node or its reply was lost
                raise self._lose(actor, error) from None
            finally:
                actor.in_flight -= 1
        if "error" in reply:
            raise WorkerSetupError(str(reply["error"]))
        try:
            result = RolloutResult.from_dict(reply["result"])
        except Exception as error:
            raise WorkerCrashed(f"the Ray actor's result could not be read: {error}") from error
        self._losses_in_a_row = 0
        return result

    async def close(self) -> None:
        """Stop every actor (closing their engines), then the local cluster if this pool started it."""
        self._closing = True
        for task in list(self._replacing):
            task.cancel()
        await asyncio.gather(*self._replacing, return_exceptions=True)
        alive = [actor for actor in self.actors if actor.alive]
        if alive:
            closing = [_awaitable(actor.handle.close.remote()) for actor in alive]
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True), 10)
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor.handle)
        self.actors = []
        if self._owns_ray:
            self.ray.shutdown()
            self._owns_ray = False


async def _awaitable(ref: Any) -> Any:
    """Await a Ray object reference in the running event loop."""
    return await ref
