"""A rollout run from its :class:`~agentboost.rollout.spec.RunSpec`: one call from Python, and what
``agentboost rollout`` and ``agentboost eval`` share.

    from agentboost.rollout.run import RunSpec, run_rollouts

    summary = run_rollouts(RunSpec(environment="arithmetic", tasks=8, samples=2), "runs/a.jsonl")

:func:`prepare_run` checks the servers and builds the environment, its tasks and limits (a wrong
``--url`` fails in about a second, before the agent stack is imported); :func:`executing` gives the
execution function, in this process or in worker processes; :func:`run_rollouts_async` runs what
the results file does not hold yet, resuming it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentboost import interrupts
from agentboost.errors import ConfigError
from agentboost.rollout.spec import RAY, RunSpec

if TYPE_CHECKING:
    from agentboost.models.precision import Precision

__all__ = ["PreparedRun", "RunSpec", "executing", "prepare_run", "run_rollouts", "run_rollouts_async"]


@dataclass
class PreparedRun:
    """A spec with what it resolved to: the environment, its tasks and the limits in force."""

    spec: RunSpec
    environment: Any
    tasks: Any
    """A :class:`~agentboost.rollout.runner.RunTasks`: made as the run takes them, never all held."""
    limits: Any
    servers: list[dict[str, Any]] = field(default_factory=list)
    """What the remote servers said they are (version, model, dtype, logprobs); [] for the local engine."""
    precision: Precision | None = None
    """The embedded engine's :class:`~agentboost.models.precision.Precision` when the caller made the
    engine (a trainer: its own policy); None: the policy ``agentboost rollout`` serves with."""

    @property
    def identity(self) -> dict[str, Any]:
        """The results header's ``run`` (and the eval report's): see :meth:`RunSpec.identity`; with the
        embedded engine, the ``precision`` its model is served in (weights, compute, device)."""
        record = self.spec.identity(
            environment_name=self.environment.name,
            limits=self.limits,
            tasks=self.tasks.count if self.tasks.count is not None else self.spec.tasks,
            servers=self.servers,
        )
        if self.spec.engine == "local":
            from agentboost.models import precision

            served = self.precision or precision.resolve_precision(
                device=precision.default_device(), trains=False
            )
            record["precision"] = served.as_dict()
        return record

    def config(self, *, progress: bool = True) -> Any:
        from agentboost.rollout.runner import RunConfig

        spec = self.spec
        return RunConfig(
            samples=spec.samples,
            concurrency=spec.concurrency,
            retries=spec.retries,
            seed=spec.seed,
            progress=progress,
        )

    @property
    def plan(self) -> Any:
        """The run's :class:`~agentboost.rollout.results.Plan`; it holds no task (each check is a pass)."""
        return self.tasks.plan(self.spec.samples)


async def prepare_run(spec: RunSpec, *, say: Callable[[str], None] | None = None) -> PreparedRun:
    """Check the engine settings and servers (they answer, and their logprobs are those of the sampling
    distribution agentboost records), then build the environment and its tasks. ``say`` hears the
    limits each rollout runs under (defaults a user never set included).

    Raises :class:`ConfigError` (or an engine connection error) for anything the run cannot start
    with, before a results file is touched.
    """
    from agentboost.engines.factory import check_engine_args

    servers = await check_engine_args(
        spec.engine,
        model=spec.model,
        urls=spec.urls,
        sampling=spec.sampling(),
        options=spec.engine_options(),
    )
    from agentboost.envs.registry import make_environment
    from agentboost.models.weights import DEFAULT_MODEL, resolve_model
    from agentboost.rollout.runner import RunTasks

    environment = make_environment(spec.environment, spec.environment_kwargs)
    limits = spec.resolve_limits(environment.limits)
    if say is not None:
        say(f"{environment.name}: limits per rollout: {limits.summary()}")
    tasks = RunTasks(
        environment, lambda: environment.tasks(spec.tasks, seed=spec.seed, split=spec.split), limit=spec.tasks
    )
    if tasks.count == 0 or (tasks.count is None and next(iter(tasks), None) is None):
        raise ConfigError(f"environment {spec.environment!r} has no tasks in split {spec.split!r}")
    if spec.model.lower() not in {DEFAULT_MODEL, "default"}:  # the default is pulled on first use
        resolve_model(spec.model)
    return PreparedRun(spec, environment, tasks, limits, servers)


@asynccontextmanager
async def executing(run: PreparedRun, *, engine: Any = None, tokenizer: Any = None) -> AsyncIterator[Any]:
    """The run's execution function: actors on a Ray cluster (``--workers ray``), ``spec.workers``
    worker processes, or this process (the model's tokenizer and engine loaded here, closed on exit).
    A caller that holds its own ``engine`` and ``tokenizer`` (the trainer: its engine serves the
    weights being trained) passes them; they are used in this process and left open."""
    spec = run.spec
    if engine is not None:
        from agentboost.engines.base import check_engine
        from agentboost.rollout.runner import in_process

        if tokenizer is None:
            raise ConfigError("executing() with an engine of the caller's needs its tokenizer too")
        yield in_process(
            run.environment,
            check_engine(engine),
            tokenizer,
            sampling=spec.sampling(),
            limits=run.limits,
            template=spec.template,
        )
        return
    if spec.workers == RAY:
        from agentboost.rollout.ray_pool import RayPool

        async with RayPool(spec, run.environment.resources) as ray_pool:
            yield ray_pool.execute
        return
    if spec.workers:
        from agentboost.rollout.workers import WorkerPool

        async with WorkerPool(spec) as pool:
            yield pool.execute
        return
    from agentboost.engines.factory import make_engine
    from agentboost.models.tokenizers import load_tokenizer
    from agentboost.rollout.runner import in_process
    from agentboost.tokens.templates import template_for

    tokenizer = load_tokenizer(spec.model)
    template_for(tokenizer, spec.template)  # an unknown template fails before any rollout
    engine = make_engine(
        spec.engine, model=spec.model, urls=spec.urls, retries=spec.retries, **spec.engine_options()
    )
    try:
        yield in_process(
            run.environment,
            engine,
            tokenizer,
            sampling=spec.sampling(),
            limits=run.limits,
            template=spec.template,
        )
    finally:
        await engine.aclose()


def _say(message: str) -> None:
    print(f"agentboost: {message}", file=sys.stderr)


async def run_rollouts_async(
    spec: RunSpec | PreparedRun,
    out: str | os.PathLike[str],
    *,
    fresh: bool = False,
    allow_different: bool = False,
    redo_failed: bool = True,
    only_planned: bool = True,
    progress: bool = True,
    say: Callable[[str], None] = _say,
    engine: Any = None,
    tokenizer: Any = None,
    on_result: Callable[[Any], None] | None = None,
) -> Any:
    """Run the rollouts of ``spec`` that ``out`` does not hold yet; the run's :class:`RunSummary`.

    ``out`` is resumed unless ``fresh``; a file written with other settings is refused (a ConfigError
    listing them) unless ``allow_different``. Failed rollouts in it run again unless ``redo_failed``
    is False. ``only_planned`` refuses a file holding results outside this run's tasks and samples
    (``eval`` passes False: it reports on the planned ones). ``say`` hears what a user should know:
    a torn last line cut off, settings that differ, failed rollouts run again. ``engine`` and
    ``tokenizer``: the caller's own (see :func:`executing`); ``on_result`` hears each result written.
    """
    from agentboost.rollout.results import ResultStore
    from agentboost.rollout.runner import iter_jobs, run_jobs

    run = spec if isinstance(spec, PreparedRun) else await prepare_run(spec, say=say)
    plan = run.plan
    config = run.config(progress=progress)
    with ResultStore(
        out,
        resume=not fresh,
        identity=run.identity,
        allow_different=allow_different,
        plan=plan if only_planned else None,
        redo_failed=redo_failed,
        environment_name=run.environment.name,
    ) as store:
        if store.torn_bytes:
            say(f"cut a torn last line ({store.torn_bytes} bytes) from {out}")
        if store.differences:
            say(f"resuming {out} with other settings: {'; '.join(store.differences)}")
        redo = len(plan.within(store.failed)) if redo_failed and store.failed else 0
        if redo:
            say(f"running {redo} failed rollouts of {out} again")
        async with executing(run, engine=engine, tokenizer=tokenizer) as execute:
            summary = await run_jobs(
                iter_jobs(run.environment, run.tasks, config),
                execute,
                store,
                config,
                total=plan.size,
                on_result=on_result,
            )
    summary.environment, summary.out = run.environment.name, os.fspath(out)
    return summary


def run_rollouts(spec: RunSpec, out: str | os.PathLike[str], **options: Any) -> Any:
    """:func:`run_rollouts_async` from synchronous code (it starts and ends its own event loop)."""
    return interrupts.run_coroutine(run_rollouts_async(spec, out, **options))
