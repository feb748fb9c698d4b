"""Rollouts on the current weights: the step's groups and the held-out evaluations, through the runner.

Each collection is described by a :class:`~agentboost.rollout.spec.RunSpec` (:func:`training_spec`),
as an ``agentboost rollout`` run is: its sampling and limits are resolved there, and its results file
(``rollouts/step_NNNNNN.jsonl``, ``evals/step_NNNNNN.jsonl``) carries the spec's identity, which a
resumed step compares.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentboost import interrupts
from agentboost.envs.base import Environment, Outcome, RolloutResult
from agentboost.errors import SettingsChangedError, TooManyFailuresError
from agentboost.rollout.outcomes import reward_summary
from agentboost.rollout.results import read_results
from agentboost.rollout.runner import RunTasks, plan_jobs
from agentboost.rollout.spec import RunSpec
from agentboost.tokens.tokenizer import Tokenizer
from agentboost.train.config import EvalConfig, ModelConfig, RolloutConfig

if TYPE_CHECKING:
    from agentboost.models.precision import Precision


def result_metrics(results: Sequence[RolloutResult]) -> dict[str, float]:
    """What the trainer and ``agentboost sft`` log about a set of rollouts.

    The :func:`~agentboost.rollout.outcomes.reward_summary` numbers (``reward_mean`` and
    ``reward_std`` over the scored rollouts; ``scored``, ``unscorable``, ``failed``, ``coverage``,
    ``failed/<reason>``), plus ``generated_tokens_mean`` and ``tool_use_rate`` (the share of
    rollouts with at least one tool call).
    """
    count = max(1, len(results))
    return {
        **reward_summary(results).metrics(),
        "generated_tokens_mean": sum(r.trajectory.generated_tokens for r in results) / count,
        "tool_use_rate": sum(1 for r in results if r.trajectory.metrics.get("tool_calls")) / count,
    }


def step_results(
    results: Sequence[RolloutResult], *, max_failed_fraction: float
) -> tuple[list[RolloutResult], dict[str, float]]:
    """The rule for a training step's unscored rollouts: the scored ones, and the step's metrics.

    A failed or unscorable group member is MASKED: left out of the update and of its group's
    statistics, so the group's baseline (mean, std) is over its scored members only; a group left with
    fewer than two scored members carries no signal (counted in ``groups/zero_signal_fraction`` like a
    group of equal rewards). An unscored member is never given reward 0: that would teach the policy
    from an infrastructure failure. ``groups/with_unscored`` counts the groups that lost members.
    A failure the policy caused (:class:`~agentboost.outcomes.FailureRule`: an agent that crashed after
    a model turn) is not unscored: it carries the environment's failure reward and trains like any
    scored member, so crashing the agent is never an exit from the reward.

    Raises TooManyFailuresError when more than ``max_failed_fraction`` of the rollouts failed.
    """
    rewards = reward_summary(results)
    if rewards.failed_fraction > max_failed_fraction:
        reasons = ", ".join(f"{reason} {count}" for reason, count in rewards.failures.items())
        first = next(r for r in results if r.outcome is Outcome.FAILED)
        raise TooManyFailuresError(
            f"{rewards.failed} of {rewards.total} rollouts of the step failed ({reasons}), more than "
            f"rollout.max_failed_fraction={max_failed_fraction:g} allows; the first: task {first.task_id!r}: "
            f"{first.reward_error or first.trajectory.termination_detail}; fix it and resume the run"
        )
    summary = result_metrics(results)
    metrics = {
        "reward/mean": summary.pop("reward_mean"),
        "reward/std": summary.pop("reward_std"),
        "rollout/truncated_fraction": sum(r.termination.truncated for r in results) / max(1, len(results)),
        **{f"rollout/{name}": value for name, value in summary.items()},
        "groups/with_unscored": float(len({r.task_id for r in results if r.failed})),
    }
    return [r for r in results if not r.failed], metrics


def training_spec(
    environment: str,
    *,
    environment_kwargs: Mapping[str, Any],
    model: ModelConfig,
    rollout: RolloutConfig,
    split: str,
    tasks: int,
    samples: int,
    seed: int,
    eval_config: EvalConfig | None = None,
) -> RunSpec:
    """The :class:`RunSpec` of a training step's rollouts (``eval_config``: of a held-out evaluation).

    The one place a training run's sampling and limits are resolved, as for ``agentboost rollout``:
    ``rollout``'s temperature, top-p, top-k and limits (``max_tool_calls`` included); an evaluation
    samples at ``eval.temperature`` (greedy: no top-p / top-k) and takes ``eval.max_new_tokens`` when
    set. ``seed`` is the base of the rollouts' sampler seeds; the step's file records it in its header
    (:meth:`RunSpec.identity`), which a resumed step compares.
    """
    temperature, top_p, top_k = rollout.temperature, rollout.top_p, rollout.top_k
    max_new_tokens = rollout.max_new_tokens
    if eval_config is not None:
        temperature = eval_config.temperature
        if not temperature:
            top_p, top_k = 1.0, 0
        if eval_config.max_new_tokens is not None:
            max_new_tokens = eval_config.max_new_tokens
    urls: tuple[str, ...] = ()
    if rollout.vllm_url:
        from agentboost.engines.remote.transport import normalize_urls

        urls = tuple(normalize_urls(rollout.vllm_url))
    return RunSpec(
        environment=environment,
        environment_kwargs=dict(environment_kwargs),
        split=split,
        seed=seed,
        model=model.name_or_path,
        template=model.template,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        limits={
            "max_turns": rollout.max_turns,
            "max_tool_calls": rollout.max_tool_calls,
            "max_new_tokens": max_new_tokens,
            "max_total_tokens": rollout.max_total_tokens,
            "timeout_s": rollout.timeout_s,
        },
        tasks=tasks,
        samples=samples,
        engine="vllm" if urls else "local",
        urls=urls,
        workers=rollout.workers if urls else 0,
        ray_address=rollout.ray_address if urls else None,
        concurrency=rollout.concurrency,
        retries=rollout.retries,
        engine_memory_gib=None if urls else rollout.engine_memory_gib,
    )


def collect_rollouts(
    environment: Environment,
    engine: Any,
    tokenizer: Tokenizer,
    spec: RunSpec,
    tasks: Sequence[Any],
    path: Path,
    *,
    on_result: Callable[[RolloutResult], None],
    run: Callable[[Coroutine[Any, Any, Any]], Any] = interrupts.run_coroutine,
    precision: Precision | None = None,
) -> list[RolloutResult]:
    """Run ``tasks x spec.samples`` rollouts through the runner as ``spec`` says, resuming ``path``;
    results in job order.

    ``path``'s header is the spec's identity; resuming a file written with other settings raises
    :class:`~agentboost.errors.SettingsChangedError`. ``run`` runs the collection's coroutine (the
    trainer's own event loop, where its engine's connections live; default: a fresh one). With
    ``spec.workers`` (processes, or ``ray``) the rollouts run there against ``spec.urls``, and
    ``engine`` only syncs weights. ``precision``: the embedded engine's policy (the trainer's), which
    the header records as the run's ``precision``.
    """
    from agentboost.rollout.run import run_rollouts_async

    prepared = _prepared(environment, spec, tasks, precision)
    try:
        run(
            run_rollouts_async(
                prepared,
                path,
                progress=False,
                engine=None if spec.workers else engine,
                tokenizer=None if spec.workers else tokenizer,
                on_result=on_result,
            )
        )
    except SettingsChangedError as error:
        raise SettingsChangedError(
            f"{path} holds rollouts made with other settings ({'; '.join(error.differences)}); a resumed "
            "run continues a step with the settings it began with: restore them, or delete the file to "
            "collect the step again with the new ones",
            differences=error.differences,
        ) from None
    jobs = plan_jobs(environment, tasks, prepared.config(progress=False))
    by_key = {(r.task_id, r.sample): r for r in read_results(path)}
    return [by_key[(job.task_id, job.sample)] for job in jobs]


def _prepared(
    environment: Environment, spec: RunSpec, tasks: Sequence[Any], precision: Precision | None = None
) -> Any:
    """The :class:`~agentboost.rollout.run.PreparedRun` of ``tasks`` under ``spec``."""
    from agentboost.rollout.run import PreparedRun

    limits = spec.resolve_limits(environment.limits)
    return PreparedRun(spec, environment, RunTasks(environment, lambda: tasks), limits, precision=precision)


def write_results(
    environment: Environment,
    spec: RunSpec,
    tasks: Sequence[Any],
    results: Sequence[RolloutResult],
    path: Path,
    precision: Precision | None = None,
) -> None:
    """Write ``results`` (of ``tasks`` under ``spec``) as the results file ``path`` that
    :func:`collect_rollouts` would have written, replacing it at once (a staging file renamed into
    place): the file a data-parallel step assembles from its ranks' shares."""
    from agentboost.rollout.results import ResultStore

    prepared = _prepared(environment, spec, tasks, precision)
    staging = path.with_name(f".{path.name}.staging")
    with ResultStore(
        staging, resume=False, fsync=False, identity=prepared.identity, environment_name=environment.name
    ) as store:
        for result in results:
            store.write(result)
    with open(staging, "rb") as handle:  # on disk before it takes the step file's name
        os.fsync(handle.fileno())
    os.replace(staging, path)
