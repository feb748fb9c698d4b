"""Grading programs against test cases in the sandbox, in the three shapes coding datasets use:

- stdin/stdout tests (:func:`run_stdio_tests`): ``{"input": "1 2\\n", "output": "3\\n"}``; outputs match
  when they are equal line by line after removing trailing whitespace from each line and trailing blank
  lines at the end.
- function-call tests (:func:`run_function_tests`), LiveCodeBench/DeepCoder style: the program defines
  ``class Solution`` with method ``func_name`` (called as ``Solution().func_name(*args)``) or a top-level
  function ``func_name``. ``input`` is either JSON text with one argument per line (``"[1, 2]\\n3"``) or
  a list of arguments; ``output`` is JSON text or a value. Return values are compared as JSON (tuples
  equal lists). Common imports (``typing``'s names, ``collections``, ``heapq``, ``math``...) are
  available to the program, as on LeetCode.
- HumanEval (:func:`run_humaneval_test`): the program (prompt plus completion), the dataset's ``test``
  code and ``check(entry_point)``, run together; one test that passes when nothing raises.

Each test case is one sandbox run of its own (a fresh process from the pool), run concurrently up to the
pool's size. So one test's crash, timeout or memory blow-up is reported for that test alone, no state
leaks from one test to the next, and per-test limits are exact. For stdin/stdout and function-call tests
the expected outputs never enter the sandbox: the program's output is compared here, so a program cannot
read the answers it is graded against. (HumanEval's asserts are code and must run inside.)
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from agentboost.errors import ConfigError
from agentboost.sandbox.limits import SandboxLimits, SandboxResult, SandboxStatus
from agentboost.sandbox.pool import SandboxPool

SHOWN_CHARS = 500
"""Expected and actual outputs kept in a TestResult are cut to this many characters."""


class TestStatus(str, Enum):
    """How one test case ended."""

    __test__ = False  # not a pytest test class

    PASSED = "passed"
    WRONG_ANSWER = "wrong_answer"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY_EXCEEDED = "memory_exceeded"
    OUTPUT_TRUNCATED = "output_truncated"
    KILLED = "killed"
    SANDBOX_ERROR = "sandbox_error"
    SKIPPED = "skipped"
    """Not run: an earlier test failed and ``fail_fast`` was set."""


_FROM_SANDBOX = {
    SandboxStatus.RUNTIME_ERROR: TestStatus.RUNTIME_ERROR,
    SandboxStatus.TIMEOUT: TestStatus.TIMEOUT,
    SandboxStatus.MEMORY_EXCEEDED: TestStatus.MEMORY_EXCEEDED,
    SandboxStatus.OUTPUT_TRUNCATED: TestStatus.OUTPUT_TRUNCATED,
    SandboxStatus.KILLED: TestStatus.KILLED,
    SandboxStatus.SANDBOX_ERROR: TestStatus.SANDBOX_ERROR,
}


@dataclass
class TestResult:
    """One test case: its status and, when it failed, why (``detail``) with the outputs cut short."""

    __test__ = False

    index: int
    status: TestStatus
    detail: str = ""
    expected: str | None = None
    actual: str | None = None
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status is TestStatus.PASSED


@dataclass
class TestReport:
    """All test cases of one program, in the order given."""

    __test__ = False

    results: list[TestResult] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def passed(self) -> int:
        return sum(result.passed for result in self.results)

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def first_failure(self) -> TestResult | None:
        return next((result for result in self.results if not result.passed), None)

    def summary(self) -> str:
        text = f"{self.passed}/{self.total} tests passed"
        failure = self.first_failure
        if failure is not None:
            text += f"; test {failure.index}: {failure.status.value}"
            if failure.detail:
                text += f" ({failure.detail})"
        return text


# --- stdin / stdout ----------------------------------------------------------------------------------


async def run_stdio_tests(
    program: str,
    tests: Sequence[Mapping[str, Any]],
    *,
    pool: SandboxPool | None = None,
    limits: SandboxLimits | None = None,
    fail_fast: bool = False,
) -> TestReport:
    """Run ``program`` once per test with the test's ``input`` on stdin; compare stdout to ``output``."""
    cases = [
        (str(_field(test, "input", index)), str(_field(test, "output", index)))
        for index, test in enumerate(tests)
    ]

    async def run_case(sandbox: SandboxPool, index: int) -> TestResult:
        stdin, expected = cases[index]
        result = await sandbox.run_python(program, stdin=stdin, limits=limits)
        if not result.ok:
            return _failed(index, result, expected)
        difference = _stdout_difference(expected, result.stdout)
        status = TestStatus.WRONG_ANSWER if difference else TestStatus.PASSED
        return TestResult(index, status, difference, _cut(expected), _cut(result.stdout), result.duration_s)

    return await _run_cases(len(cases), run_case, pool, fail_fast)


def outputs_match(expected: str, actual: str) -> bool:
    """Equal line by line after stripping trailing whitespace per line and trailing blank lines."""
    return _normalized_lines(expected) == _normalized_lines(actual)


def _stdout_difference(expected: str, actual: str) -> str:
    """'' when the outputs match; otherwise where they first differ, in a sentence."""
    want, got = _normalized_lines(expected), _normalized_lines(actual)
    if want == got:
        return ""
    for number, (want_line, got_line) in enumerate(zip(want, got, strict=False), start=1):
        if want_line != got_line:
            return f"line {number}: expected {_cut(want_line, 80)!r}, got {_cut(got_line, 80)!r}"
    if len(got) < len(want):
        return f"output ends after {len(got)} lines; expected {len(want)}"
    return f"{len(got) - len(want)} extra lines after the expected {len(want)}"


def _normalized_lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


# --- function calls ----------------------------------------------------------------------------------

_RESULT_MARKER = "@@agentboost-function-result@@"

_PRELUDE = """\
from typing import *
import bisect, collections, copy, functools, heapq, itertools, math, operator, random, re, string
from bisect import bisect_left, bisect_right, insort
from collections import Counter, defaultdict, deque, OrderedDict
from functools import cache, lru_cache, reduce
from heapq import heapify, heappop, heappush, heappushpop, nlargest, nsmallest
from itertools import accumulate, combinations, permutations, product
from math import ceil, floor, gcd, inf, isqrt, log, sqrt
"""

# Runs in the sandbox. Reads {"program", "func_name", "args"} from stdin, calls the function and writes
# one marked JSON line to the real stdout; the program's own prints go to stderr.
_FUNCTION_HARNESS = f"""\
import json, linecache, os, sys, traceback
_payload = json.loads(sys.stdin.read())
sys.stdin = open(os.devnull)
_result_fd = os.dup(1)
os.dup2(2, 1)
sys.stdout = sys.stderr
_namespace = {{"__name__": "solution", "__builtins__": __builtins__}}
exec({_PRELUDE!r}, _namespace)
_source = _payload["program"]
linecache.cache["<solution>"] = (len(_source), None, _source.splitlines(True), "<solution>")
try:
    exec(compile(_source, "<solution>", "exec"), _namespace)
    _name = _payload["func_name"]
    _class = _namespace.get("Solution")
    if isinstance(_class, type) and hasattr(_class, _name):
        _function = getattr(_class(), _name)
    elif callable(_namespace.get(_name)):
        _function = _namespace[_name]
    else:
        raise NameError(f"the program defines neither Solution.{{_name}} nor a function {{_name}}")
    _value = _function(*_payload["args"])
    try:
        _line = json.dumps({{"ok": True, "value": _value}})
    except (TypeError, ValueError):
        _kind = type(_value).__name__
        _line = json.dumps({{"ok": True, "unserializable": _kind, "repr": repr(_value)[:500]}})
except BaseException:
    _error = traceback.format_exc()
    sys.stderr.write(_error)
    _line = json.dumps({{"ok": False, "error": _error}})
sys.stderr.flush()
os.write(_result_fd, ({_RESULT_MARKER!r} + _line + "\\n").encode())
"""

_MEMORY_ERROR = re.compile(r"^MemoryError\b", re.M)


async def run_function_tests(
    program: str,
    tests: Sequence[Mapping[str, Any]],
    func_name: str,
    *,
    pool: SandboxPool | None = None,
    limits: SandboxLimits | None = None,
    fail_fast: bool = False,
) -> TestReport:
    """Call ``Solution().func_name(*args)`` (or the top-level ``func_name``) once per test in a fresh
    sandboxed process and compare the return value to the test's ``output`` as JSON."""
    if not func_name.isidentifier():
        raise ConfigError(f"func_name must be a Python identifier, got {func_name!r}")
    cases = [
        (
            _arguments(_field(test, "input", index), index),
            _expected_value(_field(test, "output", index), index),
        )
        for index, test in enumerate(tests)
    ]

    async def run_case(sandbox: SandboxPool, index: int) -> TestResult:
        args, expected = cases[index]
        stdin = json.dumps({"program": program, "func_name": func_name, "args": args})
        result = await sandbox.run_python(_FUNCTION_HARNESS, stdin=stdin, limits=limits)
        shown_expected = _cut(json.dumps(expected))
        if not result.ok:
            return _failed(index, result, shown_expected)
        marked = [line for line in result.stdout.splitlines() if line.startswith(_RESULT_MARKER)]
        if not marked:
            detail = "the program ended the process before returning (os._exit or similar)"
            return TestResult(
                index, TestStatus.RUNTIME_ERROR, detail, shown_expected, None, result.duration_s
            )
        outcome = json.loads(marked[-1][len(_RESULT_MARKER) :])
        if not outcome["ok"]:
            error = outcome["error"]
            status = TestStatus.MEMORY_EXCEEDED if _MEMORY_ERROR.search(error) else TestStatus.RUNTIME_ERROR
            return TestResult(index, status, _last_line(error), shown_expected, None, result.duration_s)
        if "unserializable" in outcome:
            detail = f"returned a {outcome['unserializable']}, which is not a JSON value: {outcome['repr']}"
            return TestResult(index, TestStatus.WRONG_ANSWER, detail, shown_expected, None, result.duration_s)
        actual = outcome["value"]
        shown_actual = _cut(json.dumps(actual))
        if actual == expected:
            return TestResult(index, TestStatus.PASSED, "", shown_expected, shown_actual, result.duration_s)
        detail = f"expected {_cut(json.dumps(expected), 80)}, got {_cut(json.dumps(actual), 80)}"
        return TestResult(
            index, TestStatus.WRONG_ANSWER, detail, shown_expected, shown_actual, result.duration_s
        )

    return await _run_cases(len(cases), run_case, pool, fail_fast)


def _arguments(test_input: Any, index: int) -> list[Any]:
    if isinstance(test_input, list):
        return test_input
    if not isinstance(test_input, str):
        raise ConfigError(f"test {index}: input must be JSON text (one argument per line) or a list")
    try:
        return [json.loads(line) for line in test_input.split("\n") if line.strip()]
    except ValueError as error:
        raise ConfigError(f"test {index}: input line is not JSON ({error}): {test_input[:200]!r}") from None


def _expected_value(test_output: Any, index: int) -> Any:
    if not isinstance(test_output, str):
        return test_output
    try:
        return json.loads(test_output)
    except ValueError as error:
        raise ConfigError(f"test {index}: output is not JSON ({error}): {test_output[:200]!r}") from None


# --- HumanEval -----------------------------------------------------------------------------------------


async def run_humaneval_test(
    program: str,
    test: str,
    entry_point: str,
    *,
    pool: SandboxPool | None = None,
    limits: SandboxLimits | None = None,
) -> TestReport:
    """Run ``program`` (the prompt and the completion), then the dataset's ``test`` code and
    ``check(entry_point)``. Passes when nothing raises; a failing assert is a wrong answer."""
    if not entry_point.isidentifier():
        raise ConfigError(f"entry_point must be a Python identifier, got {entry_point!r}")
    code = f"{program}\n\n{test}\n\ncheck({entry_point})\n"

    async def run_case(sandbox: SandboxPool, index: int) -> TestResult:
        result = await sandbox.run_python(code, limits=limits)
        if result.ok:
            return TestResult(index, TestStatus.PASSED, duration_s=result.duration_s)
        failure = _failed(index, result, None)
        if result.status is SandboxStatus.RUNTIME_ERROR and _last_line(result.stderr).startswith(
            "AssertionError"
        ):
            failure.status = TestStatus.WRONG_ANSWER
            failure.detail = "an assertion in check() failed: " + _assertion_site(result.stderr)
        return failure

    return await _run_cases(1, run_case, pool, fail_fast=False)


def _assertion_site(stderr: str) -> str:
    """The source line of the innermost frame of a traceback (the failing assert)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for position in range(len(lines) - 1, 0, -1):
        if lines[position - 1].startswith("File "):
            return _cut(lines[position], 200)
    return _last_line(stderr)


# --- shared --------------------------------------------------------------------------------------------


async def _run_cases(
    count: int,
    run_case: Callable[[SandboxPool, int], Awaitable[TestResult]],
    pool: SandboxPool | None,
    fail_fast: bool,
) -> TestReport:
    if pool is None:
        async with SandboxPool(size=max(1, min(count, os.cpu_count() or 2))) as own_pool:
            return await _run_cases(count, run_case, own_pool, fail_fast)
    results: list[TestResult | None] = [None] * count
    tasks = [asyncio.ensure_future(run_case(pool, index)) for index in range(count)]
    try:
        for task in asyncio.as_completed(tasks):
            result = await task
            results[result.index] = result
            if fail_fast and not result.passed:
                break
    finally:
        for task in tasks:
            task.cancel()  # fail_fast, or our caller was cancelled: running tests are killed
        await asyncio.gather(*tasks, return_exceptions=True)
    for index, task in enumerate(tasks):
        if results[index] is None and not task.cancelled() and task.exception() is None:
            results[index] = task.result()
    return TestReport(
        [result or TestResult(index, TestStatus.SKIPPED) for index, result in enumerate(results)]
    )


def _failed(index: int, result: SandboxResult, expected: str | None) -> TestResult:
    detail = result.detail
    if result.status is SandboxStatus.RUNTIME_ERROR and result.stderr.strip():
        detail = _last_line(result.stderr)
    actual = _cut(result.stdout) if result.stdout else None
    return TestResult(index, _FROM_SANDBOX[result.status], detail, _cut(expected), actual, result.duration_s)


def _field(test: Mapping[str, Any], name: str, index: int) -> Any:
    if not isinstance(test, Mapping) or name not in test:
        raise ConfigError(f"test {index} has no {name!r}: each test needs 'input' and 'output', got {test!r}")
    return test[name]


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def _cut(text: str | None, limit: int = SHOWN_CHARS) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more characters]"
