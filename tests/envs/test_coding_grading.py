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
            return await grading.run_public_tests(pool, task, program, LIMITS, **kwargs)

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


# --- which tests a reward runs, and how stdout is compared ------------------------------------------

# short inputs are the hard ones: a program that is right on the 20 long inputs and wrong on every
# short one (the public example included) passed the old default, "the 15 longest hidden tests"
SHORT_HARD = CodingTask(
    id="short-hard",
    problem="print the number of characters of the line",
    test_type="stdio",
    public_tests=[{"input": "ab\n", "output": "2\n"}],
    hidden_tests=[
        {"input": "ab\n", "output": "2\n"},
        {"input": "a\n", "output": "1\n"},
        {"input": "\n", "output": "0\n"},
        *({"input": "x" * (100 + n) + "\n", "output": f"{100 + n}\n"} for n in range(20)),
    ],
)
RIGHT_ON_LONG_ONLY = "line = input()\nprint(len(line) if len(line) >= 100 else 99)\n"


def test_every_hidden_test_runs_by_default_so_short_inputs_that_fail_are_caught():
    assert grade(SHORT_HARD, "print(len(input()))\n").all_passed  # the right program passes
    graded = grade(SHORT_HARD, RIGHT_ON_LONG_ONLY)
    assert (graded.passed, graded.total, graded.all_passed) == (20, 23, False)
    old_default = sorted(range(23), key=lambda i: -len(SHORT_HARD.hidden_tests[i]["input"]))[:15]
    assert all(len(SHORT_HARD.hidden_tests[i]["input"]) > 100 for i in old_default)  # why it scored 1.0


def test_a_capped_reward_always_runs_the_public_tests_plus_a_seeded_sample():
    picked = grading.capped_tests(SHORT_HARD, 5)
    assert picked[0] == SHORT_HARD.public_tests[0] and len(picked) == 5
    assert picked == grading.capped_tests(SHORT_HARD, 5)  # the same sample every time
    assert picked != grading.capped_tests(SHORT_HARD, 5, seed=1)  # another seed, another sample
    assert grading.capped_tests(SHORT_HARD, None) == SHORT_HARD.hidden_tests
    assert not grade(SHORT_HARD, RIGHT_ON_LONG_ONLY, max_tests=5).all_passed  # the shown example fails


FLOAT = CodingTask(
    id="third",
    problem="print 1/3 and 2/3",
    test_type="stdio",
    hidden_tests=[{"input": "", "output": "0.333333 0.666667\n"}],
)


def test_stdout_numbers_match_within_tolerance_unless_exact_text_is_asked_for():
    precise = "print(1 / 3, 2 / 3)\n"  # 0.3333333333333333 0.6666666666666666
    assert grade(FLOAT, precise).all_passed
    assert not grade(FLOAT, precise, compare="exact").all_passed
    assert grade(FLOAT, "print('0.333333 0.666667')\n", compare="exact").all_passed
    assert not grade(FLOAT, "print(0.3334, 2 / 3)\n").all_passed  # 1e-4 off: beyond 1e-5 relative
    assert not grade(STDIO, "a, b = map(int, input().split())\nprint(a + b + 0.5)\n").all_passed


@pytest.mark.parametrize(
    ("expected", "got", "same"),
    [
        ("3.14159\n", "3.141590000\n", True),
        ("1 2.5 x\n", "1 2.50000001 x\n", True),
        ("3.0\n", "3\n", True),  # as the APPS/TACO graders: not all integers, so compared as floats
        ("10\n", "11\n", False),
        ("100000000000000000001\n", "100000000000000000000\n", False),  # integers are exact
        ("nan\n", "nan\n", True),  # equal text
        ("1.0\n", "nan\n", False),
        ("1.0\n", "1e400\n", False),
        ("1000.0\n", "1_000\n", False),
        ("YES\n", "yes\n", False),
    ],
)
def test_float_tolerance_rules(expected, got, same):
    from agentboost.sandbox.testcases import outputs_match

    assert outputs_match(expected, got, "float") is same
    assert outputs_match(expected, got, "exact") is (expected == got)
