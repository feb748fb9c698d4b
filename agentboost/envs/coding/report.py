"""The coding environment's report tables (``agentboost stats``, ``eval`` and ``view`` show them).

They read the coding reward's breakdown (``submitted``, ``tested_before_submit``, ``tests_passed``,
``tests_total``), ``reward_info["first_failure_status"]`` and the statuses the test tool recorded;
table meanings: docs/evaluation.md.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from agentboost.outcomes import RolloutResult
from agentboost.tables import (
    CALL_BUCKETS,
    GROUP_COLUMNS,
    Table,
    bucket,
    group_rows,
    ranked,
    reward_info,
    share,
    tool_results,
)

NO_SUBMISSION = "no submission"
UNTESTED = "submitted without testing"
TESTED = "submitted after testing"
SECTION = "Coding"


def _table(
    name: str, title: str, columns: list[str], rows: list[list[Any]], note: str | None = None
) -> Table:
    return Table(name, title, columns, rows, note=note, section=SECTION)


def coding_tables(
    results: Sequence[RolloutResult], threshold: float, test_tools: str | set[str], summary: dict[str, Any]
) -> list[Table]:
    """The coding section: submissions and testing, test-tool statuses and calls, first hidden-test
    failures; adds ``summary["coding"]``. Empty when no rollout has a coding reward breakdown."""
    test_names = {test_tools} if isinstance(test_tools, str) else set(test_tools)
    coding = [r for r in results if "submitted" in r.reward_breakdown]
    if not coding:
        return []
    total = len(coding)
    groups: dict[str, list[RolloutResult]] = defaultdict(list)
    for result in coding:
        breakdown = result.reward_breakdown
        if not breakdown.get("submitted"):
            groups[NO_SUBMISSION].append(result)
        elif breakdown.get("tested_before_submit"):
            groups[TESTED].append(result)
        else:
            groups[UNTESTED].append(result)
    summary["coding"] = {
        "rollouts": total,
        "no_submission": len(groups[NO_SUBMISSION]),
        "submitted_without_testing": len(groups[UNTESTED]),
        "submitted_after_testing": len(groups[TESTED]),
        "test_tools": sorted(test_names),
    }
    tables = [
        _table(
            "coding_submissions",
            "Submissions and testing (reward by category)",
            ["category", *GROUP_COLUMNS[1:]],
            group_rows(groups, (NO_SUBMISSION, UNTESTED, TESTED), total, threshold),
            note=(
                f"{total} rollouts with a coding reward breakdown"
                + (f" of {len(results)}" if total != len(results) else "")
                + "."
            ),
        )
    ]
    statuses: Counter[str] = Counter()
    per_rollout: dict[str, list[RolloutResult]] = defaultdict(list)
    for result in coding:
        calls = [fact for fact in tool_results(result) if fact["name"] in test_names]
        statuses.update(fact["status"] for fact in calls)
        per_rollout[bucket(len(calls))].append(result)
    calls_total = sum(statuses.values())
    tables.append(
        _table(
            "coding_test_calls",
            "Test-tool calls by status",
            ["status", "calls", "share"],
            [[status, count, share(count, calls_total)] for status, count in ranked(statuses)],
            note=f"test tool(s): {', '.join(sorted(test_names)) or 'none found'}; {calls_total} calls.",
        )
    )
    tables.append(
        _table(
            "coding_test_calls_per_rollout",
            "Test-tool calls per rollout",
            ["test calls", *GROUP_COLUMNS[1:]],
            group_rows(per_rollout, CALL_BUCKETS, total, threshold),
        )
    )
    first_failures = Counter(
        str(reward_info(r).get("first_failure_status") or "none (all passed)")
        for r in coding
        if r.reward_breakdown.get("submitted")
    )
    passed = [
        r.reward_breakdown.get("tests_passed", 0.0) for r in coding if r.reward_breakdown.get("submitted")
    ]
    totals = [
        r.reward_breakdown.get("tests_total", 0.0) for r in coding if r.reward_breakdown.get("submitted")
    ]
    tables.append(
        _table(
            "coding_first_failure",
            "Hidden tests: status of the first failure (submitted rollouts)",
            ["first failure", "rollouts", "share"],
            [
                [status, count, share(count, sum(first_failures.values()))]
                for status, count in ranked(first_failures)
            ],
            note=(
                f"hidden tests passed: {sum(passed):g} of {sum(totals):g}"
                + (f" ({sum(passed) / sum(totals):.1%})" if sum(totals) else "")
            ),
        )
    )
    return tables
