"""Running untrusted, model-written code: limits, isolation, a warm pool, test harnesses, a Strands tool.

    from agentboost.sandbox import SandboxPool

    async with SandboxPool(size=4) as pool:
        result = await pool.run_python("print(input()[::-1])", stdin="abc")
    result.status, result.stdout  # (SandboxStatus.OK, "cba\\n")

What a run is protected by on this machine: ``print(sandbox_capabilities().summary())``.
"""

from typing import Any

from agentboost.sandbox.limits import (
    SandboxCapabilities,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    SandboxStatus,
)
from agentboost.sandbox.pool import SandboxPool, run_python, run_python_sync, sandbox_capabilities
from agentboost.sandbox.testcases import (
    TestReport,
    TestResult,
    TestStatus,
    outputs_match,
    run_function_tests,
    run_humaneval_test,
    run_stdio_tests,
)

__all__ = [
    "SandboxCapabilities",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "SandboxResult",
    "SandboxStatus",
    "TestReport",
    "TestResult",
    "TestStatus",
    "format_report",
    "make_code_tool",
    "outputs_match",
    "run_function_tests",
    "run_humaneval_test",
    "run_python",
    "run_python_sync",
    "run_stdio_tests",
    "sandbox_capabilities",
]


def __getattr__(name: str) -> Any:
    # The Strands tool is imported on first use: the sandbox itself does not need the SDK.
    if name in ("make_code_tool", "format_report"):
        from agentboost.sandbox import tool

        return getattr(tool, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
