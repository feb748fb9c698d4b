"""Ordinary programs: what a run returns, the pool's reuse of warm workers, and the one-off path."""

from __future__ import annotations

import asyncio
import os
import textwrap

import pytest
from sandbox_support import run, sandboxed

from agentboost.errors import ConfigError
from agentboost.sandbox import (
    SandboxError,
    SandboxLimits,
    SandboxPool,
    SandboxStatus,
    run_python,
    run_python_sync,
)


def test_an_ok_run_returns_stdout_and_exit_code_zero():
    result = sandboxed("print('hello')\nprint(sum(range(10)))")
    assert result.status is SandboxStatus.OK and result.ok
    assert result.exit_code == 0
    assert result.stdout == "hello\n45\n"
    assert result.stderr == ""
    assert not result.truncated
    assert result.duration_s > 0


def test_a_runtime_error_returns_the_traceback_with_source_lines_and_no_sandbox_frames():
    result = sandboxed("def divide(a, b):\n    return a / b\n\nprint('before')\ndivide(1, 0)\n")
    assert result.status is SandboxStatus.RUNTIME_ERROR
    assert result.exit_code == 1
    assert result.stdout == "before\n"  # buffered output is flushed before the traceback
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert 'File "<string>", line 5, in <module>' in result.stderr
    assert "    return a / b" in result.stderr  # the failing line is shown, as in a script
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "zygote" not in result.stderr and "agentboost" not in result.stderr
    assert result.detail == "exit code 1: ZeroDivisionError: division by zero"


def test_exit_codes_and_syntax_errors_are_reported_like_python_c():
    assert sandboxed("import sys\nsys.exit(3)").exit_code == 3
    assert sandboxed("raise SystemExit('bye')").stderr == "bye\n"
    assert sandboxed("import sys\nsys.exit(0)").status is SandboxStatus.OK
    syntax = sandboxed("def f(:\n    pass")
    assert syntax.status is SandboxStatus.RUNTIME_ERROR
    assert syntax.stderr.startswith('  File "<string>", line 1\n')
    assert "SyntaxError" in syntax.stderr and "Traceback" not in syntax.stderr


def test_stdin_is_given_to_the_program():
    code = "import sys\nnumbers = [int(x) for x in sys.stdin.read().split()]\nprint(sum(numbers))"
    assert sandboxed(code, stdin="1 2 3\n4\n").stdout == "10\n"
    big = "\n".join(str(n) for n in range(200_000)) + "\n"  # more than a pipe buffer
    assert sandboxed("import sys\nprint(len(sys.stdin.read().split()))", stdin=big).stdout == "200000\n"
    assert sandboxed("print(input()[::-1])", stdin="héllo\n").stdout == "olléh\n"


def test_a_program_that_ignores_its_stdin_still_ends():
    result = sandboxed("print('no reading')", stdin="x" * 5_000_000)
    assert result.status is SandboxStatus.OK
    assert result.stdout == "no reading\n"


def test_files_are_written_to_the_private_working_directory_which_disappears_afterwards():
    code = textwrap.dedent(
        """\
        import os
        print(open("data/input.txt").read())
        print(os.getcwd() == os.environ["HOME"] == os.environ["TMPDIR"])
        print(os.getcwd())
        """
    )
    result = sandboxed(code, files={"data/input.txt": "payload"})
    assert result.status is SandboxStatus.OK, result.stderr
    content, same, workdir = result.stdout.splitlines()
    assert content == "payload" and same == "True"
    assert not os.path.exists(workdir)


def test_the_environment_is_scrubbed():
    result = sandboxed("import os\nprint(sorted(os.environ))")
    assert result.stdout == "['HOME', 'LANG', 'PATH', 'PWD', 'PYTHONDONTWRITEBYTECODE', 'TMPDIR']\n"


def test_the_standard_library_is_importable():
    code = "import sqlite3, decimal, fractions, zlib, email.message, xml.dom.minidom\nprint('imports ok')"
    result = sandboxed(code)
    assert result.stdout == "imports ok\n", result.stderr


def test_bad_limits_and_file_names_raise_config_errors():
    for bad in ({"timeout_s": 0}, {"memory_mb": 16}, {"max_processes": 0}, {"cpu_time_s": -1}):
        with pytest.raises(ConfigError):
            SandboxLimits(**bad)
    for name in ("/etc/passwd", "../up.txt", ""):
        with pytest.raises(ConfigError):
            sandboxed("pass", files={name: "x"})
    assert SandboxLimits(timeout_s=2.5).cpu_seconds == 3


PROGRAMS = [
    ("print(6 * 7)", ""),
    ("print(input().upper())", "shout\n"),
    ("import sys\nprint('oops', file=sys.stderr)\nsys.exit(2)", ""),
    ("[1][2]", ""),
]


def test_the_pool_gives_the_same_results_as_one_off_runs():
    async def main():
        async with SandboxPool(size=2) as pool:
            pooled = [await pool.run_python(code, stdin=stdin) for code, stdin in PROGRAMS]
        single = [await run_python(code, stdin=stdin) for code, stdin in PROGRAMS]
        return pooled, single

    pooled, single = run(main())
    for a, b in zip(pooled, single, strict=True):
        assert (a.status, a.exit_code, a.stdout, a.stderr) == (b.status, b.exit_code, b.stdout, b.stderr)
    assert [result.status for result in pooled] == [
        SandboxStatus.OK,
        SandboxStatus.OK,
        SandboxStatus.RUNTIME_ERROR,
        SandboxStatus.RUNTIME_ERROR,
    ]
    assert run_python_sync("print('sync')").stdout == "sync\n"


def test_the_pool_reuses_its_workers_and_gives_every_job_a_fresh_process():
    leave_traces = textwrap.dedent(
        """\
        import builtins, os, sys
        print(hasattr(builtins, "left_behind"), os.path.exists("trace.txt"), "json" in sys.modules)
        builtins.left_behind = True
        open("trace.txt", "w").write("x")
        import json
        """
    )

    async def main():
        async with SandboxPool(size=2) as pool:
            workers = pool.worker_pids
            results = [await pool.run_python(leave_traces) for _ in range(10)]
            concurrent = await asyncio.gather(*(pool.run_python(f"print({n})") for n in range(8)))
            return workers, pool.worker_pids, pool.workers_started, results, concurrent

    workers_before, workers_after, started, results, concurrent = run(main())
    assert started == 2 and workers_before == workers_after  # no process start per job
    # json is preloaded in the workers, yet no job sees what an earlier job left behind
    assert all(result.stdout == "False False True\n" for result in results), results[0].stderr
    assert [result.stdout for result in concurrent] == [f"{n}\n" for n in range(8)]


def test_a_closed_pool_refuses_work():
    async def main():
        pool = SandboxPool(size=1)
        await pool.start()
        await pool.close()
        await pool.run_python("print(1)")

    with pytest.raises(SandboxError, match="closed"):
        run(main())


def test_a_pool_used_from_another_event_loop_says_so():
    pool = SandboxPool(size=1)

    async def use():
        return await pool.run_python("print(1)")

    try:
        assert run(use()).stdout == "1\n"
        with pytest.raises(SandboxError, match="belongs to the event loop it started in"):
            run(use())
    finally:
        run(pool.close())  # closing works from any loop
