"""Running a program against a coding task's public or hidden tests, with one status vocabulary.

Statuses (the tool's reports, the trajectory's tool metadata and the reward's ``first_failure_status``
all use these words):

    passed          every test passed
    wrong_output    the program ran but printed / returned something else
    runtime_error   an uncaught exception, a non-zero exit, or a crash (killed by a signal)
    timeout         the wall-clock or CPU-time limit of the task ran out
    compile_error   the program is not valid Python (found before anything runs)
    memory          the program ran out of its memory limit
    output_limit    it wrote more than the sandbox keeps (64 KiB by default) and was killed
    sandbox_error   the sandbox itself failed; the program's behaviour is unknown
    no_tests        the task has no public tests to run (the tool only)
    skipped         not run: an earlier test failed and grading stopped there

Stdin/stdout and function-call tests run through :mod:`agentboost.sandbox.testcases`, one sandbox run
per test case, and the expected outputs never enter the sandbox. HumanEval hidden tests run the dataset's
``check(candidate)`` with :func:`~agentboost.sandbox.run_humaneval_test`, either as one run
(``humaneval_mode="one_run"``, HumanEval's own semantics) or one run per top-level assertion of
``check`` (``"per_case"``, which counts passed assertions).
"""

from __future__ import annotations

import ast
import asyncio
import copy
import inspect
import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentboost.envs.coding.task import CodingTask
from agentboost.sandbox import (
    SandboxLimits,
    SandboxPool,
    SandboxResult,
    SandboxStatus,
    TestReport,
    TestResult,
    TestStatus,
    run_function_tests,
    run_humaneval_test,
    run_stdio_tests,
)

PASSED = "passed"
WRONG_OUTPUT = "wrong_output"
RUNTIME_ERROR = "runtime_error"
TIMEOUT = "timeout"
COMPILE_ERROR = "compile_error"
MEMORY = "memory"
OUTPUT_LIMIT = "output_limit"
SANDBOX_ERROR = "sandbox_error"
NO_TESTS = "no_tests"
SKIPPED = "skipped"

STATUSES = (
    PASSED,
    WRONG_OUTPUT,
    RUNTIME_ERROR,
    TIMEOUT,
    COMPILE_ERROR,
    MEMORY,
    OUTPUT_LIMIT,
    SANDBOX_ERROR,
    NO_TESTS,
    SKIPPED,
)

_FROM_TEST_STATUS = {
    TestStatus.PASSED: PASSED,
    TestStatus.WRONG_ANSWER: WRONG_OUTPUT,
    TestStatus.RUNTIME_ERROR: RUNTIME_ERROR,
    TestStatus.TIMEOUT: TIMEOUT,
    TestStatus.MEMORY_EXCEEDED: MEMORY,
    TestStatus.OUTPUT_TRUNCATED: OUTPUT_LIMIT,
    TestStatus.KILLED: RUNTIME_ERROR,
    TestStatus.SANDBOX_ERROR: SANDBOX_ERROR,
    TestStatus.SKIPPED: SKIPPED,
}
_FROM_SANDBOX_STATUS = {
    SandboxStatus.OK: PASSED,
    SandboxStatus.RUNTIME_ERROR: RUNTIME_ERROR,
    SandboxStatus.TIMEOUT: TIMEOUT,
    SandboxStatus.MEMORY_EXCEEDED: MEMORY,
    SandboxStatus.OUTPUT_TRUNCATED: OUTPUT_LIMIT,
    SandboxStatus.KILLED: RUNTIME_ERROR,
    SandboxStatus.SANDBOX_ERROR: SANDBOX_ERROR,
}


@dataclass
class CaseResult:
    """One test case: status, and for failures what went in, what was expected, what came out."""

    index: int
    status: str
    detail: str = ""
    input: str | None = None
    expected: str | None = None
    got: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == PASSED


@dataclass
class Grade:
    """A program's result on a set of tests."""

    cases: list[CaseResult] = field(default_factory=list)
    compile_error: str | None = None
    """The syntax error, when the program does not compile (then no test ran)."""

    @property
    def total(self) -> int:
        return len(self.cases)

    @property
    def passed(self) -> int:
        return sum(case.passed for case in self.cases)

    @property
    def all_passed(self) -> bool:
        return self.compile_error is None and self.total > 0 and self.passed == self.total

    @property
    def first_failure(self) -> CaseResult | None:
        return next((case for case in self.cases if not case.passed and case.status != SKIPPED), None)

    @property
    def status(self) -> str:
        """``passed``, ``compile_error``, ``no_tests``, or the status of the first failing test."""
        if self.compile_error is not None:
            return COMPILE_ERROR
        if not self.cases:
            return NO_TESTS
        failure = self.first_failure
        return PASSED if failure is None else failure.status


def syntax_error(program: str) -> str | None:
    """The compile error of ``program`` as one line, or None when it compiles. Nothing is executed."""
    try:
        compile(program, "<solution>", "exec", dont_inherit=True)
    except SyntaxError as error:
        where = f" (line {error.lineno})" if error.lineno else ""
        return f"{type(error).__name__}: {error.msg}{where}"
    except (ValueError, RecursionError, MemoryError, OverflowError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def assemble_program(task: CodingTask, code: str) -> str:
    """The program that runs: the code itself, or for HumanEval the prompt (imports, helpers, the
    stub) followed by the code, which may be a whole function or only its body."""
    if task.test_type == "humaneval":
        return f"{task.starter_code.rstrip()}\n{code}" if _is_body(code) else f"{task.starter_code}\n\n{code}"
    return code


def _is_body(code: str) -> bool:
    first = next((line for line in code.splitlines() if line.strip()), "")
    return first[:1] in (" ", "\t")


def task_limits(task: CodingTask, defaults: SandboxLimits) -> SandboxLimits:
    """The sandbox limits one test run of ``task`` gets: the task's time and memory, else the defaults."""
    changes: dict[str, Any] = {}
    if task.time_limit_s is not None:
        changes["timeout_s"] = float(task.time_limit_s)
    if task.memory_mb is not None:
        changes["memory_mb"] = int(task.memory_mb)
    return replace(defaults, **changes) if changes else defaults


def capped_tests(task: CodingTask, cap: int | None, *, seed: int = 0) -> list[Mapping[str, Any]]:
    """The tests a reward runs: every hidden test when ``cap`` is None (the default) or not exceeded;
    otherwise the task's public tests plus a random sample of the other hidden tests (seeded by
    ``seed`` and the task id, so a task is always graded on the same sample), ``cap`` tests in all
    (never fewer than the public ones). A program wrong on the example the tool shows never passes.
    """
    hidden = task.hidden_tests
    if cap is None or len(hidden) <= cap:
        return list(hidden)
    public = list(task.public_tests)
    shown = {_test_key(test) for test in public}
    others = [index for index, test in enumerate(hidden) if _test_key(test) not in shown]
    room = max(0, cap - len(public))
    picked = sorted(random.Random(f"{seed}:{task.id}").sample(others, min(room, len(others))))
    return [*public, *(hidden[index] for index in picked)]


def _test_key(test: Mapping[str, Any]) -> str:
    return json.dumps([test.get("input"), test.get("output")], sort_keys=True, default=str)


# --- public tests (the tool) ----------------------------------------------------------------------


async def run_public_tests(
    pool: SandboxPool, task: CodingTask, code: str, limits: SandboxLimits, *, compare: str = "float"
) -> Grade:
    """Run ``code`` on the task's public tests only. Never raises for anything the program does."""
    program = assemble_program(task, code)
    error = syntax_error(program)
    if error is not None:
        return Grade(compile_error=error)
    tests = task.public_tests
    if not tests:
        return Grade()
    if task.test_type == "humaneval":
        cases = await asyncio.gather(
            *(_run_call_example(pool, program, index, test, limits) for index, test in enumerate(tests))
        )
        return Grade(list(cases))
    report = await _run_io_tests(pool, task, program, tests, limits, fail_fast=False, compare=compare)
    return Grade(_cases(report, tests))


# --- hidden tests (the reward) --------------------------------------------------------------------


async def run_hidden_tests(
    pool: SandboxPool,
    task: CodingTask,
    code: str,
    limits: SandboxLimits,
    *,
    max_tests: int | None = None,
    fail_fast: bool = False,
    humaneval_mode: str = "one_run",
    compare: str = "float",
    sample_seed: int = 0,
) -> Grade:
    """Run ``code`` on the task's hidden tests: all of them, or with ``max_tests`` the public tests
    plus a seeded sample (:func:`capped_tests`); stdout compared by ``compare`` (``float`` or
    ``exact``, see :mod:`agentboost.sandbox.testcases`)."""
    program = assemble_program(task, code)
    error = syntax_error(program)
    if error is not None:
        return Grade(compile_error=error)
    if task.test_type == "humaneval":
        return await _run_humaneval_hidden(pool, task, program, limits, humaneval_mode)
    tests = capped_tests(task, max_tests, seed=sample_seed)
    report = await _run_io_tests(pool, task, program, tests, limits, fail_fast=fail_fast, compare=compare)
    return Grade(_cases(report, tests))


async def _run_io_tests(
    pool: SandboxPool,
    task: CodingTask,
    program: str,
    tests: Sequence[Mapping[str, Any]],
    limits: SandboxLimits,
    *,
    fail_fast: bool,
    compare: str = "float",
) -> TestReport:
    if task.test_type == "function":
        assert task.fn_name is not None
        return await run_function_tests(
            program, tests, task.fn_name, pool=pool, limits=limits, fail_fast=fail_fast
        )
    return await run_stdio_tests(
        program, tests, pool=pool, limits=limits, fail_fast=fail_fast, compare=compare
    )


def _cases(report: TestReport, tests: Sequence[Mapping[str, Any]]) -> list[CaseResult]:
    return [_case(result, str(tests[result.index].get("input", ""))) for result in report.results]


def _case(result: TestResult, test_input: str | None) -> CaseResult:
    status = _FROM_TEST_STATUS[result.status]
    if status == RUNTIME_ERROR and _MEMORY_ERROR.match(result.detail or ""):
        status = MEMORY  # an uncaught MemoryError: the memory limit, whichever way the sandbox reports it
    if status == PASSED:
        return CaseResult(result.index, status)
    return CaseResult(result.index, status, result.detail, test_input, result.expected, result.actual)


async def _run_humaneval_hidden(
    pool: SandboxPool, task: CodingTask, program: str, limits: SandboxLimits, mode: str
) -> Grade:
    assert task.fn_name is not None
    tests = [str(test["test"]) for test in task.hidden_tests]
    if mode == "per_case":
        tests = [case for test in tests for case in split_check(test)]
    elif mode != "one_run":
        raise ValueError(f"humaneval_mode must be 'one_run' or 'per_case', got {mode!r}")
    # The hardened sandbox (issue #9) runs check() in a checker process the program cannot reach and
    # takes the trusted prompt to define the test's helpers from; older sandboxes do not take it.
    trusted = {"prompt": task.starter_code} if HUMANEVAL_CHECKER else {}
    reports = await asyncio.gather(
        *(
            run_humaneval_test(program, test, task.fn_name, pool=pool, limits=limits, **trusted)
            for test in tests
        )
    )
    return Grade([_case(_reindexed(report.results[0], index), None) for index, report in enumerate(reports)])


HUMANEVAL_CHECKER = "prompt" in inspect.signature(run_humaneval_test).parameters
"""True when the sandbox grades HumanEval in a checker process (verdicts the program cannot forge)."""


def _reindexed(result: TestResult, index: int) -> TestResult:
    result.index = index
    return result


def split_check(test: str) -> list[str]:
    """HumanEval test code as one test per assertion: each keeps the module's other code and, inside
    ``check``, every statement without an assertion that comes before it (setup such as imports or
    helper values), then that one statement. A statement holding asserts inside a loop is one case.
    Code that cannot be split this way is returned whole."""
    try:
        module = ast.parse(test)
    except SyntaxError:
        return [test]
    position = next(
        (
            i
            for i, node in enumerate(module.body)
            if isinstance(node, ast.FunctionDef) and node.name == "check"
        ),
        None,
    )
    if position is None:
        return [test]
    check = module.body[position]
    assert isinstance(check, ast.FunctionDef)
    asserting = [
        any(isinstance(node, ast.Assert) for node in ast.walk(statement)) for statement in check.body
    ]
    if sum(asserting) <= 1:
        return [test]
    cases = []
    for index, statement in enumerate(check.body):
        if not asserting[index]:
            continue
        setup = [earlier for j, earlier in enumerate(check.body[:index]) if not asserting[j]]
        one = copy.copy(check)
        one.body = [*setup, statement]
        body = [*module.body[:position], one, *module.body[position + 1 :]]
        cases.append(ast.unparse(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))))
    return cases


# --- HumanEval docstring examples: a call and its expected value --------------------------------------

_VALUE_MARKER = "@@agentboost-example-value@@"
_MEMORY_ERROR = re.compile(r"(exit code \d+: )?MemoryError\b")


async def _run_call_example(
    pool: SandboxPool, program: str, index: int, test: Mapping[str, Any], limits: SandboxLimits
) -> CaseResult:
    call, expected = str(test["input"]), str(test["output"])
    code = (
        f"{program}\n\nimport sys as _agentboost_sys\n_agentboost_value = ({call})\n"
        f"_agentboost_sys.stdout.write('\\n' + {_VALUE_MARKER!r} + repr(_agentboost_value) + '\\n')\n"
    )
    result = await pool.run_python(code, limits=limits)
    if not result.ok:
        status = _FROM_SANDBOX_STATUS[result.status]
        if status == RUNTIME_ERROR and _MEMORY_ERROR.match(_last_line(result.stderr)):
            status = MEMORY
        return CaseResult(index, status, error_tail(result), call, expected, None)
    marked = [line for line in result.stdout.splitlines() if line.startswith(_VALUE_MARKER)]
    if not marked:
        return CaseResult(index, RUNTIME_ERROR, "the program exited before the call returned", call, expected)
    got = marked[-1][len(_VALUE_MARKER) :]
    if values_equal(expected, got):
        return CaseResult(index, PASSED)
    return CaseResult(index, WRONG_OUTPUT, "", call, expected, got)


def values_equal(expected: str, got: str) -> bool:
    """Python literals compared as values (floats to 1e-6 relative), else as text."""
    try:
        return _close(ast.literal_eval(expected), ast.literal_eval(got))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return expected.strip() == got.strip()


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b and type(a) is type(b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) or a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return (
            type(a) is type(b) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def error_tail(result: SandboxResult, lines: int = 5) -> str:
    """The last lines of a failed run's stderr (a traceback's end), else its detail sentence."""
    tail = [line for line in result.stderr.strip().splitlines() if line.strip()][-lines:]
    return "\n".join(tail) if tail else result.detail


# --- the tool's report --------------------------------------------------------------------------


def format_report(grade: Grade, max_chars: int = 2000) -> str:
    """The tool's report: a status line, then each failing example (input, expected, got, error)."""
    if grade.compile_error is not None:
        return f"status: compile_error\n{grade.compile_error}\nNo example was run."
    if not grade.cases:
        return (
            "status: no_tests\nThis problem has no public examples to run; check your program by reading it."
        )
    lines = [f"status: {grade.status} ({grade.passed} of {grade.total} public examples passed)"]
    budget = max(200, max_chars - len(lines[0]))
    for case in grade.cases:
        if case.passed:
            continue
        block = _case_text(case)
        if len(block) > budget:
            lines.append(
                f"... {sum(not c.passed for c in grade.cases[case.index :])} more failing examples not shown"
            )
            break
        lines.append(block)
        budget -= len(block)
    return "\n".join(lines)


def _case_text(case: CaseResult) -> str:
    text = [f"example {case.index + 1}: {case.status}"]
    if case.input is not None:
        text.append("  input: " + _shown(case.input))
    if case.expected is not None:
        text.append("  expected: " + _shown(case.expected))
    if case.got is not None:
        text.append("  got: " + _shown(case.got))
    if (case.detail and case.status != WRONG_OUTPUT) or (case.detail and case.got is None):
        text.append("  error: " + _shown(case.detail, 400))
    return "\n".join(text)


def _shown(text: str, limit: int = 300) -> str:
    text = text.rstrip("\n")
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} more characters]"
    return text.replace("\n", "\n    ") if "\n" in text else text
