"""Grading programs against test cases: stdin/stdout, function calls (LiveCodeBench/DeepCoder), HumanEval."""

from __future__ import annotations

import textwrap

import pytest
from sandbox_support import run

from agentboost.errors import ConfigError
from agentboost.sandbox import (
    SandboxLimits,
    SandboxPool,
    TestStatus,
    outputs_match,
    run_function_tests,
    run_humaneval_test,
    run_stdio_tests,
)

ADD = "a, b = map(int, input().split())\nprint(a + b)"


def test_outputs_match_tolerates_trailing_whitespace_only():
    assert outputs_match("3\n", "3")
    assert outputs_match("1 2\n3\n", "1 2   \n3\t\n\n\n")
    assert outputs_match("a\r\nb\r\n", "a\nb")
    assert not outputs_match("1 2\n", "1  2\n")  # inner whitespace counts
    assert not outputs_match(" 3\n", "3\n")  # so does leading whitespace
    assert not outputs_match("3\n\n4\n", "3\n4\n")  # and blank lines inside the output


def test_stdio_tests_pass_with_trailing_whitespace_and_report_a_wrong_answer():
    tests = [
        {"input": "1 2\n", "output": "3\n"},
        {"input": "10 20\n", "output": "30   \n\n"},
        {"input": "2 2\n", "output": "5\n"},
    ]
    report = run(run_stdio_tests(ADD, tests))
    assert (report.passed, report.total) == (2, 3)
    assert [result.status for result in report.results] == [
        TestStatus.PASSED,
        TestStatus.PASSED,
        TestStatus.WRONG_ANSWER,
    ]
    failure = report.first_failure
    assert failure is not None and failure.index == 2
    assert failure.detail == "line 1: expected '5', got '4'"
    assert (failure.expected, failure.actual) == ("5\n", "4\n")
    assert report.summary() == "2/3 tests passed; test 2: wrong_answer (line 1: expected '5', got '4')"


def test_one_crashing_and_one_hanging_test_do_not_hide_the_others():
    program = textwrap.dedent(
        """\
        value = input().strip()
        if value == "crash":
            raise ValueError("bad input")
        if value == "hang":
            while True:
                pass
        print(value)
        """
    )
    tests = [
        {"input": "a\n", "output": "a\n"},
        {"input": "crash\n", "output": "x\n"},
        {"input": "hang\n", "output": "y\n"},
        {"input": "b\n", "output": "b\n"},
    ]
    report = run(run_stdio_tests(program, tests, limits=SandboxLimits(timeout_s=1.0)))
    assert [result.status for result in report.results] == [
        TestStatus.PASSED,
        TestStatus.RUNTIME_ERROR,
        TestStatus.TIMEOUT,
        TestStatus.PASSED,
    ]
    assert report.results[1].detail == "ValueError: bad input"
    assert report.pass_rate == 0.5 and not report.all_passed


def test_fail_fast_skips_what_is_left_after_the_first_failure():
    tests = [{"input": "1 1\n", "output": "3\n"}] + [{"input": "1 1\n", "output": "2\n"}] * 6

    async def main():
        async with SandboxPool(size=1) as pool:
            return await run_stdio_tests(ADD, tests, pool=pool, fail_fast=True)

    report = run(main())
    assert report.results[0].status is TestStatus.WRONG_ANSWER
    assert report.results[-1].status is TestStatus.SKIPPED
    assert report.total == 7


TWO_SUM = textwrap.dedent(
    """\
    class Solution:
        def twoSum(self, nums: List[int], target: int) -> List[int]:
            seen = {}
            for index, number in enumerate(nums):
                if target - number in seen:
                    return [seen[target - number], index]
                seen[number] = index
            return []
    """
)


def test_function_tests_call_solution_methods_with_livecodebench_inputs():
    tests = [
        {"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]"},
        {"input": [[3, 2, 4], 6], "output": [1, 2]},  # already parsed arguments work too
        {"input": "[3, 3]\n6", "output": "[1, 0]"},
    ]
    report = run(run_function_tests(TWO_SUM, tests, "twoSum"))
    assert [result.status for result in report.results] == [
        TestStatus.PASSED,
        TestStatus.PASSED,
        TestStatus.WRONG_ANSWER,
    ]
    assert report.results[2].detail == "expected [1, 0], got [0, 1]"


def test_function_tests_accept_a_top_level_function_and_compare_as_json():
    program = "def pair(a, b):\n    print('debug output is fine')\n    return (a, {'sum': a + b})"
    report = run(run_function_tests(program, [{"input": "1\n2", "output": '[1, {"sum": 3}]'}], "pair"))
    assert report.all_passed, report.summary()


def test_function_test_failures_say_what_went_wrong():
    program = textwrap.dedent(
        """\
        def f(x):
            if x == 0:
                return 1 / x
            if x == 1:
                return {1, 2}
            if x == 2:
                return [0] * (10 ** 10)  # refused at once: a MemoryError, no memory used
            if x == 3:
                chunks = []
                while True:
                    chunks.append(bytearray(16 * 1024 * 1024))
            return x
        """
    )
    tests = [{"input": str(x), "output": str(x)} for x in range(5)]
    report = run(run_function_tests(program, tests, "f", limits=SandboxLimits(memory_mb=256)))
    statuses = [result.status for result in report.results]
    assert statuses == [
        TestStatus.RUNTIME_ERROR,
        TestStatus.WRONG_ANSWER,
        TestStatus.RUNTIME_ERROR,
        TestStatus.MEMORY_EXCEEDED,
        TestStatus.PASSED,
    ]
    assert report.results[0].detail == "ZeroDivisionError: division by zero"
    assert report.results[2].detail == "MemoryError"
    assert "returned a set, which is not a JSON value" in report.results[1].detail
    missing = run(run_function_tests("def g():\n    pass", [{"input": "1", "output": "1"}], "f"))
    assert missing.results[0].status is TestStatus.RUNTIME_ERROR
    assert "neither Solution.f nor a function f" in missing.results[0].detail


def test_expected_outputs_never_reach_the_sandbox():
    snoop = textwrap.dedent(
        """\
        import gc, sys
        def answer(x):
            strings = [o for o in gc.get_objects() if isinstance(o, (str, dict, list))]
            for frame in (sys._getframe(depth) for depth in range(1, 3)):
                strings.append(repr(frame.f_locals))
            marker = "expected-" + "7f3a"  # built here: the program text itself must not contain it
            found = [s for s in map(str, strings) if marker in s]
            return found[0] if found else "not found"
        """
    )
    report = run(run_function_tests(snoop, [{"input": "1", "output": '"expected-7f3a"'}], "answer"))
    assert report.results[0].status is TestStatus.WRONG_ANSWER
    assert report.results[0].actual == '"not found"'


def test_malformed_tests_raise_config_errors():
    with pytest.raises(ConfigError, match="needs 'input' and 'output'"):
        run(run_stdio_tests(ADD, [{"input": "1 2"}]))
    with pytest.raises(ConfigError, match="not JSON"):
        run(run_function_tests(TWO_SUM, [{"input": "[1, 2\n3", "output": "[0]"}], "twoSum"))
    with pytest.raises(ConfigError, match="identifier"):
        run(run_function_tests(TWO_SUM, [], "two sum"))


HUMANEVAL_PROMPT = 'def add(x: int, y: int) -> int:\n    """Add two numbers."""\n'
HUMANEVAL_TEST = textwrap.dedent(
    """\
    METADATA = {}


    def check(candidate):
        assert candidate(1, 2) == 3
        assert candidate(-1, 1) == 0
        assert candidate(20, 22) == 42
    """
)


def test_humaneval_check_passes_a_correct_completion():
    report = run(run_humaneval_test(HUMANEVAL_PROMPT + "    return x + y\n", HUMANEVAL_TEST, "add"))
    assert report.all_passed and report.total == 1


def test_humaneval_failing_assert_is_a_wrong_answer_naming_the_assert():
    report = run(run_humaneval_test(HUMANEVAL_PROMPT + "    return x + y + (x < 0)\n", HUMANEVAL_TEST, "add"))
    failure = report.first_failure
    assert failure is not None and failure.status is TestStatus.WRONG_ANSWER
    assert failure.detail == "an assertion in check() failed: assert candidate(-1, 1) == 0"


def test_humaneval_exception_is_a_runtime_error():
    report = run(run_humaneval_test(HUMANEVAL_PROMPT + "    return x + undefined\n", HUMANEVAL_TEST, "add"))
    assert report.results[0].status is TestStatus.RUNTIME_ERROR
    assert report.results[0].detail == "NameError: name 'undefined' is not defined"
