"""Evaluate an engine on an environment: rollouts through the resumable runner, then a JSON report.

The report (``format: agentboost.eval``, ``version: 1``) holds pass@k and pass^k for every k up to
the samples per task, mean reward and success rate over *scored* rollouts with their ``coverage``
(scored / rollouts; every rollout is scored, unscorable or failed, see
:mod:`agentboost.rollout.outcomes`), the unscorable and failed counts (failures by reason, a reward
that raised included), termination counts, per-tool calls, errors and statuses, parse errors, tokens
and latency, and the statistics tables. The summary text marks every rate whose coverage is below
100%. ``compare`` lines two reports up metric by metric.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentboost.agent.limits import RolloutLimits
from agentboost.engines.base import Engine, SamplingParams
from agentboost.envs.base import Environment, RolloutResult
from agentboost.errors import ConfigError
from agentboost.eval.passk import pass_table, task_counts
from agentboost.eval.stats import gateway_drift, policy_failures_note, tool_usage_stats
from agentboost.rollout.outcomes import MEAN_REWARD_DEFINITION
from agentboost.rollout.results import ResultStore, read_results
from agentboost.rollout.run import PreparedRun
from agentboost.rollout.runner import Execute, RunConfig, RunSummary, in_process, plan_jobs, run_jobs
from agentboost.rollout.spec import RunSpec
from agentboost.tokens.tokenizer import Tokenizer

REPORT_FORMAT = "agentboost.eval"
REPORT_VERSION = 2
"""2: the run's settings are under ``run`` (the results header's identity); 1 had some at the top."""


def build_report(
    results: Iterable[RolloutResult],
    *,
    samples: int | None = None,
    threshold: float = 1.0,
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The evaluation report of finished results (``samples``: per task; default the most any task has).

    ``run`` is the run's identity (:meth:`~agentboost.rollout.spec.RunSpec.identity`, the header of
    its results file), recorded as the report's ``run``."""
    results = list(results)
    counts = task_counts(((r.task_id, r.reward) for r in results), threshold)
    per_task = {}
    for result in results:
        per_task[result.task_id] = per_task.get(result.task_id, 0) + 1
    samples = samples or max(per_task.values(), default=0)
    table = pass_table(counts, samples)
    stats = tool_usage_stats(results, threshold=threshold)
    summary = stats.summary
    tools = {
        row[0]: {
            "calls": row[1],
            "errors": row[2],
            "error_rate": row[3],
            "rollouts": row[4],
            "latency_s": row[5],
        }
        for row in stats.table("tools").rows
    }
    for tool, status, count, _share in stats.table("tool_status").rows:
        tools[tool].setdefault("statuses", {})[status] = count
    return {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "run": dict(run or {}),
        "samples": samples,
        "threshold": threshold,
        "tasks": len(counts),
        "rollouts": len(results),
        "scored": summary["scored"],
        "unscored": summary["unscored"],
        "unscorable": summary["unscorable"],
        "policy_failures": summary["policy_failures"],
        "failed": summary["failed"],
        "failures": summary["failures"],
        "coverage": summary["coverage"],
        "mean_reward_definition": MEAN_REWARD_DEFINITION,
        "mean_reward": summary["mean_reward"],
        "do_nothing_baseline": _breakdown_mean(results, "do_nothing_baseline"),
        **{key: _breakdown_mean(results, key) for key in _baseline_keys(results)},
        "success_rate": summary["success_rate"],
        "pass@k": {str(k): value for k, value in table["pass@k"].items()},
        "pass^k": {str(k): value for k, value in table["pass^k"].items()},
        "tasks_per_k": {str(k): value for k, value in table["tasks"].items()},
        "terminations": summary["terminations"],
        "tools": tools,
        "parse_errors": summary["parse_errors_total"],
        "rollouts_with_parse_errors": summary["rollouts_with_parse_errors"],
        "turns_mean": summary["turns_mean"],
        "tool_calls_mean": summary["tool_calls_mean"],
        "tool_use_rate": summary["tool_use_rate"],
        "tokens": {
            "generated_total": summary["generated_tokens_total"],
            "generated_mean": summary["generated_tokens_mean"],
            "prompt_mean": summary["prompt_tokens_mean"],
            "total_mean": summary["total_tokens_mean"],
        },
        "latency_s": {
            "mean": summary["latency_s_mean"],
            "p50": summary["latency_s_p50"],
            "p90": summary["latency_s_p90"],
        },
        "stats": stats.to_dict(),
        **({"gateway": drift} if (drift := gateway_drift(results)) is not None else {}),
    }


BASELINE_SUFFIX = "_baseline"
"""A reward-breakdown part named ``<policy>_baseline`` is what a scripted ``policy`` earns on the same
task under the same reward (tau2 records three): reports print its mean beside the mean reward."""


def _baseline_keys(results: Sequence[RolloutResult]) -> list[str]:
    """The breakdown's baseline parts, in the order the rollouts record them."""
    return list(
        dict.fromkeys(key for r in results for key in r.reward_breakdown if key.endswith(BASELINE_SUFFIX))
    )


def _breakdown_mean(results: Sequence[RolloutResult], key: str) -> float | None:
    """The mean of a reward-breakdown part over the scored rollouts that record it (None: none do)."""
    values = [r.reward_breakdown[key] for r in results if r.reward is not None and key in r.reward_breakdown]
    return sum(values) / len(values) if values else None


async def evaluate(
    environment: Environment,
    engine: Engine | None,
    tokenizer: Tokenizer,
    tasks: Sequence[Any],
    *,
    out: str | os.PathLike[str],
    samples: int = 1,
    sampling: SamplingParams | None = None,
    limits: RolloutLimits | None = None,
    concurrency: int = 16,
    retries: int = 2,
    seed: int = 0,
    fresh: bool = False,
    identity: Mapping[str, Any] | None = None,
    allow_different: bool = False,
    progress: bool = True,
    threshold: float = 1.0,
    execute: Execute | None = None,
) -> tuple[dict[str, Any], RunSummary]:
    """Run ``tasks x samples`` rollouts (resuming ``out``) and report on exactly those rollouts.

    ``identity`` is written as the results file's header; resuming a file written with other settings
    is a ConfigError listing them, unless ``allow_different`` (see :class:`ResultStore`). ``execute``
    runs the rollouts elsewhere (a :class:`~agentboost.rollout.workers.WorkerPool`'s ``execute``);
    by default they run in this process on ``engine`` and ``tokenizer``.
    """
    if samples < 1:
        raise ConfigError(f"--samples must be at least 1, got {samples}")
    config = RunConfig(
        samples=samples, concurrency=concurrency, retries=retries, seed=seed, progress=progress
    )
    jobs = plan_jobs(environment, tasks, config)
    with ResultStore(out, resume=not fresh, identity=identity, allow_different=allow_different) as store:
        if execute is None:
            execute = in_process(environment, engine, tokenizer, sampling=sampling, limits=limits)
        summary = await run_jobs(jobs, execute, store, config)
    planned = {(job.task_id, job.sample) for job in jobs}
    results = [r for r in read_results(out) if (r.task_id, r.sample) in planned]
    report = build_report(results, samples=samples, threshold=threshold, run=identity)
    report["results"] = str(out)
    return report, summary


async def evaluate_run(
    spec: RunSpec | PreparedRun,
    out: str | os.PathLike[str],
    *,
    threshold: float = 1.0,
    fresh: bool = False,
    allow_different: bool = False,
    progress: bool = True,
) -> tuple[dict[str, Any], RunSummary]:
    """Run ``spec``'s rollouts (resuming ``out``) and report on exactly those; the report's ``run`` is
    the results header's identity. ``out`` may hold more (a larger evaluation): only this run's
    tasks and samples are reported."""
    from agentboost.rollout.run import prepare_run, run_rollouts_async

    run = spec if isinstance(spec, PreparedRun) else await prepare_run(spec)
    summary = await run_rollouts_async(
        run, out, fresh=fresh, allow_different=allow_different, only_planned=False, progress=progress
    )
    everything = list(read_results(out))
    planned = run.plan.within({(r.task_id, r.sample) for r in everything})
    results = [r for r in everything if (r.task_id, r.sample) in planned]
    report = build_report(results, samples=run.spec.samples, threshold=threshold, run=run.identity)
    report["results"] = str(out)
    return report, summary


def write_report(report: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return target


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"cannot read the evaluation report {path}: {error}") from error
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT:
        raise ConfigError(
            f"{path} is not an agentboost eval report (write one with agentboost eval --report)"
        )
    return report


def _number(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def summary_text(report: Mapping[str, Any]) -> str:
    """A one-screen summary of a report."""
    run = report.get("run", report)  # version 1 reports kept these at the top
    head = " ".join(
        str(run[key]) for key in ("environment", "split", "model", "engine") if run.get(key) is not None
    )
    rollouts, scored = report["rollouts"], report["scored"]
    coverage = f"coverage {scored}/{rollouts}" + (f" = {scored / rollouts:.1%}" if rollouts else "")
    incomplete = scored < rollouts
    mark = "*" if incomplete else ""
    failures = ", ".join(f"{reason} {count}" for reason, count in (report.get("failures") or {}).items())
    outcomes = (
        f"{scored} scored" + policy_failures_note(report.get("policy_failures")) + ", "
        f"{report.get('unscorable', 0)} unscorable, "
        f"{report.get('failed', rollouts - scored)} failed" + (f" ({failures})" if failures else "")
    )

    def pass_line(family: str) -> str:
        tasks, per_k = report["tasks"], report.get("tasks_per_k", {})
        cells = []
        for k, value in report[family].items():
            covered = per_k.get(k, tasks)
            cells.append(
                f"k={k}: {_number(value)}" + (f"* ({covered}/{tasks} tasks)" if covered < tasks else "")
            )
        return f"{family}  " + "  ".join(cells)

    baselines = [  # the environment records them (tau2): scripted policies on the same tasks
        f"{key[: -len(BASELINE_SUFFIX)].replace('_', '-')} {_number(value)}"
        for key, value in report.items()
        if key.endswith(BASELINE_SUFFIX) and value is not None
    ]
    baseline = f" (baselines: {', '.join(baselines)})" if baselines else ""
    lines = [
        f"{head}: {report['tasks']} tasks x {report['samples']} samples = {rollouts} rollouts "
        f"({outcomes}); success = reward >= {report['threshold']:g}",
        f"mean reward {_number(report['mean_reward'])}{mark}{baseline} | success rate "
        f"{_number(report['success_rate'])}{mark} | {coverage} (rates are over scored rollouts)",
        pass_line("pass@k"),
        pass_line("pass^k"),
        "endings " + ", ".join(f"{reason} {count}" for reason, count in report["terminations"].items()),
        f"turns {_number(report['turns_mean'])} | tool calls {_number(report['tool_calls_mean'])}"
        f" per rollout, {_number(report.get('tool_use_rate'))} of rollouts call a tool"
        f" | parse errors {report['parse_errors']} in {report['rollouts_with_parse_errors']} rollouts",
    ]
    for name, tool in report["tools"].items():
        statuses = ", ".join(f"{status} {count}" for status, count in tool.get("statuses", {}).items())
        lines.append(f"  tool {name}: {tool['calls']} calls, {tool['errors']} errors ({statuses})")
    if report.get("gateway"):
        gateway = report["gateway"]
        reasons = ", ".join(f"{reason} {count}" for reason, count in gateway["drift"].items()) or "none"
        lines.append(
            f"gateway: {gateway['sessions']} sessions, {gateway['rows']} training rows, "
            f"{gateway['forked_rollouts']} forked | drift {reasons}"
        )
    tokens, latency = report["tokens"], report["latency_s"]
    lines.append(
        f"tokens per rollout: generated {_number(tokens['generated_mean'])}, "
        f"total {_number(tokens['total_mean'])} | latency mean {_number(latency['mean'])} s, "
        f"p50 {_number(latency['p50'])} s, p90 {_number(latency['p90'])} s"
    )
    if incomplete:
        lines.append(
            f"* over {scored} of {rollouts} rollouts only: the others were unscorable or failed (not the "
            "policy's doing); resume the run to retry them"
        )
    return "\n".join(lines)


def compare_metrics(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(metric, value in A, value in B) for every metric either report has, in a stable order.

    An ending or a tool that only one report has is a share of 0 in the other (its tool error rate
    stays undefined); a metric a report lacks altogether is None.
    """
    reasons = list(dict.fromkeys([*a.get("terminations", {}), *b.get("terminations", {})]))
    tool_names = list(dict.fromkeys([*a.get("tools", {}), *b.get("tools", {})]))

    def flat(report: Mapping[str, Any]) -> dict[str, Any]:
        rollouts = report.get("rollouts") or 0

        def share(count: float) -> float | None:
            return count / rollouts if rollouts else None

        values: dict[str, Any] = {
            "rollouts": report.get("rollouts"),
            "scored": report.get("scored"),
            "unscored": report.get("unscored"),
            "coverage": report.get("coverage"),
            "mean reward": report.get("mean_reward"),
            "success rate": report.get("success_rate"),
        }
        for family in ("pass@", "pass^"):
            for k, value in report.get(family + "k", {}).items():
                values[family + k] = value
        for reason in reasons:
            values[f"termination {reason} (share)"] = share(report.get("terminations", {}).get(reason, 0))
        values["turns per rollout"] = report.get("turns_mean")
        values["tool calls per rollout"] = report.get("tool_calls_mean")
        values["rollouts calling a tool (share)"] = report.get("tool_use_rate")
        values["parse errors per rollout"] = share(report.get("parse_errors") or 0)
        for name in tool_names:
            tool = report.get("tools", {}).get(name, {})
            values[f"tool {name}: calls per rollout"] = share(tool.get("calls", 0))
            values[f"tool {name}: rollouts calling it (share)"] = share(tool.get("rollouts", 0))
            values[f"tool {name}: error rate"] = tool.get("error_rate")
        values["generated tokens per rollout"] = report.get("tokens", {}).get("generated_mean")
        values["latency mean (s)"] = report.get("latency_s", {}).get("mean")
        return values

    left, right = flat(a), flat(b)
    names = list(left) + [name for name in right if name not in left]
    return [(name, left.get(name), right.get(name)) for name in names]


def compare_text(a: Mapping[str, Any], b: Mapping[str, Any], labels: tuple[str, str] = ("A", "B")) -> str:
    """A Markdown table: metric, A, B, B - A."""
    lines = [
        f"| metric | {labels[0]} | {labels[1]} | {labels[1]} - {labels[0]} |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, left, right in compare_metrics(a, b):
        numeric = isinstance(left, int | float) and isinstance(right, int | float)
        delta = f"{right - left:+.3f}" if numeric else "n/a"
        lines.append(f"| {name} | {_number(left)} | {_number(right)} | {delta} |")
    return "\n".join(lines)
