"""A Strands tool that runs model-written Python in the sandbox, for coding environments."""

from __future__ import annotations

from typing import Any

from strands import tool

from agentboost.sandbox.limits import SandboxLimits, SandboxResult, printable
from agentboost.sandbox.pool import SandboxPool, run_python


def make_code_tool(
    sandbox: SandboxPool | SandboxLimits | None = None,
    *,
    name: str = "run_python",
    description: str | None = None,
    max_report_chars: int = 4000,
) -> Any:
    """A Strands tool ``name(code: str, stdin: str = "") -> str`` returning :func:`format_report` text.

    Args:
        sandbox: A :class:`SandboxPool` to run on (fast; the pool must live in the agent's event loop),
            or limits for a one-off sandbox per call (a worker start each time), or None for defaults.
        name: The tool name the model sees.
        description: What the model is told; by default, the limits it runs under.
        max_report_chars: Longest report returned; long outputs keep their beginning and end.
    """
    pool = sandbox if isinstance(sandbox, SandboxPool) else None
    limits = sandbox.limits if isinstance(sandbox, SandboxPool) else (sandbox or SandboxLimits())
    if description is None:
        network = "with network access" if limits.network else "without network access"
        description = (
            f"Run a Python 3 program in a fresh sandbox ({network}, {limits.timeout_s:g} s time limit, "
            f"{limits.memory_mb} MiB memory) and return its status, exit code, stdout and stderr. Print "
            "what you want to see. Files the program writes are discarded after the run."
        )

    @tool(name=name, description=description)
    async def run_code(code: str, stdin: str = "") -> str:
        """Run a Python program.

        Args:
            code: The complete Python program to run.
            stdin: Text given to the program on standard input.
        """
        if pool is not None:
            result = await pool.run_python(code, stdin=stdin)
        else:
            result = await run_python(code, stdin=stdin, limits=limits)
        return format_report(result, max_report_chars)

    return run_code


def format_report(result: SandboxResult, max_chars: int = 4000) -> str:
    """A compact text report of a run: status line, then stdout and stderr (each shortened to fit), with
    control sequences escaped so that the program's output cannot drive the terminal it is shown on."""
    status = f"status: {result.status.value}"
    if result.exit_code is not None:
        status += f", exit code {result.exit_code}"
    status += f", {result.duration_s:.2f} s"
    if result.detail and not result.ok:
        status += f"\n{printable(result.detail)}"
    stdout, stderr = printable(result.stdout), printable(result.stderr)
    budget = max(200, max_chars - len(status))
    stdout_budget = budget // 2 if stderr else budget
    sections = [status, "stdout:\n" + _shorten(stdout, stdout_budget) if stdout else "stdout: (empty)"]
    if stderr:
        sections.append("stderr:\n" + _shorten(stderr, budget - stdout_budget))
    return "\n".join(sections)


def _shorten(text: str, limit: int) -> str:
    """Keep the beginning and the end (tracebacks end with the error) of text longer than ``limit``."""
    text = text.rstrip("\n")
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - head - tail} characters omitted] ...\n{text[-tail:]}"
