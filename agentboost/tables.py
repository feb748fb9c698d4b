"""The report-table kit: one :class:`Table`, and the helpers tables about rollouts are built with.

``agentboost stats``, ``eval`` and ``view`` show tables; an environment adds its own with
:meth:`~agentboost.envs.base.Environment.report_tables` (the coding environment's:
:mod:`agentboost.envs.coding.report`), built from these: ``bucket``, ``ranked``, ``share``,
``group_rows``, ``reward_info`` and ``tool_results``. It sits beside :mod:`agentboost.outcomes`, below
environments and the evaluator, so an environment never imports the evaluator to build a table.
Table meanings: docs/evaluation.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentboost.outcomes import RolloutResult, reward_summary

__all__ = [
    "CALL_BUCKETS",
    "GROUP_COLUMNS",
    "Table",
    "bucket",
    "cell_text",
    "group_rows",
    "ranked",
    "reward_info",
    "share",
    "tool_results",
]

CALL_BUCKETS = ("0", "1", "2", "3", "4", "5-9", "10+")


@dataclass
class Table:
    """One table: a stable ``name`` (the JSON key), a title, column names and rows."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str | None = None
    section: str | None = None
    """The heading it appears under in Markdown (an environment's own tables: e.g. ``Coding``)."""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"title": self.title, "columns": self.columns, "rows": self.rows}
        if self.note:
            data["note"] = self.note
        return data

    def to_markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("| " + " | ".join("---" if i == 0 else "---:" for i in range(len(self.columns))) + " |")
        for row in self.rows:
            lines.append("| " + " | ".join(cell_text(value) for value in row) + " |")
        if not self.rows:
            lines.append("| (none) |" + " |" * (len(self.columns) - 1))
        return "\n".join(lines)


def cell_text(value: Any) -> str:
    """One table cell as Markdown text: ``n/a`` for None, floats to three decimals."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def bucket(count: int) -> str:
    if count < 5:
        return str(count)
    return "5-9" if count < 10 else "10+"


def ranked(counter: Mapping[str, int]) -> list[tuple[str, int]]:
    """Most frequent first; ties in name order (so tables do not depend on file order)."""
    return sorted(counter.items(), key=lambda item: (-item[1], item[0]))


def share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def reward_info(result: RolloutResult) -> Mapping[str, Any]:
    """Non-numeric reward facts (e.g. a coding reward's first failure status), when recorded."""
    return getattr(result, "reward_info", None) or {}


def tool_results(result: RolloutResult) -> list[dict[str, Any]]:
    """Every tool result of a rollout, as (name, status, error, latency) facts.

    ``status`` is what the tool recorded in ``metadata["status"]``, else ``error`` / ``ok`` from
    the result's error flag. Results of tool calls that could not be parsed have ``name`` None.
    """
    facts = []
    for message in result.trajectory.messages:
        if message.get("role") != "tool":
            continue
        metadata = message.get("metadata") or {}
        error = bool(message.get("error"))
        status = metadata.get("status") if isinstance(metadata, Mapping) else None
        latency = None
        if isinstance(metadata, Mapping):
            for key in ("duration_s", "latency_s"):
                if isinstance(metadata.get(key), int | float):
                    latency = float(metadata[key])
                    break
        facts.append(
            {
                "name": message.get("name"),
                "status": str(status) if status is not None else ("error" if error else "ok"),
                "recorded_status": status is not None,
                "error": error,
                "latency_s": latency,
            }
        )
    return facts


def group_rows(
    groups: Mapping[str, list[RolloutResult]], order: Sequence[str], total: int, threshold: float
) -> list[list[Any]]:
    rows = []
    for key in order:
        members = groups.get(key, [])
        rewards = reward_summary(members, threshold=threshold)
        rows.append(
            [
                key,
                len(members),
                share(len(members), total),
                rewards.mean,
                rewards.success_rate,
                rewards.coverage,
            ]
        )
    return rows


GROUP_COLUMNS = ["", "rollouts", "share", "mean reward", "success rate", "coverage"]
"""Mean reward and success rate are over the group's scored rollouts; coverage is scored / rollouts."""
