"""Grading programs in the real sandbox: hostile programs fail with the right status, HumanEval agrees."""

from __future__ import annotations

import asyncio

import pytest

from agentboost.envs.coding import grading
from agentboost.envs.coding.data import humaneval_rows, humaneval_task
from agentboost.envs.coding.task import CodingTask
from agentboost.sandbox import SandboxLimits, SandboxPool

LIMITS = SandboxLimits(timeout_s=2, memory_mb=256)
STDIO = CodingTask(
    id="sum",
    problem="print a + b",
    test_type="stdio",
    public_tests=[{"input": "1 2\n", "output": "3\n"}],
    hidden_tests=[{"input": "1 2\n", "output": "3\n"}, {"input": "7777777 1\n", "output": "7777778\n"}],
)
FUNCTION = CodingTask(
    id="add",
    problem="return a + b",
    test_type="function",
    fn_name="add",
    public_tests=[{"input": "1\n2", "output": "3"}],
    hidden_tests=[{"input": "1\n2", "output": "3"}, {"input": "7777777\n1", "output": "7777778"}],
)

HOSTILE = {
    "hangs": ("while True:\n    pass\n", "timeout"),
    "sleeps": ("import time\ntime.sleep(60)\n", "timeout"),
    "raises": ("raise ValueError('no')\n", "runtime_error"),
    "segfaults": ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "runtime_error"),
    "floods output": ("while True:\n    print('x' * 1000)\n", "output_limit"),
    "eats memory": ("block = bytearray(2 * 1024 ** 3)\n", "memory"),
    "does not compile": ("def solve(:\n    pass\n", "compile_error"),
    "exits early": ("import sys\nsys.exit(3)\n", "runtime_error"),
}


def grade(task: CodingTask, program: str, *, hidden: bool = True, **kwargs) -> grading.Grade:
    async def main() -> grading.Grade:
        async with SandboxPool(size=2, limits=LIMITS) as pool:
            if hidden:
                return await grading.run_hidden_tests(pool, task, program, LIMITS, **kwargs)
            return await grading.run_public_tests(pool, task, program, LIMITS)

    return asyncio.run(main())


@pytest.mark.parametrize("behaviour", sorted(HOSTILE))
def test_hostile_stdio_programs_fail_with_the_right_status(behaviour):
    program, status = HOSTILE[behaviour]
    result = grade(STDIO, program)
    assert result.status == status and result.passed == 0 and not result.all_passed
    if status == "compile_error":
        assert "SyntaxError" in result.compile_error and result.cases == []
    else:
        assert result.first_failure.status == status


@pytest.mark.parametrize("behaviour", ["hangs", "raises", "floods output", "eats memory", "does not compile"])
def test_hostile_function_programs_fail_with_the_right_status(behaviour):
    body, status = HOSTILE[behaviour]
    program = "def add(a, b):\n" + "".join("    " + line + "\n" for line in body.splitlines())
    if behaviour == "does not compile":
        program = body
    assert grade(FUNCTION, program).status == status


def test_a_program_that_reads_files_finds_no_hidden_answers():
    snoop = (
        "import os, sys\n"
        "seen = sys.stdin.read()\n"
        "for root, dirs, files in os.walk('.'):\n"
        "    for name in files:\n"
        "        seen += open(os.path.join(root, name), errors='replace').read()\n"
        "for path in ('expected_output.txt', 'tests.json', '/tmp/tests.json'):\n"
        "    try:\n"
        "        seen += open(path).read()\n"
        "    except OSError:\n"
        "        pass\n"
        "print(repr(seen))\n"
    )
    result = grade(STDIO, snoop)
    assert result.status == "wrong_output" and result.passed == 0
    assert all("7777778" not in (case.got or "") for case in result.cases)
    function_snoop = "def add(a, b):\n" + "".join("    " + line + "\n" for line in snoop.splitlines())
    function_snoop += "    return seen\n"
    result = grade(FUNCTION, function_snoop)
    assert result.status == "wrong_output"
    assert all("7777778" not in (case.got or "") for case in result.cases)


def test_fail_fast_stops_at_the_first_failure_and_marks_the_rest_skipped():
    slow_wrong = (
        "import time\na, b = map(int, input().split())\nif a > 100:\n    time.sleep(60)\nprint(a + b)\n"
    )
    result = grade(STDIO, slow_wrong, fail_fast=True)
    assert result.status == "timeout" and not result.all_passed


def test_public_report_shows_expected_and_got_for_failures():
    from agentboost.envs.coding.grading import format_report

    result = grade(STDIO, "print(42)\n", hidden=False)
    report = format_report(result)
    assert report.startswith("status: wrong_output (0 of 1 public examples passed)")
    assert "input: 1 2" in report and "expected: 3" in report and "got: 42" in report
    crash = format_report(grade(STDIO, "raise KeyError('boom')\n", hidden=False))
    assert "status: runtime_error" in crash and "KeyError: 'boom'" in crash


# --- HumanEval: the reward agrees with HumanEval's own semantics on all 164 problems -------------


def _humaneval_grades(programs, mode: str):
    limits = SandboxLimits(timeout_s=10, memory_mb=1024)
    tasks = [humaneval_task(row) for row in humaneval_rows()]

    async def main():
        async with SandboxPool(size=2, limits=limits) as pool:
            return await asyncio.gather(
                *(
                    grading.run_hidden_tests(pool, task, program, limits, humaneval_mode=mode)
                    for task, program in zip(tasks, programs(tasks), strict=True)
                )
            )

    return tasks, asyncio.run(main())


def _canonical(tasks):
    return [task.metadata["canonical_solution"] for task in tasks]  # a body: joined to the prompt


def _broken(tasks):
    return [
        task.starter_code[task.starter_code.index(f"def {task.fn_name}") :] + "    return None\n"
        for task in tasks
    ]


@pytest.mark.parametrize("mode", ["one_run", pytest.param("per_case", marks=pytest.mark.slow)])
def test_every_humaneval_canonical_solution_scores_one_and_a_broken_variant_zero(mode):
    tasks, good = _humaneval_grades(_canonical, mode)
    assert len(tasks) == 164
    assert [task.id for task, g in zip(tasks, good, strict=True) if not g.all_passed] == []
    _, bad = _humaneval_grades(_broken, mode)
    assert [task.id for task, g in zip(tasks, bad, strict=True) if g.all_passed] == []


FORGERIES = {
    "exits before check()": "import os\nos._exit(0)\n",
    "sys.exit(0)": "import sys\nsys.exit(0)\n",
    "equal to everything": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n\n"
        "def has_close_elements(numbers, threshold):\n    return Anything()\n"
    ),
}


@pytest.mark.skipif(
    not grading.HUMANEVAL_CHECKER,
    reason="needs the hardened sandbox (issue #9): check() must run where the program cannot reach it",
)
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_humaneval_verdicts_cannot_be_forged_by_the_submission(forgery):
    task = humaneval_task(humaneval_rows()[0])
    assert not grade(task, FORGERIES[forgery]).all_passed
