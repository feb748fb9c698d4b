"""Tool-usage statistics over rollout results, for any environment, plus each environment's own tables.

Every number comes from recorded fields, never from the text: ``termination``, ``metrics``, assistant
``tool_calls``, tool results' ``name`` / ``error`` / ``metadata.status`` (what the tool itself
recorded, e.g. a test run's ``passed`` or ``wrong_output``) and segments' ``parse_errors``. An
environment adds tables about its own rollouts with :meth:`Environment.report_tables` (the coding
environment's submissions and tests: :mod:`agentboost.envs.coding.report`), built with the table kit
in :mod:`agentboost.tables` (its names are importable from here too). Table meanings:
docs/evaluation.md.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentboost.outcomes import RolloutResult, reward_summary
from agentboost.tables import (
    CALL_BUCKETS,
    GROUP_COLUMNS,
    Table,
    bucket,
    cell_text,
    group_rows,
    ranked,
    reward_info,
    share,
    tool_results,
)

__all__ = [
    "CALL_BUCKETS",
    "GROUP_COLUMNS",
    "Stats",
    "Table",
    "bucket",
    "environment_tables",
    "gateway_drift",
    "group_rows",
    "ranked",
    "reward_info",
    "share",
    "tool_results",
    "tool_usage_stats",
]


@dataclass
class Stats:
    """The summary numbers and the tables (what ``agentboost stats`` prints and writes)."""

    summary: dict[str, Any]
    tables: list[Table] = field(default_factory=list)

    def table(self, name: str) -> Table:
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "tables": {table.name: table.to_dict() for table in self.tables}}

    def to_markdown(self) -> str:
        summary = self.summary
        failures = ", ".join(f"{reason} {count}" for reason, count in summary["failures"].items())
        mark = "*" if summary["scored"] < summary["rollouts"] else ""
        head = (
            f"{summary['rollouts']} rollouts of {summary['tasks']} tasks: {summary['scored']} scored"
            + policy_failures_note(summary.get("policy_failures"))
            + ", "
            f"{summary['unscorable']} unscorable, {summary['failed']} failed"
            + (f" ({failures})" if failures else "")
            + f"; mean reward {cell_text(summary['mean_reward'])}{mark}, success rate "
            f"{cell_text(summary['success_rate'])}{mark} (reward >= {summary['threshold']:g}; over scored "
            f"rollouts, coverage {cell_text(summary['coverage'])})"
        )
        parts = ["## Rollout statistics", "", head]
        section = None
        for table in self.tables:
            if table.section is not None and table.section != section:
                parts += ["", f"## {table.section}"]
            section = table.section
            parts += ["", table.to_markdown()]
        return "\n".join(parts) + "\n"

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def tool_usage_stats(
    results: Iterable[RolloutResult], *, threshold: float = 1.0, test_tool: str | None = None
) -> Stats:
    """Compute the summary and tables over ``results`` (see the module docstring for the sources).

    ``threshold``: a scored rollout succeeds when its reward is at least this. ``test_tool``: the
    coding section's test tool; by default every tool whose results record a ``metadata.status``.
    """
    results = list(results)
    total = len(results)
    rewards = reward_summary(results, threshold=threshold)
    metrics = [r.trajectory.metrics for r in results]
    latencies = [float(m["latency_s"]) for m in metrics if isinstance(m.get("latency_s"), int | float)]
    parse_kinds: Counter[str] = Counter()
    parse_rollouts: Counter[str] = Counter()
    for result in results:
        kinds = [kind for segment in result.trajectory.segments for kind in segment.parse_errors]
        parse_kinds.update(kinds)
        parse_rollouts.update(set(kinds))
    parse_total = sum(int(m.get("parse_errors") or 0) for m in metrics)
    summary: dict[str, Any] = {
        "rollouts": total,
        "tasks": len({r.task_id for r in results}),
        "scored": rewards.scored,
        "unscored": total - rewards.scored,
        "unscorable": rewards.unscorable,
        "policy_failures": rewards.policy_failures,
        "failed": rewards.failed,
        "failures": rewards.failures,
        "coverage": rewards.coverage,
        "threshold": threshold,
        "mean_reward": rewards.mean,
        "success_rate": rewards.success_rate,
        "turns_mean": _mean([float(m.get("turns") or 0) for m in metrics]),
        "tool_calls_mean": _mean([float(m.get("tool_calls") or 0) for m in metrics]),
        "tool_calls_total": sum(int(m.get("tool_calls") or 0) for m in metrics),
        "tool_use_rate": share(sum(1 for m in metrics if int(m.get("tool_calls") or 0)), total),
        "parse_errors_total": parse_total,
        "rollouts_with_parse_errors": sum(1 for m in metrics if int(m.get("parse_errors") or 0)),
        "generated_tokens_total": sum(r.trajectory.generated_tokens for r in results),
        "generated_tokens_mean": _mean([float(r.trajectory.generated_tokens) for r in results]),
        "prompt_tokens_mean": _mean([float(m.get("prompt_tokens") or 0) for m in metrics]),
        "total_tokens_mean": _mean([float(len(r.trajectory.token_ids)) for r in results]),
        "latency_s_mean": _mean(latencies),
        "latency_s_p50": _quantile(latencies, 0.5),
        "latency_s_p90": _quantile(latencies, 0.9),
        "terminations": dict(Counter(r.termination.value for r in results).most_common()),
    }
    tables = []

    by_ending: dict[str, list[RolloutResult]] = defaultdict(list)
    for result in results:
        by_ending[result.termination.value].append(result)
    endings = sorted(by_ending, key=lambda reason: (-len(by_ending[reason]), reason))
    tables.append(
        Table(
            "terminations",
            "Termination reasons",
            ["reason", *GROUP_COLUMNS[1:]],
            group_rows(by_ending, endings, total, threshold),
        )
    )

    per_tool: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"calls": 0, "errors": 0, "rollouts": 0, "latency": [], "statuses": Counter()}
    )
    status_tools: set[str] = set()
    for result in results:
        used = set()
        for fact in tool_results(result):
            if fact["name"] is None:
                continue  # a call that could not be parsed: counted under parse errors
            entry = per_tool[fact["name"]]
            entry["calls"] += 1
            entry["errors"] += fact["error"]
            entry["statuses"][fact["status"]] += 1
            if fact["latency_s"] is not None:
                entry["latency"].append(fact["latency_s"])
            if fact["recorded_status"]:
                status_tools.add(fact["name"])
            used.add(fact["name"])
        for name in used:
            per_tool[name]["rollouts"] += 1
    names = sorted(per_tool, key=lambda name: (-per_tool[name]["calls"], name))
    tables.append(
        Table(
            "tools",
            "Tool calls",
            ["tool", "calls", "errors", "error rate", "rollouts using it", "mean latency (s)"],
            [
                [
                    name,
                    per_tool[name]["calls"],
                    per_tool[name]["errors"],
                    share(per_tool[name]["errors"], per_tool[name]["calls"]),
                    per_tool[name]["rollouts"],
                    _mean(per_tool[name]["latency"]),
                ]
                for name in names
            ],
            note="Results of calls that could not be parsed are counted under parse errors, not here.",
        )
    )
    tables.append(
        Table(
            "tool_status",
            "Tool results by status",
            ["tool", "status", "calls", "share of the tool's calls"],
            [
                [name, status, count, share(count, per_tool[name]["calls"])]
                for name in names
                for status, count in sorted(
                    per_tool[name]["statuses"].items(), key=lambda kv: (-kv[1], kv[0])
                )
            ],
            note="status: the tool's metadata.status, else ok / error from the result's error flag.",
        )
    )

    by_calls: dict[str, list[RolloutResult]] = defaultdict(list)
    for result in results:
        by_calls[bucket(int(result.trajectory.metrics.get("tool_calls") or 0))].append(result)
    tables.append(
        Table(
            "calls_per_rollout",
            "Tool calls per rollout",
            ["tool calls", *GROUP_COLUMNS[1:]],
            group_rows(by_calls, CALL_BUCKETS, total, threshold),
        )
    )
    tables.append(
        Table(
            "parse_errors",
            "Parse errors (malformed tool calls and turns)",
            ["kind", "occurrences", "rollouts"],
            [[kind, count, parse_rollouts[kind]] for kind, count in ranked(parse_kinds)],
            note=(
                f"{parse_total} parse errors in {summary['rollouts_with_parse_errors']} of {total} rollouts."
            ),
        )
    )

    drift = gateway_drift(results)
    if drift is not None:
        tables.append(
            Table(
                "gateway_drift",
                "Gateway drift (agents that rewrote their history)",
                ["reason", "occurrences"],
                [[reason, count] for reason, count in drift["drift"].items()],
                note=(
                    f"{drift['sessions']} gateway sessions gave {drift['rows']} training rows; "
                    f"{drift['forked_rollouts']} rollouts forked (see docs/gateway.md)."
                ),
            )
        )
    tables += environment_tables(
        results, threshold=threshold, summary=summary, test_tool=test_tool or status_tools
    )
    return Stats(summary, tables)


def gateway_drift(results: Iterable[RolloutResult]) -> dict[str, Any] | None:
    """Over gateway rollouts: sessions, training rows, rollouts that forked, drift reasons. None if none."""
    sessions = [r for r in results if isinstance(r.trajectory.info.get("gateway"), Mapping)]
    if not sessions:
        return None
    reasons: Counter[str] = Counter(
        event["reason"] for r in sessions for event in r.trajectory.info["gateway"].get("drift", ())
    )
    return {
        "sessions": len(sessions),
        "rows": sum(len(r.trajectory.training_rows) for r in sessions),
        "forked_rollouts": sum(1 for r in sessions if r.trajectory.forked_rows),
        "drift": dict(ranked(reasons)),
    }


def environment_tables(
    results: Sequence[RolloutResult], *, threshold: float, summary: dict[str, Any], test_tool: str | set[str]
) -> list[Table]:
    """The tables each environment adds about its own rollouts (:meth:`Environment.report_tables`),
    for the environments named in the results' ``info["environment"]`` that this process can find:
    a registered name, or an Environment subclass already imported."""
    from agentboost.envs.registry import environment_class_named

    by_environment: dict[str, list[RolloutResult]] = defaultdict(list)
    for result in results:
        name = result.trajectory.info.get("environment")
        if isinstance(name, str):
            by_environment[name].append(result)
    tables: list[Table] = []
    for name in sorted(by_environment):
        environment = environment_class_named(name)
        if environment is not None:
            tables += environment.report_tables(
                by_environment[name], threshold=threshold, summary=summary, test_tool=test_tool
            )
    return tables


def policy_failures_note(count: int | None) -> str:
    """What follows a scored count when some of those rollouts failed in a way the policy caused."""
    return f" ({count} policy failures at the failure reward)" if count else ""
