"""Asynchronous training with bounded staleness: the next steps' rollouts are collected while a step trains.

``rollout.max_staleness: k`` (docs/training.md, "Asynchronous training"). The policy *version* is the
number of training steps applied to the weights; every generation is tagged with the version it ran
on (:class:`VersionedEngine`) and its tokens keep it (``Segment.weight_version``). A trajectory's
staleness, at the step that trains on it, is that step's version minus the OLDEST version among its
tokens.

* **Look-ahead.** At the start of step ``s`` the collections of steps ``s .. s+k`` are running (step
  ``t`` is started at step ``t-k``, in its own results file ``rollouts/step_t.jsonl``, seeds and tasks
  as the synchronous trainer's step ``t``). With ``k = 0`` only step ``s`` runs, and it is started after
  step ``s-1``'s update: the synchronous trainer, bit for bit.
* **Whole groups.** A task's ``group_size`` rollouts form a group; a group is *complete* when all of
  them ended. Step ``s`` trains on the first ``tasks_per_step`` complete groups, oldest step first; it
  waits only until it has them, or until every started collection ended. A group with a member over
  the bound is dropped whole (``async/dropped_groups``); never a part of a group.
* **Update barrier.** A generation and a weight change never overlap: each generation holds the
  :class:`WeightGate` shared, a weight change holds it alone (it waits for the generations in flight to
  end, like vLLM's ``/pause?mode=wait``). With the embedded engine, which reads the very tensors the
  optimizer writes, the whole update holds the gate (no second copy of the weights: no memory cost,
  but its decoding pauses during the update); with vLLM servers only the push does.
* **Partial rollouts: continue.** A multi-turn rollout in flight at a weight change is neither aborted
  nor restarted: its next turn generates on the new weights after the barrier, keeping its earlier
  tokens, logprobs and their versions, so one trajectory may span versions (``async/versions_spanned_*``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from agentboost import interrupts
from agentboost.engines.base import Engine, Generation, RolloutKey, RolloutView, SamplingParams
from agentboost.memory import peak_resident_bytes, resident_bytes

if TYPE_CHECKING:
    from agentboost.envs.base import RolloutResult
    from agentboost.train.trainer import Trainer

T = TypeVar("T")


class LoopThread:
    """An event loop running in its own thread; :meth:`run` runs a coroutine there from any thread.

    The asynchronous trainer's rollout loop: collections (several steps at once) and evaluations share
    it, and with it the engine's connections."""

    def __init__(self) -> None:
        self.loop = interrupts.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="agentboost-rollouts", daemon=True)
        self._thread.start()
        self._pending: set[concurrent.futures.Future[Any]] = set()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop; block until it ends; its result or its exception."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        self._pending.add(future)
        try:
            return future.result()
        finally:
            self._pending.discard(future)

    def cancel_pending(self) -> None:
        """Cancel every coroutine still running through :meth:`run` (the loop keeps running)."""
        for future in list(self._pending):
            future.cancel()

    def close(self) -> None:
        """Cancel what still runs, stop the loop and its thread. Idempotent."""
        if self.loop.is_closed():
            return
        self.cancel_pending()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=60)
        if not self._thread.is_alive():
            self.loop.close()


class WeightGate:
    """Generations hold it shared, a weight change alone. Lives on the rollout loop; also counts the
    time no generation was in flight (the engine's idle time)."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.active = 0
        self._idle_since: float | None = time.perf_counter()
        self._idle_s = 0.0

    @asynccontextmanager
    async def generation(self) -> Any:
        while not self._open.is_set():  # re-checked: the gate may have closed again since it woke us
            await self._open.wait()
        if self.active == 0 and self._idle_since is not None:
            self._idle_s += time.perf_counter() - self._idle_since
            self._idle_since = None
        self.active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.active -= 1
            if self.active == 0:
                self._idle.set()
                self._idle_since = time.perf_counter()

    @property
    def closed(self) -> bool:
        """A weight change holds the gate (or waits for the generations in flight to end)."""
        return not self._open.is_set()

    async def close(self) -> None:
        """No new generation starts; returns when none is in flight."""
        self._open.clear()
        while self.active:
            await self._idle.wait()

    async def reopen(self) -> None:
        self._open.set()

    async def take_idle_seconds(self) -> float:
        """Seconds with no generation in flight since the last call."""
        now = time.perf_counter()
        idle = self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
        self._idle_s = 0.0
        if self._idle_since is not None:
            self._idle_since = now
        return idle


class VersionedEngine:
    """The trainer's engine seen by its rollouts: each generation holds the :class:`WeightGate` and is
    tagged ``metrics["weight_version"]`` with the policy version it ran on (the tokens keep it)."""

    def __init__(self, engine: Any, gate: WeightGate, version: Callable[[], int]) -> None:
        self.engine = engine
        self.gate = gate
        self.version = version

    @property
    def context_length(self) -> int | None:
        return self.engine.context_length

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, max_new_tokens: int
    ) -> Generation:
        return await self.generate_through(self.engine, prompt_ids, sampling, max_new_tokens)

    async def generate_through(
        self, engine: Engine, prompt_ids: Sequence[int], sampling: SamplingParams, max_new_tokens: int
    ) -> Generation:
        async with self.gate.generation():
            version = self.version()  # constant while the gate is held: a weight change closes it
            generation = await engine.generate(prompt_ids, sampling, max_new_tokens=max_new_tokens)
        generation.metrics["weight_version"] = float(version)
        return generation

    def bind(self, rollout: RolloutKey) -> RolloutView:
        """The wrapped engine's view of ``rollout`` (its server kept), its generations gated and tagged."""
        return RolloutView(self, self.engine.bind(rollout))

    def unbind(self, rollout: RolloutKey) -> None:
        self.engine.unbind(rollout)

    def outage(self) -> Any:
        """The wrapped engine's outage (remote engines: every server down), else None."""
        outage = getattr(self.engine, "outage", None)
        return outage() if outage is not None else None

    async def aclose(self) -> None:
        """Nothing of its own: the trainer closes the engine."""


# --- staleness: one rule ---------------------------------------------------------------------------


def staleness(result: RolloutResult, version: int) -> int:
    """``version`` minus the oldest policy version among the rollout's generated tokens (0 when it
    generated nothing tagged)."""
    versions = result.trajectory.weight_versions
    return version - versions[0] if versions else 0


@dataclass
class Group:
    """One task's ``group_size`` rollouts, collected as part of step ``origin``."""

    origin: int
    position: int
    """The task's place in its step's task list."""
    results: list[RolloutResult]

    @property
    def key(self) -> tuple[int, int]:
        return (self.origin, self.position)


@dataclass
class _Collection:
    """One origin step's collection: its thread's future and its groups as they complete."""

    step: int
    future: concurrent.futures.Future[list[RolloutResult]] | None = None
    members: dict[str, dict[int, RolloutResult]] = field(default_factory=dict)
    announced: set[str] = field(default_factory=set)


class AsyncCollector:
    """Runs the trainer's collections ahead of its updates, up to ``rollout.max_staleness`` steps, and
    hands each step whole groups within the bound (see the module's docstring)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.max_staleness = trainer.config.rollout.max_staleness
        self.loop = LoopThread()
        self.gate: WeightGate = self.loop.run(_make_gate())
        self.version = 0
        """The policy version the engine serves: training steps applied to its weights."""
        from agentboost.engines.embedded.engine import LocalEngine

        self.shares_weights = isinstance(trainer.engine, LocalEngine)
        """The embedded engine reads the trainer's tensors: the whole update holds the gate. Others
        (vLLM servers, a scripted engine) hold their own weights: only the weight push holds it."""
        self.engine = VersionedEngine(trainer.engine, self.gate, lambda: self.version)
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.max_staleness + 1, thread_name_prefix="agentboost-collect"
        )
        self._collections: dict[int, _Collection] = {}
        self._ready: list[Group] = []
        self._changed = threading.Condition()
        self._started = False

    # --- collections ----------------------------------------------------------------------------------

    def _launch_due(self, step: int) -> None:
        """Start every collection due at step ``step``: steps ``step .. step + max_staleness``."""
        last = min(step + self.max_staleness, self.trainer.total_steps - 1)
        for origin in range(step, last + 1):
            if origin not in self._collections:
                collection = _Collection(origin)
                self._collections[origin] = collection
                collection.future = self._threads.submit(self._collect, collection)
                collection.future.add_done_callback(lambda _: self._notify())

    def _collect(self, collection: _Collection) -> list[RolloutResult]:
        from agentboost.train.collect import collect_rollouts

        trainer, origin = self.trainer, collection.step
        tasks = trainer.tasks_for_step(origin)
        order = {task.id: position for position, task in enumerate(tasks)}
        results = collect_rollouts(
            trainer.environment,
            self.engine,
            trainer.tokenizer,
            trainer.run_spec(step=origin),
            tasks,
            trainer.run_dir / "rollouts" / f"step_{origin:06d}.jsonl",
            on_result=lambda result: self._arrived(collection, result, order),
            run=self.loop.run,
            precision=trainer.precision,
        )
        for result in results:  # results read back from a resumed file were never announced
            self._arrived(collection, result, order)
        return results

    def _notify(self) -> None:
        """A collection ended: wake the trainer waiting in :meth:`take`."""
        with self._changed:
            self._changed.notify_all()

    def _arrived(self, collection: _Collection, result: RolloutResult, order: dict[str, int]) -> None:
        group_size = self.trainer.config.rollout.group_size
        with self._changed:
            members = collection.members.setdefault(result.task_id, {})
            members[result.sample] = result
            if len(members) == group_size and result.task_id not in collection.announced:
                collection.announced.add(result.task_id)
                position = order.get(result.task_id, len(order))
                self._ready.append(Group(collection.step, position, [members[s] for s in sorted(members)]))
                self._changed.notify_all()

    # --- what a step trains on ------------------------------------------------------------------------

    def take(self, step: int) -> tuple[list[Group], list[Group], float]:
        """Step ``step``'s groups: up to ``tasks_per_step`` complete groups within the bound, oldest
        step first; the groups dropped for staleness; the seconds the trainer waited for them."""
        wanted = self.trainer.config.rollout.tasks_per_step
        started = time.perf_counter()
        dropped: list[Group] = []
        with self._changed:
            while True:
                self._ready.sort(key=lambda group: group.key)
                fresh = []
                for group in self._ready:
                    if max(staleness(r, self.version) for r in group.results) > self.max_staleness:
                        dropped.append(group)
                    else:
                        fresh.append(group)
                self._ready = fresh
                running = [c for c in self._collections.values() if c.future and not c.future.done()]
                if len(fresh) >= wanted or not running:
                    break
                self._changed.wait(timeout=1.0)
        for collection in list(self._collections.values()):
            if collection.future is not None and collection.future.done():
                collection.future.result()  # a failed collection stops the run with its error
        taken, self._ready = self._ready[:wanted], self._ready[wanted:]
        return taken, dropped, time.perf_counter() - started

    def train_step(self, step: int, *, bar: Any = None) -> dict[str, float]:
        """The asynchronous step: start the due collections, take whole groups, update under the
        barrier, serve the new weights."""
        trainer = self.trainer
        started = time.perf_counter()
        if not self._started:  # a fresh start or a resume: the weights the engine serves are the step's
            self._started = True
            self.version = step
            synced = trainer.sync_weights()
        else:
            synced = {"time/weight_sync_s": 0.0}
        self._launch_due(step)
        groups, dropped, waited = self.take(step)
        results = [result for group in groups for result in group.results]
        samples, metrics = trainer.make_samples(results, groups=[g.key for g in groups for _ in g.results])
        update_started = time.perf_counter()
        gate_wait = 0.0
        if self.shares_weights:
            gate_wait = self._close_gate()
        metrics.update(trainer.update(samples, step))
        update_seconds = time.perf_counter() - update_started
        if not self.shares_weights:
            gate_wait += self._close_gate()
        try:
            synced["time/weight_sync_s"] += trainer.sync_weights()["time/weight_sync_s"]
            self.version = step + 1
        finally:
            self.loop.run(self.gate.reopen())
        engine_idle = self.loop.run(self.gate.take_idle_seconds())
        metrics.update(synced)
        metrics.update(self.step_metrics(groups, dropped, step))
        if step == trainer.total_steps - 1:  # the run's last step: the groups no step trains, counted
            metrics["async/groups_left_over"] = float(self.left_over())
        step_seconds = time.perf_counter() - started
        metrics.update(
            {
                "time/rollout_s": waited,
                "time/update_s": update_seconds,
                "time/step_s": step_seconds,
                "time/trainer_idle_s": waited + gate_wait,
                "time/engine_idle_s": engine_idle,
                "memory/peak_gib": peak_resident_bytes() / 2**30,
                "memory/resident_gib": resident_bytes() / 2**30,
                "rollout/tokens_per_second": sum(r.trajectory.generated_tokens for r in results)
                / max(step_seconds, 1e-9),
            }
        )
        if bar is not None:
            bar.set_description_str("train", refresh=True)
        return metrics

    def left_over(self) -> int:
        """Groups collected or started that no step took (complete but not taken, or not complete)."""
        wanted = self.trainer.config.rollout.tasks_per_step
        with self._changed:
            unfinished = sum(wanted - len(c.announced) for c in self._collections.values())
            return len(self._ready) + unfinished

    def _close_gate(self) -> float:
        """Close the gate (waits for the generations in flight); the seconds it took."""
        began = time.perf_counter()
        self.loop.run(self.gate.close())
        return time.perf_counter() - began

    def step_metrics(self, groups: Sequence[Group], dropped: Sequence[Group], step: int) -> dict[str, float]:
        """``async/*``: the staleness histogram, versions spanned per trajectory, groups dropped."""
        trained = [r for group in groups for r in group.results]
        ages = [staleness(r, step) for r in trained]
        spans = [len(r.trajectory.weight_versions) for r in trained]
        metrics = {
            f"async/staleness_{age}": float(sum(1 for a in ages if a == age))
            for age in range(self.max_staleness + 1)
        }
        metrics.update(
            {
                "async/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
                "async/staleness_max": float(max(ages, default=0)),
                "async/versions_spanned_mean": sum(spans) / len(spans) if spans else 0.0,
                "async/versions_spanned_max": float(max(spans, default=0)),
                "async/groups_trained": float(len(groups)),
                "async/dropped_groups": float(len(dropped)),
                "async/dropped_fraction": len(dropped) / max(1, len(dropped) + len(groups)),
            }
        )
        return metrics

    def stop_collections(self) -> None:
        """Cancel the collections still running (the run ended or failed); the loop stays up for the
        engine's own closing."""
        self.loop.cancel_pending()
        self._threads.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Stop the collections and the loop's thread (the engine is the trainer's to close)."""
        self.stop_collections()
        self.loop.close()


async def _make_gate() -> WeightGate:
    """A gate made on the rollout loop (its events belong to that loop)."""
    return WeightGate()
