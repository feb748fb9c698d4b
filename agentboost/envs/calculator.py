"""A safe calculator tool for agents: arithmetic on untrusted model output, bounded in size and time.

The expression is parsed with :mod:`ast` and a small whitelist of nodes is walked by hand; nothing is
ever evaluated, executed or compiled as code. Every limit is checked before the work it bounds, so
``2 ** (10 ** 10)`` is refused in microseconds instead of hanging the event loop.

Numbers:
    Integers stay exact. ``/`` gives an int when the division is exact (``12 / 4`` is ``3``) and a
    float otherwise (``7 / 2`` is ``3.5``); ``sqrt`` of a perfect square is an int as well. Any float
    operand makes the result a float. Integer results must have at most :data:`MAX_DIGITS` digits;
    float results must be finite.

Results as text (:func:`format_number`):
    ints in plain decimal (``"1234"``), floats as Python's shortest round-trip ``repr`` (``"3.5"``,
    ``"6.0"``, ``"1e-05"``). An integral float keeps its ``.0`` so the model can tell that it came
    through inexact float arithmetic.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

from strands import tool

from agentboost.errors import CalculatorError

MAX_LENGTH = 500
"""Longest expression accepted, in characters."""
MAX_NODES = 200
"""Most numbers, operators and calls in one expression."""
MAX_DEPTH = 50
"""Deepest nesting of operations; also keeps the recursive walk far from Python's recursion limit."""
MAX_DIGITS = 100
"""Integers (literals, intermediate values and results) must satisfy ``abs(x) < 10 ** MAX_DIGITS``."""

_SUPPORTED = "numbers, + - * / // % **, parentheses and the functions abs, min, max, round, sqrt"

Number = int | float


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression such as ``"(37 * 12 + 5) // 3"``; see the module docstring.

    Raises:
        CalculatorError: with a message that says what to change.
    """
    expression = expression.strip()
    if not expression:
        raise CalculatorError("empty expression: give one arithmetic expression such as 2 * (3 + 4)")
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(
            f"expression too long: {len(expression)} characters; the limit is {MAX_LENGTH}. "
            "Split the calculation into smaller steps."
        )
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        reason = getattr(error, "msg", None) or str(error) or type(error).__name__
        raise CalculatorError(f"cannot parse the expression: {reason}. Supported: {_SUPPORTED}") from None
    node_count = sum(isinstance(node, ast.expr) for node in ast.walk(tree))
    if node_count > MAX_NODES:
        raise CalculatorError(
            f"expression too large: {node_count} numbers and operations; the limit is {MAX_NODES}. "
            "Split the calculation into smaller steps."
        )
    return _eval(tree.body, depth=1)


def format_number(value: Number) -> str:
    """The text the tool returns for a result: ints in decimal, floats as their shortest ``repr``."""
    return str(value) if isinstance(value, int) else repr(value)


@tool
async def calculator(expression: str) -> str:
    """Evaluate one arithmetic expression and return the result.

    Accepts numbers (integers, decimals, scientific notation like 1.5e3), the operators + - * / // % **,
    parentheses, and the functions abs, min, max, round, sqrt. Integer arithmetic is exact; / returns an
    integer when the division is exact and a decimal otherwise. Integers are limited to 100 digits. Write
    numbers without thousands separators and use ** for powers.

    Args:
        expression: The expression to evaluate, for example "(37 * 12 + 5) // 3".
    """
    # async on purpose: evaluation is bounded to well under a millisecond, so running it in the event
    # loop is cheaper than the thread-pool hop Strands makes for sync tools. A CalculatorError raised
    # here reaches the model as an error tool result with the message text.
    return format_number(evaluate(expression))


# --- the walk --------------------------------------------------------------------------------------


def _eval(node: ast.expr, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalculatorError(
            f"expression nested too deeply (more than {MAX_DEPTH} levels); split it into smaller steps"
        )
    if isinstance(node, ast.Constant):
        return _literal(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _eval(node.left, depth + 1)
        right = _eval(node.right, depth + 1)
        return _apply(_BINARY[type(node.op)], left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
            raise CalculatorError(f"{node.func.id}() takes plain positional arguments only")
        args = [_eval(arg, depth + 1) for arg in node.args]
        return _apply(_FUNCTIONS[node.func.id], *args)
    raise _unsupported(node)


def _literal(value: object) -> Number:
    if type(value) is int:  # not bool: True is an int subclass
        return _checked(value)
    if type(value) is float:
        if not math.isfinite(value):
            raise CalculatorError(f"number too large: {value!r}; floats must stay below about 1.8e308")
        return value
    if isinstance(value, complex):
        raise CalculatorError("complex numbers are not supported")
    if isinstance(value, str | bytes):
        raise CalculatorError("text is not supported, only numbers: remove the quotes")
    raise CalculatorError(f"{value!r} is not a number. Supported: {_SUPPORTED}")


def _apply(function: Callable[..., Number], *args: Number) -> Number:
    try:
        result = function(*args)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("result too large for a float (above about 1.8e308)") from None
    return _checked(result)


def _checked(value: object) -> Number:
    """Enforce the limits every value must meet: ints below 10**MAX_DIGITS, floats finite and real."""
    if isinstance(value, complex):
        raise CalculatorError("no real result (a negative number to a fractional power is complex)")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("result too large for a float (above about 1.8e308)")
        return value
    assert isinstance(value, int), f"unexpected value {value!r}"
    if abs(value) >= 10**MAX_DIGITS:
        raise CalculatorError(
            f"integer too large: {len(str(abs(value)))} digits; the limit is {MAX_DIGITS} digits"
        )
    return value


def _divide(left: Number, right: Number) -> Number:
    if isinstance(left, int) and isinstance(right, int) and right != 0 and left % right == 0:
        return left // right
    return left / right


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        # abs(base) ** exponent has floor(exponent * log10|base|) + 1 digits: refuse before computing.
        log_result = exponent * math.log10(abs(base))
        if log_result >= MAX_DIGITS:
            raise CalculatorError(
                f"exponent too large: the result would have ~{math.floor(log_result) + 1:.3g} digits; "
                f"the limit is {MAX_DIGITS} digits"
            )
    # Float powers cannot run long: they overflow (OverflowError) or round to inf, both refused.
    return base**exponent


def _sqrt(value: Number) -> Number:
    if value < 0:
        raise CalculatorError("sqrt of a negative number has no real result")
    if isinstance(value, int):
        root = math.isqrt(value)
        if root * root == value:
            return root
    return math.sqrt(value)


def _round(value: Number, ndigits: int | None = None) -> Number:
    if ndigits is None:
        return round(value)
    if not isinstance(ndigits, int) or abs(ndigits) > MAX_DIGITS:
        # round(5, -10**9) would build 10**(10**9) internally: bound it first.
        raise CalculatorError(
            f"round(x, ndigits) needs an integer ndigits between -{MAX_DIGITS} and {MAX_DIGITS}"
        )
    return round(value, ndigits)


def _call(name: str, function: Callable[..., Number], min_args: int, max_args: int) -> Callable[..., Number]:
    """Check the number of arguments and turn Python's TypeError into an actionable message."""

    def checked(*args: Number) -> Number:
        if not min_args <= len(args) <= max_args:
            expected = str(min_args) if min_args == max_args else f"{min_args} to {max_args}"
            raise CalculatorError(f"{name}() takes {expected} argument(s), got {len(args)}")
        return function(*args)

    return checked


_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _divide,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}

_FUNCTIONS: dict[str, Callable[..., Number]] = {
    "abs": _call("abs", abs, 1, 1),
    "sqrt": _call("sqrt", _sqrt, 1, 1),
    "round": _call("round", _round, 1, 2),
    "min": _call("min", lambda *values: min(values), 2, MAX_NODES),
    "max": _call("max", lambda *values: max(values), 2, MAX_NODES),
}

_NAMES: dict[type[ast.AST], str] = {
    ast.Attribute: "attribute access",
    ast.Call: "calling that",
    ast.Subscript: "indexing",
    ast.Lambda: "lambda",
    ast.Compare: "comparison",
    ast.BoolOp: "and/or",
    ast.IfExp: "if/else",
    ast.JoinedStr: "text",
    ast.BitAnd: "the operator &",
    ast.BitOr: "the operator |",
    ast.LShift: "the operator <<",
    ast.RShift: "the operator >>",
    ast.Invert: "the operator ~",
    ast.Not: "not",
    ast.MatMult: "the operator @",
}


def _unsupported(node: ast.expr) -> CalculatorError:
    """The error for a construct outside the whitelist, phrased so that a model can fix its call."""
    if isinstance(node, ast.Tuple):
        return CalculatorError(
            "commas are not supported: write numbers without thousands separators (1000, not 1,000) "
            "and calculate one expression per call"
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        return CalculatorError("^ is not supported: use ** for powers, e.g. 2 ** 10")
    if isinstance(node, ast.Name):
        what = f"the name {node.id!r}"
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        what = f"the function {node.func.id!r}"
    elif isinstance(node, ast.BinOp | ast.UnaryOp):
        what = _NAMES.get(type(node.op), type(node.op).__name__)
    else:
        what = _NAMES.get(type(node), type(node).__name__)
    return CalculatorError(f"{what} is not supported. Supported: {_SUPPORTED}")
