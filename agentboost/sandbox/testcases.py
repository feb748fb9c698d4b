"""Grading programs against test cases in the sandbox, in the three shapes coding datasets use:

- stdin/stdout tests (:func:`run_stdio_tests`): ``{"input": "1 2\\n", "output": "3\\n"}``; outputs match
  when they are equal line by line after removing trailing whitespace from each line and trailing blank
  lines at the end (``compare="exact"``), or, by default (``compare="float"``), also when the lines that
  differ hold the same whitespace-separated tokens except for decimal numbers within tolerance:
  ``|got - expected| <= FLOAT_ABS_TOL + FLOAT_REL_TOL * |expected|`` (1e-8 and 1e-5: numpy's ``allclose``
  defaults, which the APPS/TACO graders that DeepCoder and PRIME use apply to outputs that are not all
  integers). Integer tokens must match exactly, and ``nan`` / ``inf`` never match a number.
- function-call tests (:func:`run_function_tests`), LiveCodeBench/DeepCoder style: the program defines
  ``class Solution`` with method ``func_name`` (called as ``Solution().func_name(*args)``) or a top-level
  function ``func_name``. ``input`` is either JSON text with one argument per line (``"[1, 2]\\n3"``) or
  a list of arguments; ``output`` is JSON text or a value. Return values are compared as JSON values
  (tuples equal lists and 1 equals 1.0, but ``true`` equals only ``true``). Common imports (``typing``'s
  names, ``collections``, ``heapq``, ``math``...) are available to the program, as on LeetCode.
- HumanEval (:func:`run_humaneval_test`): the dataset's ``check(candidate)`` runs against the program's
  ``entry_point``; one test, passed when check() returns.

Each test case is one sandbox run of its own (a fresh process from the pool), run concurrently up to the
pool's size. So one test's crash, timeout or memory blow-up is reported for that test alone, no state
leaks from one test to the next, and per-test limits are exact.

Threat model. The graded program is written by a policy optimised against these verdicts: it will try
whatever turns a wrong program into a pass. It controls everything inside its own process (the
interpreter, builtins, frames, exit paths, the objects it returns), its stdout and stderr, and whatever
its sandbox can reach. So what decides a pass never lives there:

- Expected outputs and test code are never in the program's process or filesystem view. Expected
  stdout and expected return values stay in the supervisor (this process), which does the comparing.
  HumanEval's check() runs in a separate *checker* process of the same job, under another uid (the
  program can neither signal, trace nor read it), which reads the test code from a pipe the program
  never holds and calls the program's function over a socket (``checker`` of
  :meth:`SandboxPool.run_python <agentboost.sandbox.pool.SandboxPool.run_python>`).
- Only plain data crosses from the program: JSON, which the receiver turns into built-in values only
  (None, bool, int, float, str, list, tuple, dict, set, bytes, complex; anything else becomes an opaque
  value equal only to itself). An object whose ``__eq__`` always answers True, an int subclass, a patched
  ``json``, ``repr`` or builtin inside the program's process change nothing outside it.
- A pass needs a positive result observed outside the program: the supervisor's comparison, or the
  checker's verdict, which counts only if it carries a per-run secret the program never sees, arrives on
  the status pipe the program does not hold, and comes from a checker that exited cleanly. Exiting early
  (``sys.exit(0)``, ``os._exit(0)``, a signal to itself), at the top level or inside the graded function,
  ends the run without a verdict: a failure, never a pass.
- Statuses come from what the supervisor observed (exit status, CPU time, peak memory, output size),
  never from text the program printed; text shown in reports has its control sequences escaped.
- The filesystem view holds no host files (no dataset, hidden-test file or checkout to read), and
  installed packages are hidden unless the pool was started with ``site=True``.

Out of scope: a program that computes the right answers, even by special-casing the inputs it sees, is
not a hack a grader can tell apart (hold tests out for that); kernel bugs under the namespaces, seccomp
and rlimits are beyond what this harness defends.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from importlib import resources
from typing import Any

from agentboost.errors import ConfigError
from agentboost.sandbox.limits import SandboxLimits, SandboxResult, SandboxStatus, printable
from agentboost.sandbox.pool import MEMORY_PEAK_FRACTION, SandboxPool

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
    compare: str = "float",
) -> TestReport:
    """Run ``program`` once per test with the test's ``input`` on stdin; compare stdout to ``output``
    (``compare``: ``"float"``, decimal numbers within tolerance, or ``"exact"`` text; see the module
    docstring)."""
    if compare not in STDOUT_COMPARISONS:
        raise ValueError(f"compare must be one of {', '.join(STDOUT_COMPARISONS)}, got {compare!r}")
    cases = [
        (str(_field(test, "input", index)), str(_field(test, "output", index)))
        for index, test in enumerate(tests)
    ]

    async def run_case(sandbox: SandboxPool, index: int) -> TestResult:
        stdin, expected = cases[index]
        result = await sandbox.run_python(program, stdin=stdin, limits=limits)
        if not result.ok:
            return _failed(index, result, expected)
        difference = _stdout_difference(expected, result.stdout, compare)
        status = TestStatus.WRONG_ANSWER if difference else TestStatus.PASSED
        return TestResult(index, status, difference, _cut(expected), _cut(result.stdout), result.duration_s)

    return await _run_cases(len(cases), run_case, pool, fail_fast)


STDOUT_COMPARISONS = ("float", "exact")
FLOAT_REL_TOL = 1e-5
FLOAT_ABS_TOL = 1e-8
_INTEGER = re.compile(r"[-+]?\d+")
_DECIMAL = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def outputs_match(expected: str, actual: str, compare: str = "exact") -> bool:
    """Equal line by line after stripping trailing whitespace per line and trailing blank lines
    (``compare="float"``: decimal numbers within tolerance too)."""
    return not _stdout_difference(expected, actual, compare)


def _lines_match(want: str, got: str, compare: str) -> bool:
    if want == got:
        return True
    if compare != "float":
        return False
    want_tokens, got_tokens = want.split(), got.split()
    return len(want_tokens) == len(got_tokens) and all(map(_tokens_match, want_tokens, got_tokens))


def _tokens_match(want: str, got: str) -> bool:
    if want == got:
        return True
    if _INTEGER.fullmatch(want) and _INTEGER.fullmatch(got):
        return False  # integers are exact
    if not (_DECIMAL.fullmatch(want) and _DECIMAL.fullmatch(got)):
        return False  # words, nan, inf, 1_000, 0x10: text only
    expected, value = float(want), float(got)
    if not (math.isfinite(expected) and math.isfinite(value)):
        return False
    return abs(value - expected) <= FLOAT_ABS_TOL + FLOAT_REL_TOL * abs(expected)


def _stdout_difference(expected: str, actual: str, compare: str = "exact") -> str:
    """'' when the outputs match; otherwise where they first differ, in a sentence."""
    want, got = _normalized_lines(expected), _normalized_lines(actual)
    if want == got:
        return ""
    for number, (want_line, got_line) in enumerate(zip(want, got, strict=False), start=1):
        if not _lines_match(want_line, got_line, compare):
            return f"line {number}: expected {_cut(want_line, 80)!r}, got {_cut(got_line, 80)!r}"
    if len(got) < len(want):
        return f"output ends after {len(got)} lines; expected {len(want)}"
    if len(got) > len(want):
        return f"{len(got) - len(want)} extra lines after the expected {len(want)}"
    return ""


def _normalized_lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


# --- function calls ----------------------------------------------------------------------------------


def _harness(name: str) -> str:
    """The source of ``agentboost/sandbox/harness/<name>.py``: programs that run in the sandbox, kept as
    real Python files (ruff checks them) and shipped as package data."""
    return (resources.files("agentboost.sandbox") / "harness" / f"{name}.py").read_text(encoding="utf-8")


_RESULT_MARKER = "@@agentboost-function-result@@"

# Runs in the sandbox: harness/function.py, given the prelude's text and the result marker.
_GIVEN_TO_FUNCTION = f"_PRELUDE = {_harness('prelude')!r}\n_RESULT_MARKER = {_RESULT_MARKER!r}\n"
_FUNCTION_HARNESS = _GIVEN_TO_FUNCTION + _harness("function")

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
        try:
            outcome = json.loads(marked[-1][len(_RESULT_MARKER) :])
            if not isinstance(outcome, dict) or not isinstance(outcome.get("ok"), bool):
                raise ValueError("not a result object")
        except ValueError:
            detail = "the program wrote a malformed line on the result channel"
            status = TestStatus.RUNTIME_ERROR
            return TestResult(index, status, detail, shown_expected, None, result.duration_s)
        if not outcome["ok"]:
            error = str(outcome.get("error", ""))
            status = TestStatus.RUNTIME_ERROR
            if _MEMORY_ERROR.search(error) and _memory_peaked(result, limits or sandbox.limits):
                status = TestStatus.MEMORY_EXCEEDED
            detail = _cut(_last_line(error), 300) or ""
            return TestResult(index, status, detail, shown_expected, None, result.duration_s)
        if "unserializable" in outcome:
            kind, shown = str(outcome["unserializable"]), str(outcome.get("repr", ""))
            detail = _cut(f"returned a {kind}, which is not a JSON value: {shown}", 300) or ""
            return TestResult(index, TestStatus.WRONG_ANSWER, detail, shown_expected, None, result.duration_s)
        actual = outcome.get("value")
        shown_actual = _cut(json.dumps(actual))
        if same_value(expected, actual):
            return TestResult(index, TestStatus.PASSED, "", shown_expected, shown_actual, result.duration_s)
        detail = f"expected {_cut(json.dumps(expected), 80)}, got {_cut(json.dumps(actual), 80)}"
        return TestResult(
            index, TestStatus.WRONG_ANSWER, detail, shown_expected, shown_actual, result.duration_s
        )

    return await _run_cases(len(cases), run_case, pool, fail_fast)


def same_value(expected: Any, actual: Any) -> bool:
    """JSON values equal as the grader sees them: numbers by value (1 == 1.0), but a boolean equals only a
    boolean, and containers element by element under the same rules."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return expected == actual
    if type(expected) is not type(actual):
        return False
    if isinstance(expected, list):
        return len(expected) == len(actual) and all(map(same_value, expected, actual))
    if isinstance(expected, dict):
        return expected.keys() == actual.keys() and all(same_value(expected[k], actual[k]) for k in expected)
    return bool(expected == actual)


def _memory_peaked(result: SandboxResult, limits: SandboxLimits) -> bool:
    """The kernel saw the program's memory reach the share of its limit that makes a MemoryError real."""
    return result.peak_memory_mb >= MEMORY_PEAK_FRACTION * limits.memory_mb


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

# harness/candidate.py runs as the program, harness/checker.py in the checker process; both start with
# harness/codec.py, the values that cross between them.
_CANDIDATE_HARNESS = _harness("codec") + _harness("candidate")
_CHECKER_HARNESS = _harness("codec") + _harness("checker")


async def run_humaneval_test(
    program: str,
    test: str,
    entry_point: str,
    *,
    pool: SandboxPool | None = None,
    limits: SandboxLimits | None = None,
    prompt: str | None = None,
) -> TestReport:
    """Run the dataset's ``test`` code and ``check(candidate)`` against ``entry_point`` as ``program`` (the
    prompt and the completion) defines it. Passes when check() returns; a failing assert is a wrong
    answer. check() runs in a checker process the program cannot reach (see the module's threat model).

    ``prompt``: the dataset's prompt (trusted). Pass it when the test code uses helpers the prompt defines
    (HumanEval/32 ``poly``, /38 ``encode_cyclic``, /50 ``encode_shift``): the checker defines them from
    the prompt, never from the program, which could redefine them. Without it such a test ends as
    sandbox_error saying so."""
    if not entry_point.isidentifier():
        raise ConfigError(f"entry_point must be a Python identifier, got {entry_point!r}")
    checker = f"ENTRY_POINT = {entry_point!r}\nTEST = {test!r}\nPROMPT = {prompt!r}\n" + _CHECKER_HARNESS
    stdin = json.dumps({"program": program, "entry_point": entry_point})

    async def run_case(sandbox: SandboxPool, index: int) -> TestResult:
        result = await sandbox.run_python(_CANDIDATE_HARNESS, stdin=stdin, limits=limits, checker=checker)
        return _humaneval_result(index, result, limits or sandbox.limits)

    return await _run_cases(1, run_case, pool, fail_fast=False)


_CHECKER_OUTCOMES = {
    "passed": TestStatus.PASSED,
    "assertion": TestStatus.WRONG_ANSWER,
    "candidate_error": TestStatus.RUNTIME_ERROR,
    "check_error": TestStatus.RUNTIME_ERROR,
    "candidate_gone": TestStatus.RUNTIME_ERROR,
    "missing_name": TestStatus.SANDBOX_ERROR,
}
"""The checker's outcomes (see harness/checker.py) and the status each gives; anything else is a
sandbox_error."""


def _humaneval_result(index: int, result: SandboxResult, limits: SandboxLimits) -> TestResult:
    verdict = result.checker_verdict
    if result.status in (SandboxStatus.TIMEOUT, SandboxStatus.OUTPUT_TRUNCATED) or verdict is None:
        if result.ok:  # the checker died (its limits, exhausted by what the program returned): no pass
            detail = "the checker ended without a verdict"
            return TestResult(index, TestStatus.RUNTIME_ERROR, detail, duration_s=result.duration_s)
        return _failed(index, result, None)
    outcome, detail = str(verdict.get("outcome")), str(verdict.get("detail", ""))
    status = _CHECKER_OUTCOMES.get(outcome, TestStatus.SANDBOX_ERROR)
    if outcome == "assertion":
        detail = "an assertion in check() failed: " + detail
    elif outcome == "candidate_error" and verdict.get("error_type") == "MemoryError":
        if _memory_peaked(result, limits):
            status = TestStatus.MEMORY_EXCEEDED
    elif outcome == "check_error":
        detail = f"check() failed on what the program returned: {detail}"
    elif outcome == "missing_name":
        detail = f"the test code needs a helper that the dataset's prompt defines ({detail}): pass prompt="
    elif outcome == "candidate_gone":
        if result.status is not SandboxStatus.OK:
            return _failed(index, result, None)
        detail = "the program exited before check() finished"
    elif outcome == "checker_error":
        detail = f"the checker failed: {detail}"
    return TestResult(index, status, _cut(detail, 300) or "", duration_s=result.duration_s)


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
        detail = _cut(_last_line(result.stderr), 300) or ""
    actual = _cut(result.stdout) if result.stdout else None
    return TestResult(index, _FROM_SANDBOX[result.status], detail, _cut(expected), actual, result.duration_s)


def _field(test: Mapping[str, Any], name: str, index: int) -> Any:
    if not isinstance(test, Mapping) or name not in test:
        raise ConfigError(f"test {index} has no {name!r}: each test needs 'input' and 'output', got {test!r}")
    return test[name]


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def _cut(text: str | None, limit: int = SHOWN_CHARS) -> str | None:
    """``text`` made safe to show (control sequences escaped) and cut to ``limit`` characters."""
    if text is None:
        return None
    text = printable(text)
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more characters]"
