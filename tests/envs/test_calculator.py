import asyncio
import re
import time

import pytest

from agentboost.envs.calculator import (
    MAX_DEPTH,
    MAX_DIGITS,
    MAX_LENGTH,
    MAX_NODES,
    CalculatorError,
    calculator,
    evaluate,
    format_number,
)
from agentboost.errors import AgentBoostError


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("10 - 4 - 3", 3),
        ("-2 ** 2", -4),
        ("(-2) ** 2", 4),
        ("2 ** 3 ** 2", 512),
        ("--3 + +4", 7),
        ("12 / 4", 3),
        ("7 / 2", 3.5),
        ("-7 // 2", -4),
        ("-7 % 3", 2),
        ("2 ** -2", 0.25),
        ("1.5e3 + 1", 1501.0),
        ("1_000 * 3", 3000),
        ("abs(-5) + sqrt(16) + min(3, 1, 2) + max(3, 9)", 19),
        ("round(2.567, 2)", 2.57),
        ("round(7.5)", 8),
        ("10 ** 99", 10**99),
        ("123456789123456789 * 987654321987654321", 123456789123456789 * 987654321987654321),
    ],
)
def test_evaluates_arithmetic_exactly(expression, expected):
    result = evaluate(expression)
    assert result == expected
    assert type(result) is type(expected)


def test_results_format_as_exact_decimal_ints_and_float_reprs():
    assert format_number(evaluate("2 ** 70")) == "1180591620717411303424"
    assert format_number(evaluate("12 / 2")) == "6"
    assert format_number(evaluate("1.5 * 4")) == "6.0"
    assert format_number(evaluate("sqrt(2)")) == "1.4142135623730951"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("2 ** (10 ** 10)", "exponent too large: the result would have ~3.01e+09 digits"),
        ("9 ** 9 ** 9 ** 9", "exponent too large"),
        ("10 ** 10 ** 10", "exponent too large"),
        ("(-7) ** 10 ** 99", "exponent too large"),
        ("10 ** 100", f"the limit is {MAX_DIGITS} digits"),
        ("10 ** 99 * 10", "integer too large: 101 digits"),
        ("1" * 101, "integer too large"),
        ("round(5, -10 ** 9)", "round(x, ndigits)"),
        ("round(1e300)", "integer too large"),
        ("1.5 ** (10 ** 99)", "too large for a float"),
        ("10.0 ** 400", "too large for a float"),
        ("1e308 * 10", "too large for a float"),
        ("1e400", "number too large"),
        ("1 / 0", "division by zero"),
        ("5 // 0", "division by zero"),
        ("5 % 0.0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** (1 / 3)", "no real result"),
        ("sqrt(-1)", "no real result"),
    ],
)
def test_refuses_results_out_of_bounds_quickly(expression, message):
    started = time.perf_counter()
    with pytest.raises(CalculatorError, match=re.escape(message)):
        evaluate(expression)
    # A generous bound that only catches a hang (refusal takes well under a millisecond), not a benchmark.
    assert time.perf_counter() - started < 1.0


def test_refuses_inputs_over_the_size_limits():
    with pytest.raises(CalculatorError, match="too long"):
        evaluate("1" + " + 1" * MAX_LENGTH)
    with pytest.raises(CalculatorError, match=f"the limit is {MAX_NODES}"):
        evaluate("+".join(["1"] * (MAX_NODES // 2 + 1)))
    with pytest.raises(CalculatorError, match="nested too deeply"):
        evaluate("-" * MAX_DEPTH + "1")
    assert evaluate("-" * (MAX_DEPTH - 1) + "1") == (-1) ** (MAX_DEPTH - 1)
    with pytest.raises(CalculatorError, match="cannot parse"):
        evaluate("(" * 201 + "1" + ")" * 201)  # Python caps parentheses at 200


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "the function '__import__' is not supported"),
        ("open('/etc/passwd')", "the function 'open' is not supported"),
        ("x + 1", "the name 'x' is not supported"),
        ("(1).real", "attribute access is not supported"),
        ("().__class__", "attribute access is not supported"),
        ("(lambda: 1)()", "not supported"),
        ("lambda: 1", "lambda is not supported"),
        ("'abc'", "text is not supported"),
        ("f'{1}'", "text is not supported"),
        ("[1, 2][0]", "not supported"),
        ("[x for x in (1, 2)]", "not supported"),
        ("1 < 2", "comparison is not supported"),
        ("1 if 1 else 2", "not supported"),
        ("True + 1", "True is not a number"),
        ("2j", "complex numbers are not supported"),
        ("1,000 + 5", "thousands separators"),
        ("5 ^ 2", "use ** for powers"),
        ("1 << 10", "not supported"),
        ("abs(x=-1)", "positional arguments only"),
        ("max(*(1, 2))", "positional arguments only"),
        ("abs(1, 2)", "abs() takes 1 argument"),
        ("max(5)", "max() takes 2 to"),
        ("", "empty expression"),
        ("2 +", "cannot parse"),
        ("import os", "cannot parse"),
        ("1\x00", "cannot parse"),
    ],
)
def test_rejects_everything_but_arithmetic(expression, message):
    with pytest.raises(CalculatorError, match=re.escape(message)):
        evaluate(expression)


def test_calculator_error_is_an_agentboost_value_error():
    with pytest.raises(AgentBoostError):
        evaluate("1 / 0")
    with pytest.raises(ValueError):
        evaluate("1 / 0")


def _run_tool(tool_input):
    """Invoke the tool the way a Strands agent does: stream a ToolUse and take the final event."""

    async def run():
        tool_use = {"toolUseId": "call-1", "name": "calculator", "input": tool_input}
        return [event async for event in calculator.stream(tool_use, {})][-1]

    return asyncio.run(run())


def test_tool_returns_the_result_as_text():
    event = _run_tool({"expression": "(37 * 12 + 5) // 3"})
    assert event.tool_result == {"toolUseId": "call-1", "status": "success", "content": [{"text": "149"}]}
    assert event.exception is None


def test_tool_reports_a_refusal_as_an_error_result_with_the_message():
    event = _run_tool({"expression": "2 ** (10 ** 10)"})
    assert event.tool_result["status"] == "error"
    assert event.tool_result["toolUseId"] == "call-1"
    [content] = event.tool_result["content"]
    assert content["text"].startswith("Error: exponent too large: the result would have ~3.01e+09 digits")
    assert isinstance(event.exception, CalculatorError)


def test_tool_spec_tells_the_model_what_it_accepts():
    spec = calculator.tool_spec
    assert spec["name"] == "calculator"
    assert "abs, min, max, round, sqrt" in spec["description"]
    assert spec["inputSchema"]["json"]["required"] == ["expression"]
