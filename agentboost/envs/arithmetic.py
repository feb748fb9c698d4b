"""Arithmetic word problems with exact integer answers: the tasks and reward of the built-in math example.

Tasks are generated offline and deterministically from a seed; a model answers with a final line
``Answer: <integer>`` and earns 1.0 when that integer is exactly right.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agentboost.agent.limits import RolloutLimits
from agentboost.envs.base import Environment, Episode, Reward, Task
from agentboost.envs.calculator import calculator
from agentboost.envs.task import GeneratedTasks
from agentboost.errors import ConfigError
from agentboost.tokens.trajectory import Trajectory

SYSTEM_PROMPT = (
    "You solve arithmetic problems. Do not calculate in your head: use the calculator tool for every "
    "calculation, passing it one expression such as (37 + 5) * 12. Once you have the result, finish "
    "your reply with a last line of the form\n"
    "Answer: <integer>"
)


@dataclass(frozen=True)
class _Level:
    operations: int
    smallest: int
    largest: int
    operators: str


_LEVELS = {
    1: _Level(operations=1, smallest=2, largest=99, operators="+-*"),
    2: _Level(operations=3, smallest=2, largest=99, operators="+-*/"),
    3: _Level(operations=3, smallest=10, largest=9999, operators="+-*/"),
}
"""difficulty -> shape: number of operations, operand range, operators (``/`` only ever divides exactly)."""

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_NUMBER_PRECEDENCE = 3
_LARGEST_DIVISOR = 99


def generate_tasks(n: int, *, seed: int = 0, difficulty: int = 1) -> list[Task]:
    """``n`` problems as a list (see :func:`iter_tasks`)."""
    return list(itertools.islice(iter_tasks(seed=seed, difficulty=difficulty), n))


def iter_tasks(*, seed: int = 0, difficulty: int = 1) -> Iterator[Task]:
    """Problems without end, made as they are taken: the same for the same ``seed`` and ``difficulty``.

    Each task's prompt is the question, its ground truth the exact integer answer, and its metadata
    the expression and the difficulty.

    difficulty 1: one of + - * on two numbers below 100. 2: three operations (with exact division) on
    numbers below 100, parenthesised where needed. 3: as 2 with numbers up to 9999.
    """
    if difficulty not in _LEVELS:
        raise ConfigError(f"difficulty must be one of {sorted(_LEVELS)}, got {difficulty!r}")
    level = _LEVELS[difficulty]
    rng = random.Random(f"arithmetic:{difficulty}:{seed}")
    for index in itertools.count():
        expression, answer, _ = _random_expression(rng, level, level.operations)
        yield Task(
            id=f"arith-d{difficulty}-s{seed}-{index}",
            prompt=f"What is {expression}?",
            ground_truth=answer,
            metadata={"expression": expression, "difficulty": difficulty},
        )


_ANSWER_LINE = re.compile(r"\banswer(?:\*\*)?\s*:(?P<rest>[^\n]*)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{(?P<inside>[^{}]*)\}")
_INTEGER = re.compile(r"-?\d{1,3}(?:,\d{3})+|-?\d+")


def extract_answer(text: str) -> int | None:
    """The integer after the last ``Answer:`` in ``text``, or in the last ``\\boxed{}`` if there is no marker.

    The integer must be all that follows the marker on its line, give or take ``**`` bold, ``$``, a
    ``\\boxed{}``, thousands commas and a final full stop. Anything else gives None: there is no
    "last number in the text" fallback, because a reward that guesses would also pay answers that
    ignore the format, and the policy would learn to skip it.
    """
    markers = list(_ANSWER_LINE.finditer(text))
    if markers:
        return _parse_integer(markers[-1]["rest"])
    boxes = list(_BOXED.finditer(text))
    if boxes:
        return _parse_integer(boxes[-1]["inside"])
    return None


def exact_answer_reward(text: str, answer: int) -> float:
    """1.0 when the final answer in ``text`` is exactly ``answer``, else 0.0."""
    return 1.0 if extract_answer(text) == answer else 0.0


NO_ANSWER = "no final answer: the last message has no `Answer: ...` line and no \\boxed{...}"


def answer_verdict(value: float, found: object | None, expected: object) -> Reward:
    """A final-answer reward with its reason: the answer read from the model's last message, the one
    expected, and why the two gave ``value`` (what ``agentboost show`` and the viewer print)."""
    if found is None:
        reason = NO_ANSWER
    elif value >= 1.0:
        reason = f"correct: answered {found}"
    else:
        reason = f"answered {found}, expected {expected}"
    return Reward(value, info={"reason": reason, "answer": found, "expected": expected})


def _parse_integer(candidate: str) -> int | None:
    candidate = candidate.strip().strip("*$ ").removesuffix(".").strip("*$ ")
    boxed = _BOXED.fullmatch(candidate)
    if boxed:
        candidate = boxed["inside"].strip().strip("$ ")
    if not _INTEGER.fullmatch(candidate):
        return None
    return int(candidate.replace(",", ""))


_Tree = tuple[str, int, int]
"""An expression as (text, exact value, precedence of its outermost operator)."""


def _random_expression(rng: random.Random, level: _Level, operations: int) -> _Tree:
    """A random expression with ``operations`` operators, built as a tree and valued exactly."""
    if operations == 0:
        return _number(rng.randint(level.smallest, level.largest))
    operator = rng.choice(level.operators)
    if operator == "/":
        # Divide only exactly: the divisor is a number chosen among the divisors of the dividend.
        dividend = _random_expression(rng, level, operations - 1)
        divisors = [d for d in range(2, _LARGEST_DIVISOR + 1) if dividend[1] % d == 0]
        if divisors:
            return _combine(dividend, "/", _number(rng.choice(divisors)))
        fallback = rng.choice(level.operators.replace("/", ""))
        return _combine(dividend, fallback, _number(rng.randint(level.smallest, level.largest)))
    left_operations = rng.randint(0, operations - 1)
    left = _random_expression(rng, level, left_operations)
    right = _random_expression(rng, level, operations - 1 - left_operations)
    return _combine(left, operator, right)


def _number(value: int) -> _Tree:
    return str(value), value, _NUMBER_PRECEDENCE


def _combine(left: _Tree, operator: str, right: _Tree) -> _Tree:
    """Join two subexpressions, adding only the parentheses the usual precedence rules need."""
    left_text, left_value, left_precedence = left
    right_text, right_value, right_precedence = right
    precedence = _PRECEDENCE[operator]
    if left_precedence < precedence:
        left_text = f"({left_text})"
    # a - (b + c) and a / (b * c) need them on the right; a + (b - c) and a * (b / c) do not.
    if right_precedence < precedence or (right_precedence == precedence and operator in "-/"):
        right_text = f"({right_text})"
    if operator == "+":
        value = left_value + right_value
    elif operator == "-":
        value = left_value - right_value
    elif operator == "*":
        value = left_value * right_value
    else:
        value = left_value // right_value  # exact: the divisor was chosen to divide the dividend
    return f"{left_text} {operator} {right_text}", value, precedence


class ArithmeticEnvironment(Environment):
    """The built-in math example: arithmetic word problems, a safe calculator tool, exact-answer reward."""

    name = "arithmetic"
    system_prompt = SYSTEM_PROMPT
    limits = RolloutLimits(max_turns=6, max_new_tokens=256)

    def __init__(self, difficulty: int = 1) -> None:
        self.difficulty = difficulty

    def tools(self, episode: Episode) -> list[Any]:
        return [calculator]  # stateless: one object serves every rollout

    def tasks(self, n: int | None = None, *, seed: int = 0, split: str = "train") -> GeneratedTasks:
        # splits draw from disjoint seed streams, so held-out tasks never repeat training ones
        offset = {"train": 0, "test": 1_000_003, "validation": 2_000_006}.get(split)
        if offset is None:
            raise ConfigError(f"unknown split {split!r}; use train, test or validation")
        if self.difficulty not in _LEVELS:
            raise ConfigError(f"difficulty must be one of {sorted(_LEVELS)}, got {self.difficulty!r}")
        return GeneratedTasks(
            64 if n is None else n,
            lambda: iter_tasks(seed=seed + offset, difficulty=self.difficulty),
        )

    def reward(self, trajectory: Trajectory, episode: Episode) -> Reward:
        found, expected = extract_answer(trajectory.final_text), episode.task.ground_truth
        return answer_verdict(1.0 if found == expected else 0.0, found, expected)
